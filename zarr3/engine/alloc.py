"""Output allocation that fails with our error, naming what was too large.

A hostile (or mistaken) array declares its own shape: a 2^40-element array would make NumPy
raise a bare ``MemoryError`` (or, with overcommit, the process be killed later).  Outputs are
allocated through :func:`empty`, which refuses more than the machine's physical memory up
front and turns an allocation failure into :class:`ocdbt_py.errors.ResourceError`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ocdbt_py.errors import ResourceError

__all__ = ["empty", "physical_memory"]


def physical_memory() -> int | None:
    """Bytes of physical memory, or ``None`` when the platform does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


#: outputs up to this size are allocated without asking how much memory the machine has
_ALWAYS_OK = 64 << 20


def empty(shape: Sequence[int], dtype: Any, what: str) -> np.ndarray:
    """``np.empty(shape, dtype)``, or :class:`ResourceError` naming ``what`` and the size."""
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    nbytes = dt.itemsize
    for d in shape:
        nbytes *= int(d)
    if nbytes <= _ALWAYS_OK:  # the common case: no system call per chunk
        return np.empty(tuple(shape), dtype=dt)
    phys = physical_memory()
    if phys is not None and nbytes > phys:
        raise ResourceError(
            f"{what}: {tuple(shape)} x {dt} needs {_human(nbytes)}, more than this machine's "
            f"{_human(phys)} of memory", nbytes=nbytes)
    try:
        return np.empty(tuple(shape), dtype=dt)
    except (MemoryError, ValueError) as e:
        raise ResourceError(f"{what}: cannot allocate {tuple(shape)} x {dt} ({_human(nbytes)}): {e}",
                            nbytes=nbytes) from e
