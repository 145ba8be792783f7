"""A save interrupted at any point leaves the previous checkpoint or none, never a broken one.

* every I/O step of a save fails in turn (in process): local rename mode and commit-file mode
  (a non-renaming backend), for a new step and for ``force=True`` over an existing one;
* real crashes: a subprocess is killed with ``os._exit`` at chosen I/O steps (commit-file
  mode) or with SIGKILL at spread-out times (rename mode); then our reader and Orbax's
  ``CheckpointManager`` must only see complete steps.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import restore, save
from ocdbt_py.checkpoint.saving import atomic
from ocdbt_py.errors import NotFoundError, StorageError
from ocdbt_py.kvstore import LocalStore, sinks
from ocdbt_py.kvstore import local as local_mod
from ocdbt_py.kvstore.fsspec_store import FsspecStore
from ocdbt_py.testing.faults import WRITE_OPS, FaultyStore, InjectedFault
from tests.checkpoint_save import _trees
from tests.checkpoint_save.conftest import have_oracle, run_worker, subprocess_env

TMP = ".orbax-checkpoint-tmp"


tree_a = _trees.crash_old
tree_b = _trees.crash_new
_big_b = _trees.crash_new_big


def _same(got: Any, want: dict[str, Any]) -> bool:
    if not isinstance(got, dict) or set(got) != set(want):
        return False
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            if not (isinstance(got[k], np.ndarray) and got[k].dtype == v.dtype and np.array_equal(got[k], v)):
                return False
        elif got[k] != v:
            return False
    return True


def check_root(root: Path, allowed: dict[int, list[Callable[[], dict[str, Any]]]], *, in_place: bool) -> int | None:
    """Every committed step equals one of its allowed trees; returns the latest readable step."""
    latest = None
    for d in sorted(root.iterdir()) if root.exists() else []:
        if TMP in d.name:
            continue
        step = int(d.name)
        committed = (d / "commit_success.txt").exists() if in_place else True
        if not committed:
            continue
        assert (d / "commit_success.txt").exists(), f"{d} has no commit marker"
        got = restore(d)
        assert any(_same(got, f()) for f in allowed[step]), f"step {step} is committed but broken: {got}"
        latest = step if latest is None else max(latest, step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = restore(_object_store_view(root) if in_place else root)
        except NotFoundError:
            assert latest is None, "the reader found no step although one is committed"
            return None
    assert latest is not None
    assert any(_same(got, f()) for f in allowed[latest])
    return latest


def _object_store_view(root: Path) -> FsspecStore:
    """The directory seen as an object store would be (no renames: commit markers count)."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    return FsspecStore(DirFileSystem(path=str(root), fs=LocalFileSystem()), "")


class _StepFailer:
    """Counts the local I/O steps of a save and raises at step ``fail_at``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.count = 0
        self.fail_at: int | None = None
        mp = monkeypatch
        for owner, name in ((local_mod.LocalStore, "set_parts"), (local_mod.LocalStore, "delete"),
                            (sinks.DeferredSyncStore, "set_parts"), (sinks.DeferredSyncStore, "sync_all"),
                            (sinks._FileSink, "write"), (sinks._FileSink, "close"), (atomic.os, "rename"),
                            (atomic, "_exchange"), (atomic.shutil, "rmtree"), (atomic.os, "makedirs")):
            mp.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **k: Any) -> Any:
            step = self.count
            self.count += 1
            if self.fail_at is not None and step == self.fail_at:
                raise InjectedFault(f"injected failure at step {step}")
            return fn(*a, **k)

        return wrapped


def _setup(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    save(root / "1", tree_a())


@pytest.mark.parametrize("force", [False, True])
def test_every_failure_point_rename_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, force: bool) -> None:
    root = tmp_path / "root"
    target = root / ("1" if force else "2")
    _setup(root)
    failer = _StepFailer(monkeypatch)
    failer.count = 0
    save(target, tree_b(), force=force, workers=1)
    steps = failer.count
    assert steps > 10
    allowed = {1: [tree_a, tree_b] if force else [tree_a], 2: [tree_b]}
    for k in range(steps):
        failer.fail_at = None
        _setup(root)
        failer.count = 0
        failer.fail_at = k
        with pytest.raises(StorageError):  # the injected fault, possibly wrapped
            save(target, tree_b(), force=force, workers=1)
        failer.fail_at = None
        latest = check_root(root, allowed, in_place=False)
        assert latest is not None or force  # without force the old step 1 always survives


def _in_place_steps(root: Path, target: str, force: bool) -> int:
    _setup_in_place(root)
    probe = FaultyStore(LocalStore(str(root / target)), ops=WRITE_OPS)
    save(probe, tree_b(), force=force, workers=1)
    return len(probe.log)


def _setup_in_place(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    save(FaultyStore(LocalStore(str(root / "1"))), tree_a())


@pytest.mark.parametrize("force", [False, True])
def test_every_failure_point_commit_file_mode(tmp_path: Path, force: bool) -> None:
    root = tmp_path / "root"
    target = "1" if force else "2"
    steps = _in_place_steps(root, target, force)
    assert steps > 5
    allowed = {1: [tree_a, tree_b] if force else [tree_a], 2: [tree_b]}
    for k in range(steps):
        _setup_in_place(root)
        store = FaultyStore(LocalStore(str(root / target)), fail_at=k, ops=WRITE_OPS)
        with pytest.raises(InjectedFault):
            save(store, tree_b(), force=force, workers=1)
        check_root(root, allowed, in_place=True)


# -- real crashes -------------------------------------------------------------------------------
_CHILD = r"""
import sys
sys.path.insert(0, {here!r})
from _trees import crash_new_big
from ocdbt_py.checkpoint import save
from ocdbt_py.testing.faults import FaultyStore, WRITE_OPS
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.kvstore.fsspec_store import FsspecStore
mode, target, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
big = crash_new_big()
if mode == "kill_at_step":
    store = FaultyStore(LocalStore(target), fail_at=arg, action="kill", ops=WRITE_OPS)
    save(store, big, force=True, workers=1)
else:
    print("ready", flush=True)
    for i in range(100):
        save(target, big, force=True)
"""


def _run_child(args: list[str]) -> subprocess.Popen[str]:
    code = _CHILD.format(here=str(Path(__file__).parent))
    return subprocess.Popen([sys.executable, "-c", code, *args], env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def crashed_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Path]]:
    """Manager roots whose step 1 save was killed at various points (both commit modes)."""
    base = tmp_path_factory.mktemp("crashes")
    roots: list[Path] = []
    # commit-file mode: killed at evenly spread I/O steps (os._exit: no cleanup at all)
    probe_root = base / "probe"
    save(FaultyStore(LocalStore(str(probe_root / "0"))), tree_a())
    probe = FaultyStore(LocalStore(str(probe_root / "1")), ops=WRITE_OPS)
    save(probe, _big_b(), workers=1)
    n = len(probe.log)
    for k in sorted({0, 1, n // 4, n // 2, (3 * n) // 4, n - 2, n - 1}):
        root = base / f"inplace_{k}"
        save(FaultyStore(LocalStore(str(root / "0"))), tree_a())
        save(FaultyStore(LocalStore(str(root / "1"))), tree_a())
        p = _run_child(["kill_at_step", str(root / "1"), str(k)])
        p.communicate(timeout=120)
        assert p.returncode == 77, f"child was not killed at step {k} (rc {p.returncode})"
        roots.append(root)
    # rename mode: SIGKILL at spread-out times while overwriting step 1 again and again
    for i, delay in enumerate((0.05, 0.3, 0.7, 1.1, 1.6)):
        root = base / f"rename_{i}"
        save(root / "0", tree_a())
        save(root / "1", tree_a())
        p = _run_child(["loop", str(root / "1"), "0"])
        assert p.stdout is not None
        p.stdout.readline()
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=60)
        roots.append(root)
    yield roots


def test_crashes_leave_old_or_nothing(crashed_roots: list[Path]) -> None:
    for root in crashed_roots:
        in_place = root.name.startswith("inplace")
        latest = check_root(root, {0: [tree_a], 1: [tree_a, _big_b]}, in_place=in_place)
        assert latest in (0, 1)


@pytest.mark.skipif(not have_oracle(), reason="needs orbax-checkpoint, jax and tensorstore")
def test_orbax_only_sees_complete_steps(crashed_roots: list[Path], tmp_path: Path) -> None:
    jobs = []
    for root in crashed_roots:
        in_place = root.name.startswith("inplace")
        steps = [0] + ([1] if (not in_place or (root / "1" / "commit_success.txt").exists()) else [])
        jobs.append({"name": root.name, "kind": "crash_check", "root": str(root), "steps": steps,
                     "commit_file": in_place})
    report = run_worker(jobs, tmp_path)
    assert {k: v["errors"] for k, v in report.items() if v["errors"]} == {}
    assert sorted(report) == sorted(j["name"] for j in jobs)
