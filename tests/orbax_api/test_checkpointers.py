"""Checkpointers as Orbax runs them, each test run on ``orbax.checkpoint`` (the oracle, when
installed) and on ``ocdbt_py.orbax`` alike: the temporary path, custom handlers'
``async_save`` futures, ``timeout_secs``, interrupted saves, the legacy handler protocol, a
custom item saving a built-in one (a save nested in another's work, which must finish instead
of hanging), and restore targets' placeholders and empty nodes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
import time
from typing import Any, NamedTuple
from unittest import mock

import numpy as np
import pytest

import ocdbt_py.orbax

TMP = ".orbax-checkpoint-tmp"
TREE = {"a": np.arange(8, dtype=np.int32), "c": {"a": np.ones((2, 3), np.float32), "e": np.arange(4.0)}}
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
_classes: dict[str, tuple[Any, Any, Any]] = {}


@pytest.fixture(params=["ocdbt_py", pytest.param("orbax", marks=pytest.mark.orbax)])
def ocp(request: pytest.FixtureRequest) -> Any:
    return ocdbt_py.orbax if request.param == "ocdbt_py" else pytest.importorskip("orbax.checkpoint")


def wrapping(ocp: Any) -> tuple[Any, Any, Any]:
    """``(handler class, save args, restore args)``: a custom handler around the built-in PyTree
    handler adding a future that sleeps (as Orbax's own tests do), registered with ``ocp``."""
    if ocp.__name__ in _classes:
        return _classes[ocp.__name__]

    class WrappingHandler(ocp.AsyncCheckpointHandler):  # type: ignore[name-defined,misc]
        def __init__(self, sleep: float = 0.3, gate: threading.Event | None = None):
            self.inner = ocp.PyTreeCheckpointHandler()
            self.sleep = sleep
            self.gate = gate  # when given, the extra future ends only once the test opens it
            self.finalized: list[Any] = []

        def save(self, directory: Any, args: Any) -> None:
            self.inner.save(directory, args=args)

        async def async_save(self, directory: Any, args: Any) -> list[Any]:
            futures = await self.inner.async_save(directory, args=args)
            extra = _pool.submit(self.gate.wait, 60) if self.gate else _pool.submit(time.sleep, self.sleep)
            return [*futures, extra]

        def restore(self, directory: Any, args: Any = None) -> Any:
            return self.inner.restore(directory, args=args)

        def finalize(self, directory: Any) -> None:
            self.inner.finalize(directory)
            self.finalized.append(directory)

    @ocp.args.register_with_handler(WrappingHandler, for_save=True)
    @dataclasses.dataclass
    class WrapSave(ocp.args.PyTreeSave):  # type: ignore[name-defined,misc]
        pass

    @ocp.args.register_with_handler(WrappingHandler, for_restore=True)
    @dataclasses.dataclass
    class WrapRestore(ocp.args.PyTreeRestore):  # type: ignore[name-defined,misc]
        pass

    _classes[ocp.__name__] = (WrappingHandler, WrapSave, WrapRestore)
    return _classes[ocp.__name__]


def _same(a: Any, b: Any) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _same(a[k], b[k])
        else:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["Checkpointer", "AsyncCheckpointer"])
def test_custom_handler_saving_a_builtin_item_finishes(ocp: Any, tmp_path, kind: str) -> None:
    handler_cls, _, _ = wrapping(ocp)
    gate = threading.Event()
    handler = handler_cls(gate=gate)
    if kind == "Checkpointer":
        gate.set()  # a blocking save waits for every future
    with getattr(ocp, kind)(handler) as ckptr:
        ckptr.save(tmp_path / "ckpt", TREE)  # legacy form: the registered WrapSave
        if kind == "AsyncCheckpointer":
            assert not (tmp_path / "ckpt").exists()  # the handler's future is still open
            # Orbax makes the temporary directory in the background too: it appears, and the
            # checkpoint stays unfinished while the gate is shut
            deadline = time.monotonic() + 30
            while not (tmp_path / ("ckpt" + TMP)).is_dir() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert (tmp_path / ("ckpt" + TMP)).is_dir() and not (tmp_path / "ckpt").exists()
            gate.set()
            ckptr.wait_until_finished()
        _same(TREE, ckptr.restore(tmp_path / "ckpt"))
    assert handler.finalized and TMP in str(handler.finalized[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    meta = json.loads((tmp_path / "ckpt" / "_CHECKPOINT_METADATA").read_text())
    assert meta["item_handlers"] == handler.typestr()
    assert meta["commit_timestamp_nsecs"] >= meta["init_timestamp_nsecs"] > 0


def test_builtin_async_save_returns_futures(ocp: Any, tmp_path) -> None:
    h = ocp.PyTreeCheckpointHandler()
    (tmp_path / "item").mkdir()
    futures = asyncio.run(h.async_save(tmp_path / "item", args=ocp.args.PyTreeSave(TREE)))
    for f in futures:
        f.result(timeout=60)
    h.finalize(tmp_path / "item")
    _same(TREE, h.restore(tmp_path / "item"))


@pytest.mark.timeout(120)
def test_timeout_secs_bounds_the_background_wait(ocp: Any, tmp_path) -> None:
    handler_cls, save_cls, _ = wrapping(ocp)
    gate = threading.Event()  # opened only after the timeout: the future would take 60 s
    ckptr = ocp.AsyncCheckpointer(handler_cls(gate=gate), timeout_secs=1)
    start = time.time()
    ckptr.save(tmp_path / "ckpt", args=save_cls(TREE))
    try:
        with pytest.raises(TimeoutError, match=r"ChainedFuture completed \d+/\d+ futures but timed out after"):
            ckptr.wait_until_finished()
        assert time.time() - start < 30  # the 1 s timeout, not the 60 s future
        assert not (tmp_path / "ckpt").exists()  # never finalized
    finally:
        gate.set()
    with pytest.raises(ValueError, match="must be positive"):
        ocp.AsyncCheckpointer(handler_cls(), timeout_secs=-1)


def test_interrupted_save_is_an_incomplete_checkpoint(ocp: Any, tmp_path) -> None:
    with (mock.patch.object(ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize"),
          ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr):
        ckptr.save(tmp_path / "ckpt", TREE)
    (tmp,) = list(tmp_path.iterdir())
    assert tmp.name.startswith("ckpt" + TMP)
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        with pytest.raises(ValueError, match="Found incomplete checkpoint"):
            ckptr.restore(tmp)
        with pytest.raises(FileNotFoundError):
            ckptr.restore(tmp_path / "missing")


def test_commit_file_temporary_path_and_force(ocp: Any, tmp_path) -> None:
    cls = ocp.path.atomicity.CommitFileTemporaryPath
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(), temporary_path_class=cls) as ckptr:
        ckptr.save(tmp_path / "ckpt", TREE)
        assert (tmp_path / "ckpt" / "commit_success.txt").exists()
        with pytest.raises(ValueError, match="already exists"):
            ckptr.save(tmp_path / "ckpt", TREE)
    doubled = {"a": TREE["a"] * 2, "c": {"a": TREE["c"]["a"] * 2, "e": TREE["c"]["e"] * 2}}
    for c in (ocp.Checkpointer, ocp.AsyncCheckpointer):
        with c(ocp.PyTreeCheckpointHandler()) as ckptr:
            ckptr.save(tmp_path / "ckpt", doubled, force=True)
            if c is ocp.AsyncCheckpointer:  # Orbax's Checkpointer has no wait_until_finished
                ckptr.wait_until_finished()
            _same(doubled, ckptr.restore(tmp_path / "ckpt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_legacy_handler_protocol(ocp: Any, tmp_path) -> None:
    class Legacy(ocp.CheckpointHandler):  # type: ignore[name-defined,misc]  # no registered argument classes
        def save(self, directory: Any, item: Any, extra: Any) -> None:
            (directory / "item.json").write_text(json.dumps([item, extra]))

        def restore(self, directory: Any, item: Any = None, extra: Any = None) -> Any:
            return json.loads((directory / "item.json").read_text()), item, extra

    with ocp.Checkpointer(Legacy()) as ckptr:
        ckptr.save(tmp_path / "ckpt", {"x": 1}, "more")
        assert ckptr.restore(tmp_path / "ckpt", item=3, extra=4) == ([{"x": 1}, "more"], 3, 4)


def test_placeholder_over_a_subtree_is_a_mismatch(ocp: Any, tmp_path) -> None:
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "ckpt", TREE)
        target = {"a": np.zeros(8, np.int32), "c": {"a": ocp.PLACEHOLDER, "e": np.zeros(4)}}
        got = ckptr.restore(tmp_path / "ckpt", args=ocp.args.PyTreeRestore(target))
        assert got["c"]["a"] is ocp.PLACEHOLDER
        with pytest.raises(ValueError, match="User-provided restore item and on-disk value"):
            ckptr.restore(tmp_path / "ckpt", args=ocp.args.PyTreeRestore({"a": np.zeros(8), "c": ocp.PLACEHOLDER}))
        with pytest.raises(ValueError, match="User-provided restore item and on-disk value"):
            ckptr.restore(tmp_path / "ckpt", args=ocp.args.PyTreeRestore({"a": np.zeros(8)}))


@pytest.mark.timeout(120)
def test_custom_item_saving_a_builtin_item_inside_a_composite_save_finishes(ocp: Any, tmp_path) -> None:
    # the custom item's save runs inside the composite save's work and saves a built-in item:
    # a save nested in another's, which must neither wait for it nor replace it as the last save
    _, save_cls, restore_cls = wrapping(ocp)
    mngr = ocp.CheckpointManager(tmp_path / "r")
    mngr.save(0, args=ocp.args.Composite(custom=save_cls(TREE), other=ocp.args.StandardSave({"x": np.arange(3)})))
    mngr.wait_until_finished()
    got = mngr.restore(0, args=ocp.args.Composite(custom=restore_cls()))
    mngr.close()
    _same(TREE, got.custom)


class Empty(NamedTuple):
    """A node without leaves, as optax's ``EmptyState``."""


def test_empty_nodes_of_the_restore_item_are_kept(ocp: Any, tmp_path) -> None:
    tree = {"a": np.arange(3), "opt": (np.zeros(2), Empty(), Empty())}
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "ckpt", tree)
        got = ckptr.restore(tmp_path / "ckpt", item=tree)
    assert type(got["opt"][1]) is Empty and type(got["opt"][2]) is Empty  # the item's node
    np.testing.assert_array_equal(got["a"], tree["a"])


def test_step_statistics_compare_with_orbax_records() -> None:
    theirs = pytest.importorskip("orbax.checkpoint._src.logging.step_statistics")
    ours = ocdbt_py.orbax.logging.step_statistics
    assert ours.SaveStepStatistics() == theirs.SaveStepStatistics()
    assert theirs.SaveStepStatistics() == ours.SaveStepStatistics()
    assert ours.SaveStepStatistics(step=3) != theirs.SaveStepStatistics()
    assert ours.RestoreStepStatistics() != theirs.SaveStepStatistics()
    assert ours.SaveStepStatistics(step=1) == ours.SaveStepStatistics(step=1)


def test_custom_handler_metadata_is_its_own(ocp: Any, tmp_path) -> None:
    handler_cls, save_cls, restore_cls = wrapping(ocp)

    class WithMetadata(ocp.CheckpointHandler):  # type: ignore[name-defined,misc]
        def save(self, directory: Any, args: Any) -> None:
            (directory / "n.json").write_text(json.dumps(args.n))

        def restore(self, directory: Any, args: Any = None) -> Any:
            return json.loads((directory / "n.json").read_text())

        def metadata(self, directory: Any) -> Any:
            return tuple(sorted(p.name for p in directory.iterdir()))

    @ocp.args.register_with_handler(WithMetadata, for_save=True, for_restore=True)
    @dataclasses.dataclass
    class N(ocp.args.CheckpointArgs):  # type: ignore[name-defined,misc]
        n: int = 0

    for handler, a, expected in ((handler_cls(), save_cls(TREE), None),
                                 (WithMetadata(), N(3), ("_CHECKPOINT_METADATA", "commit_success.txt", "n.json"))):
        with ocp.Checkpointer(handler) as ckptr:
            path = tmp_path / type(handler).__name__
            ckptr.save(path, args=a, custom_metadata={"u": 1})
            meta = ckptr.metadata(path)
        assert meta.item_metadata == expected  # without its own metadata(): None, as Orbax
        assert meta.custom_metadata == {"u": 1} and meta.item_handlers == handler.typestr()


def test_a_save_nested_in_another_save_runs_inside_it(tmp_path) -> None:
    """The native rule behind the nested custom items above: a save started inside another
    save's work neither waits for it nor outlives it, even when asked not to block."""
    from ocdbt_py.checkpoint import save
    from ocdbt_py.checkpoint.saving import async_save

    inner: list[Any] = []

    def work() -> None:
        inner.append(save(tmp_path / "inner", TREE, blocking=False))
        assert inner[0].done()  # ran to its end inside the outer save's work

    outer = async_save.start(str(tmp_path / "outer"), work, blocking=False, started=time.perf_counter())
    outer.wait(timeout=60)
    assert inner and inner[0].done() and inner[0].exception() is None
    save(tmp_path / "after", TREE)  # the outer save, not the nested one, was the previous save
    _same(TREE, ocdbt_py.checkpoint.restore(tmp_path / "inner"))
