"""The v2 ``zlib`` compressor (RFC 1950 zlib stream), as numcodecs and TensorStore write it."""

from __future__ import annotations

import zlib
from typing import Any

from zarr3.codecs._deflate import check_inflatable, deflate_bound, inflate
from zarr3.codecs.base import Buffer, BytesBytesCodec, check_config, clamp, encoder_int
from zarr3.errors import MetadataError

__all__ = ["ZlibCodec"]


class ZlibCodec(BytesBytesCodec):
    """zlib compression; only exists as a v2 compressor (there is no v3 ``zlib`` codec)."""

    name = "zlib"

    def __init__(self, level: int = 1):
        self.level = encoder_int(level, "level")

    @classmethod
    def from_config(cls, config: Any, field: str) -> ZlibCodec:
        raise MetadataError(field.rsplit(".", 1)[0] + ".name", "zlib", "zlib is a zarr v2 compressor only")

    @classmethod
    def from_v2(cls, config: dict[str, Any], field: str) -> ZlibCodec:
        """Build from a v2 ``{"id": "zlib", "level": n}`` compressor."""
        cfg = check_config(config, ("id", "level"), field)
        return cls(encoder_int(cfg.get("level", 1), f"{field}.level"))

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object."""
        return {"id": "zlib", "level": self.level}

    def configuration(self) -> dict[str, Any]:
        return {"level": self.level}

    def encode(self, data: Buffer) -> Buffer:
        c = zlib.compressobj(clamp(self.level, -1, 9), zlib.DEFLATED, 15)
        return c.compress(data) + c.flush()

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        return inflate(data, 15, size, bound, "zlib")

    def check_decodable(self, data: Buffer, size: int | None) -> None:
        check_inflatable(data, size, "zlib")

    def max_encoded_size(self, decoded_size: int) -> int:
        return deflate_bound(decoded_size)
