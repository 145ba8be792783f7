"""Blosc (version 1) frames decoded block by block, for frames whose compressor the installed
blosc library lacks: snappy, which neither python-blosc nor numcodecs builds in, though c-blosc
and TensorStore write it.

The frame (c-blosc's format, as its ``blosc_d`` reads it): a 16-byte header (format version,
compressor version, flags, typesize, then little-endian ``nbytes``, ``blocksize``, ``cbytes``),
one little-endian int32 offset per block, and the blocks.  A block of ``bsize`` bytes (the last
one may be shorter) is stored as ``nsplits`` streams, each an int32 length and that many bytes:
a stream as long as its decoded size is stored raw, any other is compressed.  ``nsplits`` is the
typesize when the flags' "don't split" bit (0x10) is clear, the typesize is at most 16, the block
holds at least 128 elements and it is not the short last block; otherwise 1.  The decoded block is
then unshuffled: byte shuffle (flag 0x01, typesize > 1; the bytes past the last whole element
as they are) or bit shuffle (flag 0x04; only a block of whole groups of 8 elements is
bit-shuffled, any other is stored as is).  Format versions 1 and 2 (blosc 1) only.

Every size is checked against the frame's own and the caller's bound before anything is
allocated; a snappy stream's declared length (its varint preamble) must equal the stream's size.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.errors import CodecUnavailableError

__all__ = ["decode_frame", "snappy_decoder"]

_HEADER = 16
_DOSHUFFLE = 0x01
_DOBITSHUFFLE = 0x04
_DONT_SPLIT = 0x10
_MAX_SPLITS = 16
_MIN_BUFFERSIZE = 128


def snappy_decoder() -> Callable[[memoryview, int], bytes]:
    """``decode(stream, size)`` for raw snappy streams, from cramjam (the ``[snappy]`` extra)."""
    try:
        # optional codec: the [snappy] extra
        import cramjam
    except ImportError as e:
        raise CodecUnavailableError("blosc/snappy", "cramjam", extra="snappy") from e

    def decode(stream: memoryview, size: int) -> bytes:
        declared = _varint(stream)
        if declared != size:
            raise CorruptionError(f"snappy stream declares {declared} bytes, the blosc block holds {size}")
        try:
            out = bytes(cramjam.snappy.decompress_raw(bytes(stream)))
        except Exception as e:
            raise CorruptionError(f"snappy decompression failed: {e}") from e
        if len(out) != size:
            raise CorruptionError(f"snappy stream decoded to {len(out)} bytes, expected {size}")
        return out

    return decode


def _varint(data: memoryview) -> int:
    value = 0
    for i in range(min(5, len(data))):
        b = data[i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return value
    raise CorruptionError("snappy stream has no valid length preamble")


def _unshuffle(block: np.ndarray, typesize: int) -> np.ndarray:
    n = block.size // typesize
    out = block.copy()
    out[: n * typesize] = block[: n * typesize].reshape(typesize, n).T.reshape(-1)
    return out


def _bitunshuffle(block: np.ndarray, typesize: int) -> np.ndarray:
    n = block.size // typesize
    n8 = n - n % 8
    out = block.copy()
    if n8:
        rows = block[: n8 * typesize].reshape(typesize, 8, n8 // 8)
        bits = np.unpackbits(rows, axis=-1, bitorder="little")  # [byte, bit, element]
        out[: n8 * typesize] = np.packbits(bits.transpose(2, 0, 1), axis=-1, bitorder="little").reshape(-1)
    return out


def decode_frame(data: Any, bound: int, decompress: Callable[[memoryview, int], bytes]) -> bytes:
    """The bytes of a blosc 1 frame whose streams ``decompress(stream, size)`` decodes."""
    view = memoryview(data).cast("B")
    if len(view) < _HEADER:
        raise CorruptionError(f"blosc frame of {len(view)} bytes is shorter than its header")
    if view[0] not in (1, 2):
        raise CorruptionError(f"blosc frame format version {view[0]} is not one of blosc 1's (1, 2)")
    flags, typesize = view[2], view[3]
    nbytes, blocksize, cbytes = struct.unpack_from("<III", view, 4)
    if nbytes > bound:
        raise CorruptionError(f"blosc frame declares {nbytes} bytes, more than {bound}")
    if cbytes > len(view) or cbytes < _HEADER:
        raise CorruptionError(f"blosc frame declares {cbytes} compressed bytes, has {len(view)}")
    if nbytes == 0:
        return b""
    if blocksize == 0 or typesize == 0:
        raise CorruptionError(f"blosc frame declares blocksize {blocksize}, typesize {typesize}")
    nblocks = -(-nbytes // blocksize)
    if _HEADER + 4 * nblocks > cbytes:
        raise CorruptionError(f"blosc frame of {cbytes} bytes cannot hold {nblocks} block offsets")
    starts = struct.unpack_from(f"<{nblocks}i", view, _HEADER)
    out = np.empty(nbytes, dtype=np.uint8)
    for j, start in enumerate(starts):
        bsize = min(blocksize, nbytes - j * blocksize)
        leftover = bsize < blocksize
        split = (not flags & _DONT_SPLIT and typesize <= _MAX_SPLITS and bsize // typesize >= _MIN_BUFFERSIZE
                 and not leftover)
        nsplits = typesize if split else 1
        neblock = bsize // nsplits
        pos = start
        parts: list[bytes | memoryview] = []
        for _ in range(nsplits):
            if pos < 0 or pos + 4 > cbytes:
                raise CorruptionError(f"blosc block {j} starts at {pos}, outside the frame's {cbytes} bytes")
            (clen,) = struct.unpack_from("<i", view, pos)
            pos += 4
            if clen < 0 or pos + clen > cbytes:
                raise CorruptionError(f"blosc block {j} declares a stream of {clen} bytes past the frame's end")
            stream = view[pos:pos + clen]
            parts.append(stream if clen == neblock else decompress(stream, neblock))
            pos += clen
        block = np.frombuffer(b"".join(parts), dtype=np.uint8)
        if block.size != nsplits * neblock or nsplits * neblock != bsize:
            raise CorruptionError(f"blosc block {j} decoded to {block.size} bytes, expected {bsize}")
        if flags & _DOSHUFFLE and typesize > 1:
            block = _unshuffle(block, typesize)
        elif flags & _DOBITSHUFFLE and (bsize // typesize) % 8 == 0:
            # blosc 1 bit-shuffles only blocks of whole groups of 8 elements (others stay as is)
            block = _bitunshuffle(block, typesize)
        out[j * blocksize:j * blocksize + bsize] = block
    return out.tobytes()
