"""numcodecs ``packbits`` filter: booleans packed 8 to a byte after a padding-count byte."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import Filter, check_keys, raw_view, register_filter

__all__ = ["PackBitsFilter"]


@register_filter
class PackBitsFilter(Filter):
    """``{"id": "packbits"}`` for bool arrays."""

    codec_id = "packbits"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> PackBitsFilter:
        check_keys(config, (), field)
        return cls()

    def config(self) -> dict[str, Any]:
        return {}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype("u1")

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int:
        return 1 + -(-n // 8)

    def encode(self, arr: np.ndarray) -> np.ndarray:
        bits = raw_view(arr, np.dtype(bool), "packbits")
        out = np.empty(1 + -(-bits.size // 8), dtype=np.uint8)
        out[0] = -bits.size % 8
        out[1:] = np.packbits(bits)
        return out

    def decode(self, buf: Any) -> np.ndarray:
        enc = raw_view(buf, np.dtype("u1"), "packbits")
        if enc.size < 1 or enc[0] > 7 or (enc.size == 1 and enc[0]):
            raise CorruptionError("packbits: invalid padding header")
        bits = np.unpackbits(enc[1:])
        pad = int(enc[0])
        return (bits[: bits.size - pad] if pad else bits).view(bool)
