"""Errors keep Orbax's bases (``except ValueError`` / ``except FileNotFoundError`` work), and
where Orbax 0.12.8 hangs (a save after ``close()``) we raise instead (spec/orbax-api.md 2.9)."""

from __future__ import annotations

import numpy as np
import pytest

import ocdbt_py.orbax as ocp
from ocdbt_py.orbax.checkpoint_manager import StepAlreadyExistsError


def _args(v: int) -> ocp.args.StandardSave:
    return ocp.args.StandardSave({"x": np.full(3, v, np.int32)})


def test_errors_have_orbax_bases(tmp_path) -> None:
    assert issubclass(StepAlreadyExistsError, ValueError) and issubclass(StepAlreadyExistsError, FileExistsError)
    with ocp.CheckpointManager(tmp_path / "m", options=ocp.CheckpointManagerOptions(
            enable_async_checkpointing=False)) as mngr:
        mngr.save(0, args=_args(0))
        with pytest.raises(ValueError):
            mngr.save(0, args=_args(0), force=True)  # the step exists
        with pytest.raises(FileNotFoundError):
            mngr.restore(7)
        with pytest.raises(FileNotFoundError):
            mngr.delete(7)
        with pytest.raises(ValueError):  # the target lacks a saved leaf
            mngr.restore(0, args=ocp.args.StandardRestore({}))
        with pytest.raises(ValueError):  # the target names a leaf not saved
            mngr.restore(0, args=ocp.args.StandardRestore({"x": np.zeros(3, np.int32), "y": np.zeros(1)}))
        got = mngr.restore(0, args=ocp.args.StandardRestore({"x": np.zeros(3, np.int32)}))
        assert got["x"].tolist() == [0, 0, 0]


def test_save_after_close_raises_instead_of_hanging(tmp_path) -> None:
    mngr = ocp.CheckpointManager(tmp_path / "m")
    mngr.save(0, args=_args(0))
    mngr.close()
    with pytest.raises(ValueError, match="closed"):
        mngr.save(1, args=_args(1))
    with pytest.raises(ValueError, match="closed"):
        mngr.delete(0)
