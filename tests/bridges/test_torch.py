"""``bridges.to_torch(checkpoint.restore(...))``: torch tensors sharing the restored memory."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ocdbt_py import bridges, checkpoint

torch = pytest.importorskip("torch", reason="torch is not installed (its wheels are GBs); to_torch is untested here")


def test_to_torch_no_copy_bf16(tmp_path: Path) -> None:
    tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(4).astype(ml_dtypes.bfloat16),
            "f8": np.arange(4).astype(ml_dtypes.float8_e4m3fn), "n": 3}
    checkpoint.save(tmp_path / "c", tree)
    np_tree = checkpoint.restore(tmp_path / "c")
    t = bridges.to_torch(np_tree)
    assert t["w"].dtype == torch.float32 and t["b"].dtype == torch.bfloat16 and t["f8"].dtype == torch.float8_e4m3fn
    assert t["w"].data_ptr() == np_tree["w"].ctypes.data and t["b"].data_ptr() == np_tree["b"].ctypes.data
    assert torch.equal(t["b"].float(), torch.arange(4, dtype=torch.float32)) and t["n"] == 3
