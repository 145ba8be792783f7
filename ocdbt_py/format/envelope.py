"""The envelope shared by manifests, version-tree nodes and B+tree nodes.

Layout: magic (uint32 big-endian), total length (uint64 LE), format version (varint, 0),
compression format (varint: 0 raw, 1 zstd), payload, CRC-32C (uint32 LE) of everything before it.
"""

from __future__ import annotations

import struct

import crc32c as _crc
import zstandard

from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.reader import Reader, put_varint
from ocdbt_py.format.zstd_frame import decompress_bounded

__all__ = [
    "MANIFEST_MAGIC",
    "VERSION_NODE_MAGIC",
    "BTREE_NODE_MAGIC",
    "decode_envelope",
    "encode_envelope",
    "crc32c",
]

MANIFEST_MAGIC = 0x0CDB3A2A
VERSION_NODE_MAGIC = 0x0CDB1234
BTREE_NODE_MAGIC = 0x0CDB20DE

_NAMES = {MANIFEST_MAGIC: "manifest", VERSION_NODE_MAGIC: "version tree node", BTREE_NODE_MAGIC: "b+tree node"}
_MAGIC = struct.Struct(">I")
_LENGTH = struct.Struct("<Q")
_MIN_SIZE = 16


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``."""

    return int(_crc.crc32c(data, value))


def decode_envelope(
    data: bytes | memoryview,
    magic: int,
    *,
    max_body: int,
    path: str | None = None,
    base: int = 0,
) -> bytes | memoryview:
    """Check the envelope of ``data`` and return its (decompressed) body.

    Checks, in order: size, magic, length, version, compression id, CRC-32C; a zstd payload
    must be exactly one frame decompressing to at most ``max_body`` bytes.  ``path`` and
    ``base`` locate ``data`` for error messages.
    """
    what = _NAMES.get(magic, "object")
    n = len(data)
    if n < _MIN_SIZE:
        raise CorruptionError(f"{what} is truncated: {n} bytes, need at least {_MIN_SIZE}", path=path, offset=base)
    (got_magic,) = _MAGIC.unpack_from(data, 0)
    (length,) = _LENGTH.unpack_from(data, 4)
    if got_magic != magic:
        raise CorruptionError(
            f"bad {what} magic {got_magic:#010x}, expected {magic:#010x}", path=path, offset=base
        )
    if length != n:
        raise CorruptionError(
            f"{what} length field says {length} bytes but the object has {n}", path=path, offset=base + 4
        )
    stored_crc = int.from_bytes(bytes(data[n - 4 : n]), "little")
    view = memoryview(data)
    actual_crc = crc32c(view[: n - 4])
    r = Reader(view[: n - 4], path=path, base=base)
    r.pos = 12
    version = r.varint32("format version")
    if version != 0:
        raise CorruptionError(f"unsupported {what} format version {version}", path=path, offset=base + 12)
    comp_pos = r.pos
    compression = r.varint32("compression format")
    if compression not in (0, 1):
        raise CorruptionError(f"unknown {what} compression format {compression}", path=path, offset=base + comp_pos)
    if actual_crc != stored_crc:
        raise CorruptionError(
            f"{what} CRC-32C mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x}",
            path=path,
            offset=base + n - 4,
        )
    payload = view[r.pos : n - 4]
    if compression == 0:
        if len(payload) > max_body:
            raise CorruptionError(
                f"{what} body of {len(payload)} bytes exceeds the limit {max_body}", path=path, offset=base
            )
        return payload
    return decompress_bounded(payload, max_body, path=path, base=base + r.pos)


def encode_envelope(magic: int, body: bytes | bytearray | memoryview, zstd_level: int | None) -> bytes:
    """Wrap ``body`` in an envelope; ``zstd_level=None`` stores it raw.

    zstd framing follows TensorStore (riegeli): bodies of at most 4096 bytes are compressed
    in one shot (frame with content size), larger ones are streamed (no content size), which
    reproduces TensorStore's bytes exactly with the same libzstd.
    """
    out = bytearray(12)
    put_varint(out, 0)
    if zstd_level is None:
        put_varint(out, 0)
        out += body
    else:
        put_varint(out, 1)
        cctx = zstandard.ZstdCompressor(level=zstd_level)
        if len(body) <= 4096:
            out += cctx.compress(bytes(body))
        else:
            cobj = cctx.compressobj()
            out += cobj.compress(bytes(body))
            out += cobj.flush()
    total = len(out) + 4
    _MAGIC.pack_into(out, 0, magic)
    _LENGTH.pack_into(out, 4, total)
    out += crc32c(out).to_bytes(4, "little")
    return bytes(out)
