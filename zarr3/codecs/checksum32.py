"""numcodecs' 32-bit checksum codecs ``crc32``, ``adler32`` and ``crc32c``: a little-endian
checksum of the payload at its ``start`` (crc32, adler32) or ``end`` (crc32c)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import crc32c as _crc32c

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import Buffer, BytesBytesCodec, check_config
from zarr3.errors import MetadataError

__all__ = ["Checksum32Codec", "CHECKSUMS"]

#: codec id -> (checksum function, default location)
CHECKSUMS: dict[str, tuple[Callable[[Any], int], str]] = {
    "crc32": (lambda b: zlib.crc32(b), "start"),
    "adler32": (lambda b: zlib.adler32(b), "start"),
    "crc32c": (lambda b: _crc32c.crc32c(b), "end"),
}


class Checksum32Codec(BytesBytesCodec):
    """A numcodecs checksum (``{"id": "crc32", "location": "start"}``)."""

    name = "checksum32"

    def __init__(self, codec_id: str, location: str | None = None):
        if codec_id not in CHECKSUMS:
            raise MetadataError("id", codec_id, f"expected one of {sorted(CHECKSUMS)}")
        self.codec_id = codec_id
        self.location = location or CHECKSUMS[codec_id][1]
        if self.location not in ("start", "end"):
            raise MetadataError("location", location, 'expected "start" or "end"')
        self._explicit = location is not None

    @classmethod
    def from_config(cls, config: Any, field: str) -> Checksum32Codec:  # pragma: no cover
        raise MetadataError(field, config, "numcodecs checksums are v2 compressors or numcodecs.* codecs")

    @classmethod
    def from_v2(cls, config: dict[str, Any], field: str) -> Checksum32Codec:
        """Build from ``{"id": "crc32"|"adler32"|"crc32c", "location": ...}``."""
        cfg = check_config(config, ("id", "location"), field)
        loc = cfg.get("location")
        if loc not in (None, "start", "end"):
            raise MetadataError(f"{field}.location", loc, 'expected "start" or "end"')
        return cls(str(cfg.get("id")), loc)

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object."""
        return {"id": self.codec_id, "location": self.location}

    def configuration(self) -> dict[str, Any]:
        return {"location": self.location}

    def verifies(self, data: Buffer | None) -> bool:
        """Always: decoding checks the stored checksum."""
        return True

    def encode(self, data: Buffer) -> Buffer:
        payload = bytes(data)
        tag = struct.pack("<I", CHECKSUMS[self.codec_id][0](payload) & 0xFFFFFFFF)
        return tag + payload if self.location == "start" else payload + tag

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        mv = memoryview(data).cast("B")
        if len(mv) < 4:
            raise CorruptionError(f"{self.codec_id}: chunk is shorter than its checksum")
        if self.location == "start":
            (stored,), payload = struct.unpack_from("<I", mv, 0), mv[4:]
        else:
            (stored,), payload = struct.unpack_from("<I", mv, len(mv) - 4), mv[:-4]
        if len(payload) > bound or (size is not None and len(payload) != size):
            raise CorruptionError(f"{self.codec_id}: payload of {len(payload)} bytes, expected {size or bound}")
        if CHECKSUMS[self.codec_id][0](payload) & 0xFFFFFFFF != stored:
            raise CorruptionError(f"{self.codec_id} checksum mismatch")
        return payload

    def encoded_size(self, decoded_size: int | None) -> int | None:
        return None if decoded_size is None else decoded_size + 4

    def max_encoded_size(self, decoded_size: int) -> int:
        return decoded_size + 4
