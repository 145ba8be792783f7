"""Trees and comparisons shared by the copy tests and their Orbax worker (NumPy only)."""

from __future__ import annotations

from typing import Any

import numpy as np

#: name -> (shape, dtype, partition spec over a (4, 2) mesh of axes ("x", "y"))
SHARDED = {
    "params.kernel": ((64, 48), "float32", ("x", "y")),
    "params.bias": ((48,), "float32", ("y",)),
    "embed": ((96, 32), "bfloat16", ("x", None)),
    "counts": ((40,), "int32", (None,)),
}


def values() -> dict[str, np.ndarray]:
    """Deterministic global values of :data:`SHARDED` (and the NumPy leaves)."""
    import ml_dtypes

    rng = np.random.default_rng(17)
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype, _) in SHARDED.items():
        dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        if dt.kind == "i":
            out[name] = rng.integers(-1000, 1000, size=shape).astype(dt)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32).astype(dt)
    out["np_big"] = rng.standard_normal((300, 70))
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.0": leaf}`` of nested dicts and lists."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(tree, (list, tuple)) and tree:
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = tree
    return out


def compare(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Differences between two flattened trees (arrays: dtype and every value)."""
    errs = []
    if set(got) != set(want):
        errs.append(f"keys differ: only got {sorted(set(got) - set(want))[:5]}, "
                    f"only want {sorted(set(want) - set(got))[:5]}")
    for k in sorted(set(got) & set(want)):
        g, w = got[k], want[k]
        if isinstance(w, np.ndarray):
            g = np.asarray(g)
            if g.dtype != w.dtype or g.shape != w.shape or g.tobytes() != w.tobytes():
                errs.append(f"{k}: {g.dtype}{g.shape} differs from {w.dtype}{w.shape}")
        elif isinstance(g, np.ndarray) and g.shape == ():
            if g.item() != w:
                errs.append(f"{k}: {g!r} != {w!r}")
        elif g != w and not (isinstance(g, dict) and not g and isinstance(w, dict) and not w):
            errs.append(f"{k}: {g!r} != {w!r}")
    return errs
