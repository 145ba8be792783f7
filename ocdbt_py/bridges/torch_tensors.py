"""NumPy trees from :func:`ocdbt_py.checkpoint.restore` as ``torch.Tensor`` trees, without copies.

>>> from ocdbt_py import bridges, checkpoint
>>> state = bridges.to_torch(checkpoint.restore("/ckpts/1000/params"))   # doctest: +SKIP

``torch.from_numpy`` shares the array's memory; bfloat16 and the float8 types (ml_dtypes
arrays, which torch cannot take directly) are reinterpreted through a same-width integer view,
so they are not copied either.  torch is imported only when called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ocdbt_py.errors import MissingDependencyError

__all__ = ["to_torch", "TORCH_VIEWS"]

#: ml_dtypes name -> (same-width NumPy view type, torch dtype name).
TORCH_VIEWS = {
    "bfloat16": (np.int16, "bfloat16"),
    "float8_e4m3fn": (np.uint8, "float8_e4m3fn"),
    "float8_e5m2": (np.uint8, "float8_e5m2"),
    "float8_e4m3fnuz": (np.uint8, "float8_e4m3fnuz"),
    "float8_e5m2fnuz": (np.uint8, "float8_e5m2fnuz"),
    "float8_e8m0fnu": (np.uint8, "float8_e8m0fnu"),
}


def _tensor(a: np.ndarray, torch: Any) -> Any:
    if not a.flags.writeable:  # torch warns on read-only memory; a copy is the honest answer then
        a = a.copy()
    view = TORCH_VIEWS.get(a.dtype.name)
    if view is None:
        return torch.from_numpy(a)
    tdt = getattr(torch, view[1], None)
    if tdt is None:
        raise TypeError(f"this torch has no {view[1]} dtype for a {a.dtype.name} array")
    return torch.from_numpy(a.view(view[0])).view(tdt)


def to_torch(tree: Any) -> Any:
    """``tree`` with every NumPy array (ml_dtypes included) a ``torch.Tensor`` sharing its memory."""
    MissingDependencyError.require("torch", "torch", "to_torch()")
    import torch  # optional: only torch users pay for it

    def conv(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return _tensor(x, torch)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list):
            return [conv(v) for v in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple(conv(v) for v in x)
        return x

    return conv(tree)
