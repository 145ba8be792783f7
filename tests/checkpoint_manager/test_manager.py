"""CheckpointManager: decisions, async saves, retention, naming, cleanup, restore, errors."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import JsonItem, restore
from ocdbt_py.checkpoint.manager import (
    BestN,
    CheckpointManager,
    Continuous,
    CustomSteps,
    FixedInterval,
    KeepAnyOf,
    LatestN,
    SaveEveryNSeconds,
    StepAlreadyExistsError,
    StepNameFormat,
)
from ocdbt_py.checkpoint.manager import manager as manager_mod
from ocdbt_py.errors import NotFoundError, ReadOnlyError, StorageError
from ocdbt_py.kvstore.memory import MemoryStore


def tree(step: int) -> dict[str, Any]:
    return {"w": np.full((8, 4), step, np.float32), "b": np.arange(5, dtype=np.int64) + step}


def items(step: int) -> dict[str, Any]:
    return {"params": tree(step), "config": JsonItem({"step": step})}


class GatedStore(MemoryStore):
    """A store whose writes of ``_CHECKPOINT_METADATA`` wait for ``gate`` (so a save stays in
    flight until the test releases it), or fail when ``fail`` is set.  (A memory store: local
    saves write into a temporary directory of their own.)"""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # a write is held at the gate
        self.fail = False

    def _check(self, key: str) -> None:
        if key.endswith("_CHECKPOINT_METADATA"):
            if not self.gate.is_set():
                self.waiting.set()
            assert self.gate.wait(30), "test gate never opened"
            if self.fail:
                raise StorageError(f"injected failure writing {key}")

    def set(self, key: str, value: Any) -> None:
        self._check(key)
        super().set(key, value)

    def set_parts(self, key: str, parts: Sequence[Any]) -> None:
        self._check(key)
        super().set_parts(key, parts)


def test_saves_by_policy_and_restores(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, save_policy=FixedInterval(3)) as mgr:
        saved = [s for s in range(10) if mgr.save(s, items(s), metrics={"loss": 10 - s})]
        mgr.wait_until_finished()
        assert saved == [0, 3, 6, 9]
        assert mgr.all_steps() == [0, 3, 6, 9] and mgr.latest_step() == 9
        assert sorted(os.listdir(tmp_path)) == ["0", "3", "6", "9"]
        out = mgr.restore()
        assert set(out) == {"params", "config", "metrics"}
        np.testing.assert_array_equal(out["params"]["w"], tree(9)["w"])
        assert out["config"] == {"step": 9} and out["metrics"] == {"loss": 1}
        assert mgr.restore(3, "config") == {"step": 3}
        part = mgr.restore(6, ["params"])
        assert list(part) == ["params"]
        np.testing.assert_array_equal(part["params"]["b"], tree(6)["b"])
        assert mgr.metrics(6) == {"loss": 4}
        md = mgr.item_metadata(6, "params")
        assert md["w"].shape == (8, 4)
    # the same steps through the plain restore API
    np.testing.assert_array_equal(restore(tmp_path, item="params")["w"], tree(9)["w"])


def test_step_rules(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, async_save=False)
    assert mgr.save(5, items(5))
    with pytest.raises(StepAlreadyExistsError):
        mgr.save(5, items(5))
    assert not mgr.save(4, items(4))  # older than the latest: the policy is not asked
    assert mgr.save(4, items(4), force=True)
    assert mgr.all_steps() == [4, 5]
    for bad in (-1, 1.5, True, "7"):
        with pytest.raises(ValueError):
            mgr.save(bad, items(0))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mgr.save(6, {})
    with pytest.raises(ValueError):
        mgr.save(6, {"metrics": tree(6)}, metrics={"loss": 1.0})
    mgr.close()
    with pytest.raises(ValueError):
        mgr.save(7, items(7))
    mgr.close()  # idempotent


def test_async_save_is_invisible_until_committed() -> None:
    kv = GatedStore()
    mgr = CheckpointManager(kv, save_policy=Continuous())
    assert mgr.save(0, items(0))
    mgr.wait_until_finished()
    kv.gate.clear()
    assert mgr.save(1, items(1))
    assert mgr.is_saving_in_progress()
    assert not mgr.save(2, items(2))  # Continuous: never two in flight
    assert mgr.all_steps() == [0]
    assert CheckpointManager(kv, read_only=True).all_steps() == [0]
    assert kv.waiting.wait(30)  # the save reached its commit
    assert any(k.startswith("1/") for k in kv.list())  # written in place, not yet committed
    kv.gate.set()
    mgr.wait_until_finished()
    assert not mgr.is_saving_in_progress()
    assert mgr.all_steps() == [0, 1]
    assert mgr.save(3, items(3))
    mgr.close()
    assert CheckpointManager(kv, read_only=True).all_steps() == [0, 1, 3]


def test_background_failure_surfaces_and_leaves_no_step() -> None:
    kv = GatedStore()
    mgr = CheckpointManager(kv)
    kv.fail = True
    assert mgr.save(0, items(0))
    with pytest.raises(StorageError, match="injected"):
        mgr.wait_until_finished()
    mgr.check_for_errors()  # reported once
    assert mgr.all_steps() == []
    kv.fail = False
    assert mgr.save(0, items(0))  # the failed step can be saved again
    mgr.wait_until_finished()
    assert mgr.all_steps() == [0]
    kv.gate.clear()
    kv.fail = True
    assert mgr.save(1, items(1))
    kv.gate.set()
    deadline = time.monotonic() + 30
    while mgr.is_saving_in_progress() and time.monotonic() < deadline:
        time.sleep(0.01)
    kv.fail = False
    with pytest.raises(StorageError, match="injected"):  # the next save reports it
        mgr.save(2, items(2))
    mgr.close()
    assert CheckpointManager(kv).all_steps() == [0]


def test_latest_n_retention_deletes_in_background(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, preservation=LatestN(2)) as mgr:
        for s in range(6):
            mgr.save(s, items(s))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [4, 5]
    assert sorted(os.listdir(tmp_path)) == ["4", "5"]


def test_newest_step_is_never_deleted(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, preservation=CustomSteps([]), async_save=False) as mgr:
        for s in range(3):
            mgr.save(s, items(s))
        assert mgr.all_steps() == [2]
    with CheckpointManager(tmp_path, preservation=LatestN(0)) as mgr:
        mgr.save(3, items(3))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [3]


def test_best_n_survives_reopening(tmp_path: Path) -> None:
    losses = [5.0, 1.0, 4.0, 0.5, 3.0, 2.0]
    keep = KeepAnyOf(BestN(2, "loss"), LatestN(1))
    with CheckpointManager(tmp_path, preservation=keep) as mgr:
        for s, loss in enumerate(losses[:4]):
            mgr.save(s, items(s), metrics={"loss": np.float32(loss)})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1, 3]
        assert mgr.best_step() == 3
    with CheckpointManager(tmp_path, preservation=keep) as mgr:  # metrics are read back from disk
        assert mgr.metrics(1) == {"loss": 1.0}
        for s in (4, 5):
            mgr.save(s, items(s), metrics={"loss": losses[s]})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1, 3, 5]
        assert mgr.best_step() == 3
        assert mgr.best_step("loss", "max") == 5


def test_best_step_without_metric_is_latest(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        assert mgr.best_step() is None
        mgr.save(1, items(1))
        mgr.save(2, items(2))
        assert mgr.best_step() == 2


def test_every_n_seconds_uses_the_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(manager_mod.time, "time", lambda: now[0])
    with CheckpointManager(tmp_path, save_policy=SaveEveryNSeconds(60), async_save=False) as mgr:
        decisions = []
        for s in range(8):
            decisions.append(mgr.save(s, items(s)))
            now[0] += 25
        assert decisions == [True, False, False, True, False, False, True, False]


def test_step_name_format_and_foreign_dirs(tmp_path: Path) -> None:
    (tmp_path / "other_000003").mkdir()
    (tmp_path / "notes").mkdir()
    fmt = StepNameFormat("ckpt", 6)
    with CheckpointManager(tmp_path, step_name_format=fmt, async_save=False) as mgr:
        mgr.save(7, items(7))
        mgr.save(1234567, items(8))
        assert mgr.all_steps() == [7, 1234567]
        assert mgr.step_path(7).endswith("/ckpt_000007")
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000007", "ckpt_1234567", "notes", "other_000003"]
    with CheckpointManager(tmp_path, step_prefix="other", step_format_fixed_length=6) as mgr:
        assert mgr.all_steps() == []  # the empty other_000003 is not a finished step
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, step_name_format=fmt, step_prefix="x")


def test_cleanup_on_open_removes_only_our_leftovers(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(1, items(1))
    (tmp_path / "2.orbax-checkpoint-tmp" / "params").mkdir(parents=True)
    (tmp_path / "1.orbax-checkpoint-tmp-deleting-0123abcd").mkdir()
    (tmp_path / "ckpt_2.orbax-checkpoint-tmp").mkdir()  # another manager's (prefix ckpt)
    CheckpointManager(tmp_path, read_only=True).close()
    assert len(os.listdir(tmp_path)) == 4  # read-only managers never clean
    CheckpointManager(tmp_path).close()
    assert sorted(os.listdir(tmp_path)) == ["1", "ckpt_2.orbax-checkpoint-tmp"]


def test_memory_store_unmarked_step_is_unfinished_and_cleaned() -> None:
    kv = MemoryStore()
    with CheckpointManager(kv, async_save=False) as mgr:
        mgr.save(1, items(1))
    kv.set("2/_CHECKPOINT_METADATA", b"{}")
    kv.set("2/params/_METADATA", b"{}")  # a save that never wrote its commit marker
    ro = CheckpointManager(kv, read_only=True)
    assert ro.all_steps() == [1]
    assert kv.exists("2/params/_METADATA")
    with CheckpointManager(kv) as mgr:
        assert mgr.all_steps() == [1]
        assert not any(k.startswith("2/") for k in kv.list())
        mgr.save(2, items(2))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1, 2]
        mgr.delete(1)
        assert mgr.all_steps() == [2]
        assert not any(k.startswith("1/") for k in kv.list())


def test_read_only_and_missing_steps(tmp_path: Path) -> None:
    ro = CheckpointManager(tmp_path, read_only=True)
    assert not ro.should_save(0)
    with pytest.raises(ReadOnlyError):
        ro.save(0, items(0))
    with pytest.raises(NotFoundError):
        ro.restore()
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(0, items(0))
        with pytest.raises(NotFoundError):
            mgr.restore(3)
        with pytest.raises(NotFoundError):
            mgr.delete(3)
        with pytest.raises(NotFoundError):
            mgr.metrics(3)
    ro.reload()
    assert ro.all_steps() == [0]


def test_restore_default_item_and_targets(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(0, {"default": tree(0)})
        out = mgr.restore()
        assert set(out) == {"w", "b"}  # the single default item is returned bare, as Orbax does
        sub = mgr.restore(0, "default", {"w": np.zeros((8, 4), np.float64)})
        assert sub["w"].dtype == np.float64 and set(sub) == {"w"}
        lazy = mgr.restore(0, "default", lazy=True)
        np.testing.assert_array_equal(np.asarray(lazy["b"]), tree(0)["b"])
        with pytest.raises(ValueError):
            mgr.restore(0, ["default"], target=[1])


def test_bad_arguments() -> None:
    kv = MemoryStore()
    with pytest.raises(TypeError):
        CheckpointManager(kv, save_policy=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CheckpointManager(kv, preservation=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CheckpointManager(kv, save_options={"blocking": False})
    with pytest.raises(TypeError):
        CheckpointManager(kv).save(0, items(0), metrics=[1])  # type: ignore[arg-type]


def test_save_options_pass_through(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, save_options={"use_zarr3": True, "sync": False}, async_save=False) as mgr:
        mgr.save(0, {"default": tree(0)})
    assert (tmp_path / "0" / "default" / "_METADATA").exists()
    import ocdbt_py

    with ocdbt_py.open(str(tmp_path / "0" / "default")) as db:
        keys = list(db.list())
    assert any(k.endswith(b"zarr.json") for k in keys) and not any(k.endswith(b".zarray") for k in keys)


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="per-thread nice is Linux's")
@pytest.mark.parametrize("async_save", [True, False])
def test_background_retention_runs_at_lower_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     async_save: bool) -> None:
    """Deleting old local steps after an async save's commit yields the cores to the training
    loop (it overlaps the next save's host copy); a synchronous manager's does not."""
    from ocdbt_py.checkpoint.manager import tier as tier_mod
    from ocdbt_py.checkpoint.saving.api import BACKGROUND_NICE

    monkeypatch.delenv("OCDBT_PY_SAVE_NICE", raising=False)

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base = nice()
    seen: list[int] = []
    orig = tier_mod.delete_step

    def spy(kv: Any, name: str, **kw: Any) -> None:
        seen.append(nice() - base)
        orig(kv, name, **kw)

    monkeypatch.setattr(tier_mod, "delete_step", spy)
    mgr = CheckpointManager(tmp_path / "r", save_policy=FixedInterval(1), preservation=LatestN(1),
                            async_save=async_save)
    for s in range(3):
        mgr.save(s, {"state": tree(s)})
        mgr.wait_until_finished()
    mgr.close()
    assert seen and set(seen) == {min(19 - base, BACKGROUND_NICE) if async_save else 0}
    assert nice() == base
    assert sorted(os.listdir(tmp_path / "r")) == ["2"]
