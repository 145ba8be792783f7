"""The state the multi-tier tests save: a few leaves of different dtypes and shardings whose
values depend on the step, with ``-0.0`` and NaN payloads to check that copies are exact.

``SPECS`` maps leaf names to ``(shape, dtype name, partition spec over ("replica", "model"))``;
no leaf uses the replica axis (every replica holds the whole state).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

SPECS: dict[str, tuple[tuple[int, ...], str, tuple[Any, ...]]] = {
    "w": ((16, 8), "float32", ("model",)),
    "cols": ((4, 8), "int32", (None, "model")),
    "bias": ((8,), "bfloat16", ()),
    "mask": ((8, 4), "bool", ("model",)),
    "cplx": ((8,), "complex64", ("model",)),
    "scale": ((), "float32", ()),
    "opt": {"mu": ((16, 8), "float32", ("model",)), "count": ((), "int32", ())},  # type: ignore[dict-item]
}


def _dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def leaf_value(path: str, shape: tuple[int, ...], dtype: str, step: int) -> np.ndarray:
    """The value of one leaf at ``step``."""
    seed = sum(ord(c) for c in path) * 1000 + step
    rng = np.random.default_rng(seed)
    dt = _dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(-1000, 1000, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    v = (rng.standard_normal(shape) * 10 + step).astype(np.float32)
    if v.size >= 4:
        flat = v.reshape(-1)
        flat[0] = -0.0
        flat[1] = np.float32(np.nan)
        flat[2] = np.frombuffer(np.uint32(0x7FC0BEEF).tobytes(), np.float32)[0]  # a NaN payload
    return v.astype(dt)


def walk(specs: Any = SPECS, prefix: str = "") -> list[tuple[str, tuple[int, ...], str, tuple[Any, ...]]]:
    """``(path, shape, dtype, spec)`` of every leaf, in a fixed order."""
    out = []
    for k in sorted(specs):
        v = specs[k]
        if isinstance(v, dict):
            out.extend(walk(v, f"{prefix}{k}."))
        else:
            out.append((prefix + k, v[0], v[1], v[2]))
    return out


def values(step: int) -> dict[str, np.ndarray]:
    """Every leaf's value at ``step``, by dotted path."""
    return {path: leaf_value(path, shape, dtype, step) for path, shape, dtype, _ in walk()}


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted paths to nested dicts."""
    out: dict[str, Any] = {}
    for path, v in flat.items():
        node = out
        parts = path.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return out
