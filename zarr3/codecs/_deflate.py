"""Bounded zlib/gzip inflation shared by the ``gzip`` and v2 ``zlib`` codecs."""

from __future__ import annotations

import zlib

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import Buffer

__all__ = ["inflate", "check_inflatable", "MAX_RATIO"]

#: No deflate stream decodes to more than this many times its length: the longest match (258
#: bytes) costs at least two bits (a one-bit length code and a one-bit distance code).
MAX_RATIO = 1032


def inflate(data: Buffer, wbits: int, size: int | None, bound: int, what: str) -> bytes:
    """Inflate one zlib/gzip stream, producing at most ``size`` (or ``bound``) bytes.

    Trailing bytes after the stream, a truncated stream and output of the wrong size are all
    :class:`CorruptionError`.
    """
    limit = bound if size is None else size
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise CorruptionError(f"{what} decompression failed: {e}") from e
    if len(out) > limit or d.unconsumed_tail:
        raise CorruptionError(f"{what} data decompresses to more than {limit} bytes")
    if not d.eof:
        raise CorruptionError(f"{what} stream is truncated")
    if d.unused_data:
        raise CorruptionError(f"{what} stream has {len(d.unused_data)} trailing bytes")
    if size is not None and len(out) != size:
        raise CorruptionError(f"{what} data decompressed to {len(out)} bytes, expected {size}")
    return out


def check_inflatable(data: Buffer, size: int | None, what: str) -> None:
    """Refuse (:class:`CorruptionError`) ``data`` too short to inflate to ``size`` bytes: judged
    by its length, before any buffer of ``size`` bytes exists."""
    n = memoryview(data).nbytes
    if size is not None and size > MAX_RATIO * n + 1024:
        raise CorruptionError(f"{n} bytes of {what} data cannot decompress to the {size} bytes expected")


def deflate_bound(n: int) -> int:
    """Upper bound of a deflate stream (zlib's deflateBound) plus a gzip header and trailer."""
    return n + (n >> 12) + (n >> 14) + (n >> 25) + 13 + 18
