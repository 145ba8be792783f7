"""Bounded zstd decompression.

A zstd frame need not declare its decompressed size (TensorStore's streamed frames do not),
and a tiny frame can claim gigabytes.  :func:`decompress_bounded` walks the frame's block
headers first: that gives the exact compressed length (so trailing bytes are detected) and an
upper bound of the output.  The frame is then decoded in one shot into a buffer of at most
that bound or the caller's limit, whichever is smaller; output that would not fit is an error.
"""

from __future__ import annotations

import struct

import zstandard

from ocdbt_py.errors import CorruptionError

__all__ = ["decompress_bounded", "frame_bounds"]

_MAGIC = 0xFD2FB528
_MAX_BLOCK = 128 * 1024


def frame_bounds(data: bytes | memoryview, *, path: str | None = None, base: int = 0) -> tuple[int, int, int | None]:
    """Return ``(compressed_size, max_output, content_size)`` of the zstd frame at ``data[0:]``.

    ``content_size`` is the declared size or ``None``.  Raises :class:`CorruptionError` for a
    malformed or truncated frame.
    """

    def err(msg: str, off: int) -> CorruptionError:
        return CorruptionError(f"zstd frame: {msg}", path=path, offset=base + off)

    n = len(data)
    if n < 5:
        raise err("truncated header", 0)
    (magic,) = struct.unpack_from("<I", data, 0)
    if magic != _MAGIC:
        raise err(f"bad magic {magic:#010x}", 0)
    fhd = data[4]
    fcs_flag = fhd >> 6
    single = (fhd >> 5) & 1
    if fhd & 0x08:
        raise err("reserved header bit set", 4)
    checksum = (fhd >> 2) & 1
    did_size = (0, 1, 2, 4)[fhd & 3]
    fcs_size = (single, 2, 4, 8)[fcs_flag]
    pos = 5
    window: int | None = None
    if not single:
        if pos >= n:
            raise err("truncated header", pos)
        wd = data[pos]
        exponent = wd >> 3
        mantissa = wd & 7
        wlog = 10 + exponent
        wbase = 1 << wlog
        window = wbase + (wbase // 8) * mantissa
        pos += 1
    pos += did_size
    if pos + fcs_size > n:
        raise err("truncated header", pos)
    content: int | None = None
    if fcs_size:
        raw = bytes(data[pos : pos + fcs_size])
        content = int.from_bytes(raw, "little")
        if fcs_size == 2:
            content += 256
    pos += fcs_size
    if single:
        window = content
    block_max = _MAX_BLOCK if window is None else min(window, _MAX_BLOCK)
    out_bound = 0
    while True:
        if pos + 3 > n:
            raise err("truncated block header", pos)
        bh = data[pos] | (data[pos + 1] << 8) | (data[pos + 2] << 16)
        pos += 3
        last = bh & 1
        btype = (bh >> 1) & 3
        bsize = bh >> 3
        if btype == 0:  # raw
            if bsize > block_max:
                raise err("raw block larger than the maximum block size", pos - 3)
            pos += bsize
            out_bound += bsize
        elif btype == 1:  # RLE
            if bsize > block_max:
                raise err("RLE block larger than the maximum block size", pos - 3)
            pos += 1
            out_bound += bsize
        elif btype == 2:  # compressed
            if bsize > block_max:
                raise err("compressed block larger than the maximum block size", pos - 3)
            pos += bsize
            out_bound += block_max
        else:
            raise err("reserved block type", pos - 3)
        if pos > n:
            raise err("truncated block", n)
        if last:
            break
    if checksum:
        pos += 4
        if pos > n:
            raise err("truncated checksum", n)
    if content is not None:
        out_bound = min(out_bound, content)
    return pos, out_bound, content


def decompress_bounded(
    data: bytes | memoryview,
    limit: int,
    *,
    path: str | None = None,
    base: int = 0,
    exact_size: int | None = None,
) -> bytes:
    """Decompress exactly one zstd frame that must fill ``data`` and yield at most ``limit`` bytes.

    With ``exact_size`` the output must be exactly that long.  Every failure is a
    :class:`CorruptionError`; memory use never exceeds about ``limit``.
    """

    size, bound, content = frame_bounds(data, path=path, base=base)
    if size != len(data):
        raise CorruptionError(
            f"{len(data) - size} trailing byte(s) after the zstd frame", path=path, offset=base + size
        )
    if exact_size is not None:
        limit = min(limit, exact_size)
    if content is not None and content > limit:
        raise CorruptionError(
            f"zstd frame declares {content} bytes, more than the limit of {limit}", path=path, offset=base
        )
    # Decode into one buffer of at most min(bound, limit) bytes; output beyond it is an error.
    # libzstd may also reserve the frame's declared window (at most 128 MiB, its default
    # windowLogMax, which zstd level 22 really uses); those pages are only touched as far as
    # the output reaches.  Larger windows are rejected.
    cap = max(1, min(bound, limit))
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=cap)
    except zstandard.ZstdError as e:
        raise CorruptionError(f"zstd decompression failed: {e}", path=path, offset=base) from e
    if content is not None and len(out) != content:
        raise CorruptionError(
            f"zstd frame declared {content} bytes but produced {len(out)}", path=path, offset=base
        )
    if exact_size is not None and len(out) != exact_size:
        raise CorruptionError(
            f"decompressed to {len(out)} bytes, expected {exact_size}", path=path, offset=base
        )
    return out
