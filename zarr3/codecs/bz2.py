"""The v2 ``bz2`` compressor (TensorStore's ``zarr`` driver and numcodecs both know it)."""

from __future__ import annotations

import bz2 as _bz2
from typing import Any

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import Buffer, BytesBytesCodec, check_config, clamp, encoder_int
from zarr3.errors import MetadataError

__all__ = ["Bz2Codec"]


class Bz2Codec(BytesBytesCodec):
    """bzip2 compression (``level`` 1-9); a zarr v2 compressor only."""

    name = "bz2"

    def __init__(self, level: int = 1):
        self.level = encoder_int(level, "level")

    @classmethod
    def from_config(cls, config: Any, field: str) -> Bz2Codec:
        raise MetadataError(field.rsplit(".", 1)[0] + ".name", "bz2", "bz2 is a zarr v2 compressor only")

    @classmethod
    def from_v2(cls, config: dict[str, Any], field: str) -> Bz2Codec:
        """Build from a v2 ``{"id": "bz2", "level": n}`` compressor."""
        cfg = check_config(config, ("id", "level"), field)
        return cls(encoder_int(cfg.get("level", 1), f"{field}.level"))

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object."""
        return {"id": "bz2", "level": self.level}

    def configuration(self) -> dict[str, Any]:
        return {"level": self.level}

    def encode(self, data: Buffer) -> Buffer:
        return _bz2.compress(data, clamp(self.level, 1, 9))

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        limit = bound if size is None else size
        d = _bz2.BZ2Decompressor()
        try:
            out = d.decompress(data, limit + 1)
        except (OSError, ValueError) as e:
            raise CorruptionError(f"bz2 decompression failed: {e}") from e
        if len(out) > limit or (not d.eof and d.needs_input is False):
            raise CorruptionError(f"bz2 data decompresses to more than {limit} bytes")
        if not d.eof:
            raise CorruptionError("bz2 stream is truncated")
        if d.unused_data:
            raise CorruptionError(f"bz2 stream has {len(d.unused_data)} trailing bytes")
        if size is not None and len(out) != size:
            raise CorruptionError(f"bz2 data decompressed to {len(out)} bytes, expected {size}")
        return out

    def max_encoded_size(self, decoded_size: int) -> int:
        return decoded_size + decoded_size // 100 + 600
