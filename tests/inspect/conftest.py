"""Fixtures for the inspection tests (``ocdbt stats``, ``diff``, ``du``, ``report``): checkpoints
with planted NaN, Inf and zeros in several dtypes, and the in-process CLI runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tests.cli.conftest import cli  # noqa: F401  (the in-process ``ocdbt`` runner)

#: dtype name -> (dtype, can hold NaN, can hold Inf)
DTYPES: dict[str, tuple[Any, bool, bool]] = {
    "float32": (np.float32, True, True),
    "float16": (np.float16, True, True),
    "bfloat16": (ml_dtypes.bfloat16, True, True),
    "float8_e5m2": (ml_dtypes.float8_e5m2, True, True),
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, True, False),
    "int8": (np.int8, False, False),
    "int4": (ml_dtypes.int4, False, False),
}


def planted(name: str, shape: tuple[int, ...] = (37, 29), seed: int = 0) -> np.ndarray:
    """A random array of dtype ``name`` with zeros, and NaN/Inf where the dtype has them."""
    dt, has_nan, has_inf = DTYPES[name]
    rng = np.random.default_rng(seed)
    if name == "int4":
        a = rng.integers(-8, 8, shape).astype(dt)
    elif name == "int8":
        a = rng.integers(-128, 128, shape).astype(dt)
    else:
        a = (rng.standard_normal(shape) * 3).astype(dt)
    flat = a.reshape(-1)
    flat[5:9] = 0
    if has_nan:
        flat[[11, 200, -1]] = np.nan
    if has_inf:
        flat[13] = np.inf
        flat[300] = -np.inf
    return a


def planted_tree(seed: int = 0) -> dict[str, Any]:
    """A tree holding one planted array per dtype, a large clean float32 array and a scalar."""
    rng = np.random.default_rng(seed)
    return {
        "params": {name: planted(name, seed=seed + i) for i, name in enumerate(DTYPES)},
        "clean": rng.standard_normal((256, 100)).astype(np.float32),
        "step": 5,
    }


def numpy_stats(a: np.ndarray) -> dict[str, Any]:
    """What the statistics of ``a`` must be, computed with NumPy over the whole array."""
    x = np.asarray(a).astype(np.float64).reshape(-1)
    fin = x[np.isfinite(x)]
    return {
        "min": float(fin.min()) if fin.size else None,
        "max": float(fin.max()) if fin.size else None,
        "mean": float(fin.mean()) if fin.size else None,
        "std": float(fin.std()) if fin.size else None,
        "nan": int(np.isnan(x).sum()),
        "inf": int(np.isinf(x).sum()),
        "zeros": int((x == 0).sum()),
        "size": int(x.size),
    }


def flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """``{dotted name: array}`` of a nested dict of arrays and scalars."""
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, name))
        else:
            out[name] = np.asarray(v)
    return out


def assert_stats_match(got: dict[str, Any], tree: Any) -> None:
    """Each tensor's statistics (JSON form) equal NumPy's."""
    want_all = flatten(tree)
    assert set(got) == set(want_all)
    for name, a in want_all.items():
        g, w = got[name], numpy_stats(a)
        assert g["shape"] == list(a.shape) and g["dtype"] == a.dtype.name, name
        for k in ("nan", "inf", "zeros", "size"):
            assert g[k] == w[k], (name, k, g[k], w[k])
        for k in ("min", "max"):
            assert g[k] == w[k], (name, k)
        for k in ("mean", "std"):
            assert g[k] == pytest.approx(w[k], rel=1e-9, abs=1e-12), (name, k)


@pytest.fixture(scope="module")
def planted_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A planted checkpoint saved by us with small chunks (many chunks per array)."""
    from ocdbt_py import checkpoint

    path = tmp_path_factory.mktemp("planted") / "ckpt"
    tree = planted_tree()
    checkpoint.save(path, tree, chunk_byte_size=2048)
    return path, tree
