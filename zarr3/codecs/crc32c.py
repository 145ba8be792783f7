"""The ``crc32c`` bytes -> bytes codec: appends the little-endian CRC-32C of the data.

Decoding verifies the checksum; a mismatch is a :class:`~ocdbt_py.errors.CorruptionError`.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c as _crc32c

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import Buffer, BytesBytesCodec, as_uint8, check_config

__all__ = ["Crc32cCodec", "crc32c"]


def crc32c(data: Buffer) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    return int(_crc32c.crc32c(data))


class Crc32cCodec(BytesBytesCodec):
    """Append and verify a CRC-32C checksum."""

    name = "crc32c"

    @classmethod
    def from_config(cls, config: Any, field: str) -> Crc32cCodec:
        check_config(config, (), field)
        return cls()

    def configuration(self) -> None:
        return None

    def verifies(self, data: Buffer | None) -> bool:
        """Always: decoding checks the trailing CRC-32C."""
        return True

    def encode(self, data: Buffer) -> Buffer:
        return bytes(data) + struct.pack("<I", crc32c(data))

    def _verify(self, data: Buffer) -> memoryview:
        mv = as_uint8(data)
        if len(mv) < 4:
            raise CorruptionError(f"crc32c: {len(mv)} bytes is too short for a checksum")
        body = mv[:-4]
        (stored,) = struct.unpack("<I", mv[-4:])
        actual = crc32c(body)
        if stored != actual:
            raise CorruptionError(f"crc32c checksum mismatch: stored {stored:#010x}, computed {actual:#010x}")
        return body

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        body = self._verify(data)
        limit = bound if size is None else size
        if len(body) > limit or (size is not None and len(body) != size):
            raise CorruptionError(f"crc32c: payload of {len(body)} bytes, expected {limit}")
        return body

    def decode_into(self, data: Buffer, out: memoryview) -> None:
        body = self.decode(data, len(out), len(out))
        out[:] = body

    def encoded_size(self, decoded_size: int | None) -> int | None:
        return None if decoded_size is None else decoded_size + 4

    def max_encoded_size(self, decoded_size: int) -> int:
        return decoded_size + 4
