"""Atomic steps on a local disk: a step is a temporary directory until its rename.

* a process SIGKILLed in the middle of an async manager save (right after ``save()`` returned,
  and at the commit point itself) leaves ``<step>.orbax-checkpoint-tmp``: neither our manager
  nor Orbax's lists it, and the next writable manager removes it;
* retention running while a later async save is in flight never deletes the newest committed
  step or the step being written (even with a policy that keeps nothing).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import JsonItem
from ocdbt_py.checkpoint.manager import CheckpointManager, LatestN, StepInfo
from ocdbt_py.checkpoint.manager import tier as tier_mod
from ocdbt_py.checkpoint.saving import atomic

REPO = Path(__file__).resolve().parents[2]
TMP = ".orbax-checkpoint-tmp"


def _items(step: int, big: bool = False) -> dict[str, Any]:
    n = 8_000_000 if big else 2_000  # 32 MB: the write outlasts save()'s return
    return {
        "params": {"w": np.arange(n, dtype=np.float32) + step, "b": np.full((4, 4), step, np.int16)},
        "config": JsonItem({"step": step}),
    }


def _assert_step(got: Any, step: int, big: bool = False) -> None:
    want = _items(step, big)
    assert set(got) == {"params", "config"}
    assert got["config"] == {"step": step}
    for k, v in want["params"].items():
        assert got["params"][k].dtype == v.dtype and np.array_equal(got["params"][k], v), k


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    return env


_CHILD = textwrap.dedent(
    """
    import sys, time
    from ocdbt_py.checkpoint.manager import CheckpointManager
    from ocdbt_py.checkpoint.saving import atomic
    from tests.checkpoint_manager.test_manager_atomicity import _items
    root, mode = sys.argv[1], sys.argv[2]
    mgr = CheckpointManager(root, async_save=True, step_prefix="ckpt")
    mgr.save(0, _items(0))
    mgr.wait_until_finished()
    if mode == "at_commit":  # stall at the rename that would commit the step
        def stall(self, *a, **k):
            print("committing", flush=True)
            time.sleep(600)
        atomic.Destination.commit = stall
    mgr.save(1, _items(1, big=True))
    print("returned", flush=True)
    time.sleep(600)
    """
)


def _killed_root(root: Path, mode: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(root), mode], env=_env(), cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    wait_for = "committing" if mode == "at_commit" else "returned"
    try:
        for line in proc.stdout:
            if line.strip() == wait_for:
                break
        else:
            pytest.fail(f"child ended early:\n{proc.stderr.read() if proc.stderr else ''}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


_ORBAX_LIST = textwrap.dedent(
    """
    import json, sys
    import orbax.checkpoint as ocp
    out = {}
    for root in sys.argv[1:]:
        opts = ocp.CheckpointManagerOptions(read_only=True, step_prefix="ckpt")
        with ocp.CheckpointManager(root, options=opts) as m:
            out[root] = m.all_steps()
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("killed_manager")
    roots = {}
    for mode in ("at_commit", "after_return"):
        roots[mode] = base / mode
        _killed_root(roots[mode], mode)
    return roots


def test_killed_at_commit_leaves_only_a_tmp_dir(killed: dict[str, Path]) -> None:
    root = killed["at_commit"]
    assert sorted(p.name for p in root.iterdir()) == ["ckpt_0", f"ckpt_1{TMP}"]
    tmp = root / f"ckpt_1{TMP}"
    assert (tmp / "commit_success.txt").is_file()  # fully written, only the rename missing
    with CheckpointManager(root, read_only=True, step_prefix="ckpt") as mgr:
        assert mgr.all_steps() == [0] and mgr.latest_step() == 0
        _assert_step(mgr.restore(), 0)


def test_killed_after_save_returned_is_all_or_nothing(killed: dict[str, Path]) -> None:
    root = killed["after_return"]
    names = sorted(p.name for p in root.iterdir())
    with CheckpointManager(root, read_only=True, step_prefix="ckpt") as mgr:
        if "ckpt_1" in names:  # the 32 MB write beat the kill: then it is complete
            assert mgr.all_steps() == [0, 1]
            _assert_step(mgr.restore(1), 1, big=True)
        else:
            assert mgr.all_steps() == [0]
            # the kill may land before the background save has made its temporary directory
            assert names in (["ckpt_0"], ["ckpt_0", f"ckpt_1{TMP}"]), names


@pytest.mark.skipif(importlib.util.find_spec("orbax.checkpoint") is None, reason="needs orbax-checkpoint")
def test_orbax_does_not_list_killed_steps(killed: dict[str, Path]) -> None:
    roots = [str(killed[m]) for m in ("at_commit", "after_return")]
    p = subprocess.run([sys.executable, "-c", _ORBAX_LIST, *roots], env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got[roots[0]] == [0]
    with CheckpointManager(roots[1], read_only=True, step_prefix="ckpt") as mgr:
        assert got[roots[1]] == mgr.all_steps()


def test_new_manager_removes_leftovers(killed: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "root"
    shutil.copytree(killed["at_commit"], root)
    (root / f"ckpt_7{TMP}-deleting-1a2b3c4d").mkdir()  # an interrupted deletion
    (root / f"other_2{TMP}").mkdir()  # another manager's (prefix): not ours to remove
    (root / "notes").mkdir()
    with CheckpointManager(root, read_only=True, step_prefix="ckpt"):
        pass  # read-only: removes nothing
    assert (root / f"ckpt_1{TMP}").exists()
    with CheckpointManager(root, step_prefix="ckpt", async_save=False) as mgr:
        assert sorted(p.name for p in root.iterdir()) == ["ckpt_0", "notes", f"other_2{TMP}"]
        assert mgr.all_steps() == [0]
        assert mgr.save(1, _items(1))
        assert mgr.all_steps() == [0, 1]
        _assert_step(mgr.restore(1), 1)


class _KeepNothing:
    """A preservation policy that keeps no step, recording what it was shown."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def keep(self, steps: list[StepInfo]) -> set[int]:
        self.seen.append([s.step for s in steps])
        return set()


@pytest.mark.parametrize("policy", ["keep_nothing", "latest0", "latest1"])
def test_retention_during_inflight_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    """Step 1's retention runs while step 2's async save is held at its commit: it may delete
    step 0 only -- never step 1 (the newest committed) nor step 2's temporary directory."""
    root = tmp_path / "root"
    entered, gate, deleted = threading.Event(), threading.Event(), threading.Event()
    deletions: list[tuple[str, list[str], list[int]]] = []
    commit = atomic.Destination.commit
    delete_step = tier_mod.delete_step

    def gated_commit(self: atomic.Destination, *a: Any, **k: Any) -> None:
        if self.final_dir is not None and self.final_dir.endswith(f"{os.sep}2"):
            entered.set()
            assert gate.wait(60), "the test never released the commit"
        commit(self, *a, **k)

    mgr: CheckpointManager

    def watched_delete(kv: Any, name: str, **kw: Any) -> None:
        if name == "0":  # make step 1's retention overlap step 2's save
            assert entered.wait(60), "step 2's save never reached its commit"
        snapshot = (name, sorted(p.name for p in root.iterdir()), mgr.all_steps())
        delete_step(kv, name, **kw)
        deletions.append(snapshot)
        deleted.set()

    monkeypatch.setattr(atomic.Destination, "commit", gated_commit)
    monkeypatch.setattr(tier_mod, "delete_step", watched_delete)
    keep: Any = {"keep_nothing": _KeepNothing(), "latest0": LatestN(0), "latest1": LatestN(1)}[policy]
    mgr = CheckpointManager(root, preservation=keep, async_save=True)
    try:
        for step in (0, 1, 2):
            assert mgr.save(step, _items(step))
        assert entered.wait(60)
        # step 1's retention has deleted step 0 while step 2 waits at its commit
        assert deleted.wait(60)
        assert [d[0] for d in deletions] == ["0"]
        name, on_disk, listed = deletions[0]
        assert "1" in on_disk and f"2{TMP}" in on_disk and mgr.is_saving_in_progress()
        assert listed == [1] and mgr.all_steps() == [1]
        assert sorted(p.name for p in root.iterdir()) == ["1", f"2{TMP}"]
        with pytest.raises(ValueError):
            mgr.delete(2)  # still being written
        gate.set()
        mgr.wait_until_finished()
    finally:
        gate.set()
        mgr.close()
    assert [d[0] for d in deletions] == ["0", "1"]
    assert mgr.all_steps() == [2]
    assert sorted(p.name for p in root.iterdir()) == ["2"]
    _assert_step(CheckpointManager(root, read_only=True).restore(2), 2)
    if isinstance(keep, _KeepNothing):
        assert keep.seen[-1] == [1, 2]  # step 2's retention, after step 1's deleted step 0
        assert all(2 not in seen for seen in keep.seen[:-1])  # never shown while in flight
