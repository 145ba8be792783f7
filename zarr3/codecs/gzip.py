"""The ``gzip`` bytes -> bytes codec (RFC 1952; also the v2 ``gzip`` compressor).

Output matches TensorStore's byte for byte: zlib's gzip wrapper with mtime 0.  Reading also
accepts a zlib-wrapped stream, as zlib's automatic header detection does.
"""

from __future__ import annotations

import zlib
from typing import Any

from zarr3.codecs._deflate import check_inflatable, deflate_bound, inflate
from zarr3.codecs.base import Buffer, BytesBytesCodec, check_config, clamp, encoder_int

__all__ = ["GzipCodec"]


def _level(value: Any, field: str) -> int:
    # encoder-only: -1 is zlib's default level, others are clamped when encoding
    return encoder_int(value, field)


class GzipCodec(BytesBytesCodec):
    """gzip compression (``level`` 0-9, default 6)."""

    name = "gzip"

    def __init__(self, level: int = 6):
        self.level = _level(level, "level")

    @classmethod
    def from_config(cls, config: Any, field: str) -> GzipCodec:
        cfg = check_config(config, ("level",), field)
        return cls(_level(cfg.get("level", 6), f"{field}.level"))

    @classmethod
    def from_v2(cls, config: dict[str, Any], field: str) -> GzipCodec:
        """Build from a v2 ``{"id": "gzip", "level": n}`` compressor."""
        cfg = check_config(config, ("id", "level"), field)
        return cls(_level(cfg.get("level", 1), f"{field}.level"))

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object."""
        return {"id": "gzip", "level": self.level}

    def configuration(self) -> dict[str, Any]:
        return {"level": self.level}

    def encode(self, data: Buffer) -> Buffer:
        c = zlib.compressobj(clamp(self.level, -1, 9), zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        return inflate(data, 47, size, bound, "gzip")

    def check_decodable(self, data: Buffer, size: int | None) -> None:
        check_inflatable(data, size, "gzip")

    def max_encoded_size(self, decoded_size: int) -> int:
        return deflate_bound(decoded_size)
