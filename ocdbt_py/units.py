"""Byte counts as people write and read them: ``5GB``, ``64MiB``, ``1.5 KiB``."""

from __future__ import annotations

import re

__all__ = ["parse_size", "human_bytes"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
#: decimal with a ``B`` (``KB`` = 1000, as Hugging Face writes shard sizes), binary with ``iB``
#: or a bare letter (``64MiB``, ``1G``, as command-line tools take them)
_UNITS = {"": 1, "B": 1,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
          "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(size: int | str) -> int:
    """A positive byte count from ``5GB`` (10**9), ``300KB``, ``2GiB`` / ``2G`` (2**30), ``1.5MB`` or
    a plain number; ``ValueError`` naming the accepted forms otherwise."""
    if isinstance(size, int) and not isinstance(size, bool):
        n = size
    elif isinstance(size, str) and (m := _SIZE.match(size)) and m.group(2).upper() in _UNITS:
        n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    else:
        raise ValueError(f"size {size!r} is not a byte count such as 5GB, 300KB, 64MiB or 1000000")
    if n <= 0:
        raise ValueError(f"size must be positive, not {size!r}")
    return n


def human_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    if n < 1024:
        return f"{n} B"
    x = float(n)
    unit = "KiB"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        x /= 1024
        if x < 1024 or unit == "PiB":
            break
    return f"{x:.1f} {unit}"
