"""NumPy dtypes by name, including the ml_dtypes extension types JAX uses."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from zarr3.dtypes import ML_FLOAT_NAMES, ML_INT_NAMES

__all__ = ["dtype_from_name", "dtype_name", "ML_DTYPE_NAMES"]

_ML_NAMES = ML_FLOAT_NAMES + ML_INT_NAMES


#: Names of the ml_dtypes extension types (not understood by NumPy itself).
ML_DTYPE_NAMES = frozenset(_ML_NAMES)


def dtype_from_name(name: str) -> np.dtype:
    """``np.dtype`` for a NumPy name (``"float32"``, ``"<f4"``) or an ml_dtypes name."""
    if name in _ML_NAMES:
        t = getattr(ml_dtypes, name, None)
        if t is None:
            raise TypeError(f"this ml_dtypes version has no {name!r}")
        return np.dtype(t)
    dt = np.dtype(name)
    if dt.kind in "OUSVMm" or dt.fields is not None:
        raise TypeError(f"unsupported dtype {name!r}")
    return dt


def dtype_name(dt: np.dtype) -> str:
    """The canonical name of a dtype (``"float32"``, ``"bfloat16"``)."""
    return np.dtype(dt).name
