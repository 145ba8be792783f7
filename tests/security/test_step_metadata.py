"""Issue 32, hole 4: out-of-range numbers in a step's metadata.

A step whose ``_CHECKPOINT_METADATA`` records ``"commit_timestamp_nsecs": 10**63`` used to
make ``ocdbt_py.orbax.CheckpointManager(root)`` and ``ocdbt steps`` fail with Python's
``OverflowError``, so one hostile step stopped a run from resuming.  Now such a time is our
``CorruptionError`` and the step is left out with a :class:`BadStepWarning`; the others work.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ocdbt_py.orbax as ob
from ocdbt_py.checkpoint.manager import CheckpointManager
from ocdbt_py.checkpoint.manager.steps import BadStepWarning, read_step_info
from ocdbt_py.cli import main
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore import LocalStore


def _root(path: Path, steps: tuple[int, ...] = (0, 1, 2)) -> Path:
    with ob.CheckpointManager(path, options=ob.CheckpointManagerOptions(enable_async_checkpointing=False)) as m:
        for s in steps:
            m.save(s, args=ob.args.StandardSave({"w": np.arange(4) + s}))
    return path


def _poison(root: Path, step: int, **fields: object) -> None:
    p = root / str(step) / "_CHECKPOINT_METADATA"
    doc = json.loads(p.read_text())
    doc.update(fields)
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize("field", ["commit_timestamp_nsecs", "init_timestamp_nsecs"])
def test_orbax_manager_skips_the_bad_step(tmp_path: Path, field: str) -> None:
    root = _root(tmp_path / "run")
    if field == "init_timestamp_nsecs":
        _poison(root, 1, commit_timestamp_nsecs=None, init_timestamp_nsecs=10**63)
    else:
        _poison(root, 1, commit_timestamp_nsecs=10**63)
    with pytest.warns(BadStepWarning, match=r"step 1 .*out of range"):
        m = ob.CheckpointManager(root)
    with m:
        assert list(m.all_steps()) == [0, 2]
        assert m.latest_step() == 2
        got = m.restore(2, args=ob.args.StandardRestore())
        np.testing.assert_array_equal(got["w"], np.arange(4) + 2)
    assert (root / "1").is_dir()  # never deleted: it is not understood, not known to be garbage


def test_native_manager_and_step_info(tmp_path: Path) -> None:
    root = _root(tmp_path / "run")
    _poison(root, 0, commit_timestamp_nsecs=10**63)
    with pytest.raises(CorruptionError, match="out of range"):
        read_step_info(LocalStore(root), 0, "0")
    with pytest.warns(BadStepWarning), CheckpointManager(root, async_save=False) as mgr:
        assert mgr.all_steps() == [1, 2]
    _poison(root, 0, commit_timestamp_nsecs=253_402_300_800 * 10**9)  # the first second of year 10000
    with pytest.warns(BadStepWarning), CheckpointManager(root, async_save=False) as mgr:
        assert mgr.all_steps() == [1, 2]
    _poison(root, 0, commit_timestamp_nsecs=2**63 - 1)  # the largest int64: 2262, a time datetime holds
    with ob.CheckpointManager(root) as m:
        assert list(m.all_steps()) == [0, 1, 2]


def test_ocdbt_steps_lists_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _root(tmp_path / "run")
    _poison(root, 1, commit_timestamp_nsecs=10**63)
    assert main(["steps", str(root)]) == 0
    cap = capsys.readouterr()
    assert [ln.split()[0] for ln in cap.out.splitlines()[1:]] == ["0", "2"]
    assert "skipping step 1" in cap.err and "out of range" in cap.err
    assert main(["steps", str(root), "--json"]) == 0
    assert [d["step"] for d in json.loads(capsys.readouterr().out)] == [0, 2]
