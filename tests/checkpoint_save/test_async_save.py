"""``save(..., blocking=False)``: handles, host copies, errors and ordering of saves."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import restore, save
from ocdbt_py.checkpoint.saving import CheckpointExistsError, SaveHandle
from ocdbt_py.checkpoint.saving import process_writer as pw
from ocdbt_py.checkpoint.saving.api import BACKGROUND_NICE
from ocdbt_py.errors import StorageError
from ocdbt_py.kvstore import MemoryStore
from ocdbt_py.pools import lower_thread_priority
from ocdbt_py.testing.faults import FaultyStore, InjectedFault


@pytest.fixture
def slow_chunks(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Chunk encoding blocks until the returned event is set (so a save stays in flight)."""
    gate = threading.Event()

    def gated(orig: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            assert gate.wait(30), "test gate never opened"
            return orig(*a, **k)

        return run

    monkeypatch.setattr(pw, "encode_chunk", gated(pw.encode_chunk))
    monkeypatch.setattr(pw, "encode_small", gated(pw.encode_small))
    monkeypatch.setattr(pw, "encode_small_batch", gated(pw.encode_small_batch))
    return gate


def test_async_returns_before_writing_and_copies_inputs(tmp_path: Path, slow_chunks: threading.Event) -> None:
    a = np.arange(1000, dtype=np.float32)
    h = save(tmp_path / "c", {"a": a}, blocking=False)
    assert isinstance(h, SaveHandle) and not h.done()
    assert not (tmp_path / "c").exists()  # only the temporary directory so far
    a[:] = -1  # the caller may reuse its buffers at once
    slow_chunks.set()
    h.wait(timeout=30)
    assert h.done() and h.exception() is None
    assert np.array_equal(restore(tmp_path / "c")["a"], np.arange(1000, dtype=np.float32))
    assert h.total_seconds is not None and h.blocking_seconds <= h.total_seconds


def test_second_save_waits_for_the_first(tmp_path: Path, slow_chunks: threading.Event) -> None:
    h1 = save(tmp_path / "1", {"a": np.ones(10)}, blocking=False)
    started = threading.Event()
    result: dict[str, Any] = {}

    def second() -> None:
        started.set()
        result["h"] = save(tmp_path / "2", {"a": np.zeros(10)}, blocking=False)

    t = threading.Thread(target=second)
    t.start()
    assert started.wait(5)
    time.sleep(0.3)
    assert "h" not in result  # still waiting for the first save
    slow_chunks.set()
    t.join(30)
    h1.wait()
    result["h"].wait()
    assert np.array_equal(restore(tmp_path / "1")["a"], np.ones(10))
    assert np.array_equal(restore(tmp_path / "2")["a"], np.zeros(10))


def test_background_error_is_reraised_by_wait() -> None:
    store = FaultyStore(MemoryStore(), fail_at=3, ops={"set"})
    h = save(store, {"a": np.ones(3), "b": np.ones(2000)}, blocking=False)
    with pytest.raises(StorageError):
        h.wait(timeout=30)
    assert isinstance(h.exception(), InjectedFault)
    assert not store.base.exists("commit_success.txt")
    h2 = save(MemoryStore(), {"a": 1})  # the error was collected: the next save proceeds
    assert h2.done()


def test_uncollected_error_surfaces_on_next_save() -> None:
    store = FaultyStore(MemoryStore(), fail_at=2, ops={"set"})
    h = save(store, {"a": np.ones(3)}, blocking=False)
    while not h.done():
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="previous save"):
        save(MemoryStore(), {"a": 1})
    save(MemoryStore(), {"a": 1})  # reported once


def test_blocking_errors_raise_directly(tmp_path: Path) -> None:
    save(tmp_path / "c", {"a": 1})
    with pytest.raises(CheckpointExistsError):
        save(tmp_path / "c", {"a": 2})
    h = save(tmp_path / "d", {"a": 1}, blocking=False)
    h.wait()
    h2 = save(tmp_path / "d", {"a": 2}, blocking=False)
    with pytest.raises(CheckpointExistsError):
        h2.wait()


def test_wait_timeout(tmp_path: Path, slow_chunks: threading.Event) -> None:
    h = save(tmp_path / "c", {"a": np.ones(4)}, blocking=False)
    with pytest.raises(TimeoutError):
        h.wait(timeout=0.05)
    slow_chunks.set()
    h.wait(timeout=30)
    assert "done" in repr(h)


def test_copy_buffer_is_reused_between_async_saves(tmp_path: Path) -> None:
    from ocdbt_py.checkpoint.saving import host_copy

    a = {"x": np.arange(3_000_000, dtype=np.float32), "y": np.ones((50, 60))}
    b = {"x": np.arange(3_000_000, dtype=np.float32)[::-1].copy(), "y": np.zeros((50, 60))}
    save(tmp_path / "a", a, blocking=False).wait()
    kept = host_copy._cached
    assert kept is not None and kept.nbytes >= a["x"].nbytes + a["y"].nbytes
    h = save(tmp_path / "b", b, blocking=False)
    b["x"][:] = -1  # the caller's buffers are free again at once
    h.wait()
    assert host_copy._cached is kept  # the same mapping served the second save
    for name, want in (("a", a), ("b", {"x": np.arange(3_000_000, dtype=np.float32)[::-1], "y": np.zeros((50, 60))})):
        got = restore(tmp_path / name)
        assert np.array_equal(got["x"], want["x"]) and np.array_equal(got["y"], want["y"])
    save(tmp_path / "c", {"z": np.ones(10)}, blocking=False, keep_copy_buffer=False).wait()
    host_copy.release_cached_arena()
    assert host_copy._cached is None


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
@pytest.mark.parametrize("env, blocking, expect", [(None, False, BACKGROUND_NICE), ("0", False, 0), ("3", False, 3),
                                                    (None, True, 0)])
def test_background_encoders_run_at_lower_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   env: str | None, blocking: bool, expect: int) -> None:
    """A background save's encoder threads yield the cores to the training loop (nice
    ``BACKGROUND_NICE``, ``OCDBT_PY_SAVE_NICE`` overrides); a blocking save's do not; the
    caller's own priority never changes."""
    if env is None:
        monkeypatch.delenv("OCDBT_PY_SAVE_NICE", raising=False)
    else:
        monkeypatch.setenv("OCDBT_PY_SAVE_NICE", env)
    base = _own_nice()
    seen = _record_encoder_nice(monkeypatch, base)
    tree = {f"a{i}": np.full((300, 1024), i, dtype=np.float32) for i in range(4)}  # > one-shot size
    h = save(tmp_path / "c", tree, blocking=blocking, workers=2)
    h.wait(timeout=60)
    assert seen and set(seen) == {min(19 - base, expect)}
    assert _own_nice() == base
    assert np.array_equal(restore(tmp_path / "c")["a3"], tree["a3"])


def _record_encoder_nice(monkeypatch: pytest.MonkeyPatch, base: int) -> list[int]:
    """Each chunk encode appends its thread's nice value relative to ``base``."""
    seen: list[int] = []
    orig = pw.encode_chunk

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(_own_nice() - base)
        return orig(*a, **k)

    monkeypatch.setattr(pw, "encode_chunk", spy)
    return seen


def test_lower_thread_priority_is_per_thread() -> None:
    base = _own_nice()
    out: dict[str, Any] = {}

    def worker() -> None:
        out["done"] = lower_thread_priority(2)
        out["nice"] = _own_nice()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    if sys.platform.startswith("linux"):
        assert out["done"] and out["nice"] == min(19, base + 2)
    assert _own_nice() == base
    assert lower_thread_priority(0) is False


def test_background_encoders_keep_priority_on_remote_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoders writing to a store without local files (whose connection pools they may start)
    keep the caller's priority, so no pool thread inherits a lowered one."""
    monkeypatch.setenv("OCDBT_PY_SAVE_NICE", "5")
    base = _own_nice()
    seen = _record_encoder_nice(monkeypatch, base)
    kv = MemoryStore()
    tree = {f"a{i}": np.full((300, 1024), i, dtype=np.float32) for i in range(2)}
    save(kv, tree, blocking=False, workers=2).wait(timeout=60)
    assert seen and set(seen) == {0}
    assert np.array_equal(restore(kv)["a1"], tree["a1"])


@pytest.mark.parametrize("blocking, where, expect", [
    (False, "local", "cores"), (True, "local", "default"), (False, "memory", "default"), (False, "url", "cores")])
def test_background_saves_to_local_files_encode_on_one_thread_per_core(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocking: bool, where: str, expect: str) -> None:
    """More encoder threads than cores only add GIL hand-offs that keep the training loop
    waiting; writes to remote stores keep overlapping with more threads."""
    used: list[int] = []
    orig = pw.run_bounded

    def spy(tasks: Any, workers: int, **k: Any) -> None:
        used.append(workers)
        orig(tasks, workers, **k)

    monkeypatch.setattr(pw, "run_bounded", spy)
    tree = {"a": np.arange(1000, dtype=np.float32)}
    dest: Any = {"local": tmp_path / "c", "memory": MemoryStore(), "url": f"file://{tmp_path}/c"}[where]
    save(dest, tree, blocking=blocking).wait(timeout=60)
    cores = max(1, min(16, os.cpu_count() or 1))
    assert used == [cores if expect == "cores" else pw.default_workers()]
    assert pw.background_workers(True) == cores and pw.background_workers(False) == pw.default_workers()
