"""The v2 ``lz4`` compressor in numcodecs' format: a little-endian u32 size, then an LZ4 block.

Needs the optional ``lz4`` package.  TensorStore does not support this compressor; it exists
for arrays written by zarr-python / numcodecs.
"""

from __future__ import annotations

import struct
from typing import Any

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import Buffer, BytesBytesCodec, check_config, clamp, encoder_int
from zarr3.errors import CodecUnavailableError, MetadataError

__all__ = ["Lz4Codec"]

#: No LZ4 block decodes to more than about 255 times its length (a match grows by at most 255
#: bytes per length byte).
MAX_RATIO = 256


def _lz4_block() -> Any:
    try:
        # optional codec library
        import lz4.block
    except ImportError as e:
        raise CodecUnavailableError("lz4", "lz4", "lz4") from e
    return lz4.block


class Lz4Codec(BytesBytesCodec):
    """LZ4 block compression with numcodecs' 4-byte size header; a zarr v2 compressor only."""

    name = "lz4"

    def __init__(self, acceleration: int = 1):
        self.acceleration = encoder_int(acceleration, "acceleration")

    @classmethod
    def from_config(cls, config: Any, field: str) -> Lz4Codec:
        raise MetadataError(field.rsplit(".", 1)[0] + ".name", "lz4", "lz4 is a zarr v2 compressor only")

    @classmethod
    def from_v2(cls, config: dict[str, Any], field: str) -> Lz4Codec:
        """Build from a v2 ``{"id": "lz4", "acceleration": n}`` compressor."""
        cfg = check_config(config, ("id", "acceleration"), field)
        return cls(encoder_int(cfg.get("acceleration", 1), f"{field}.acceleration"))

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object."""
        return {"acceleration": self.acceleration, "id": "lz4"}

    def configuration(self) -> dict[str, Any]:
        return {"acceleration": self.acceleration}

    def encode(self, data: Buffer) -> Buffer:
        acc = clamp(self.acceleration, 1, 1 << 16)
        return bytes(_lz4_block().compress(data, mode="fast", acceleration=acc, store_size=True))

    def check_decodable(self, data: Buffer, size: int | None) -> None:
        n = memoryview(data).nbytes
        if n < 4:
            raise CorruptionError("lz4 frame is shorter than its size header")
        (declared,) = struct.unpack_from("<i", data, 0)
        if size is not None and declared != size:
            raise CorruptionError(f"lz4 frame declares {declared} bytes, expected {size}")
        if declared > MAX_RATIO * n + 256:
            raise CorruptionError(f"{n} bytes of lz4 data cannot decompress to the {declared} bytes declared")

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        block = _lz4_block()
        if len(data) < 4:
            raise CorruptionError("lz4 frame is shorter than its size header")
        (declared,) = struct.unpack_from("<i", data, 0)
        limit = bound if size is None else size
        if declared < 0 or declared > limit or (size is not None and declared != size):
            raise CorruptionError(f"lz4 frame declares {declared} bytes, expected {limit}")
        try:
            out = block.decompress(data)
        except Exception as e:
            raise CorruptionError(f"lz4 decompression failed: {e}") from e
        if len(out) != declared:
            raise CorruptionError(f"lz4 data decompressed to {len(out)} bytes, expected {declared}")
        return bytes(out)

    def max_encoded_size(self, decoded_size: int) -> int:
        return decoded_size + decoded_size // 255 + 16 + 4
