"""numcodecs ``astype`` filter: elements stored as ``encode_dtype``, read back as ``decode_dtype``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr3.codecs._filter import Filter, check_keys, filter_dtype, raw_view, register_filter, viewed_count

__all__ = ["AsTypeFilter"]


@register_filter
class AsTypeFilter(Filter):
    """``{"id": "astype", "encode_dtype": "<f4", "decode_dtype": "<f8"}``."""

    codec_id = "astype"

    def __init__(self, encode_dtype: np.dtype[Any], decode_dtype: np.dtype[Any]):
        self.encode_dtype = np.dtype(encode_dtype)
        self.decode_dtype = np.dtype(decode_dtype)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> AsTypeFilter:
        check_keys(config, ("encode_dtype", "decode_dtype"), field)
        return cls(
            filter_dtype(config.get("encode_dtype"), f"{field}.encode_dtype"),
            filter_dtype(config.get("decode_dtype"), f"{field}.decode_dtype"),
        )

    def config(self) -> dict[str, Any]:
        return {"decode_dtype": self.decode_dtype.str, "encode_dtype": self.encode_dtype.str}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return self.encode_dtype

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int:
        return viewed_count(n, dtype, self.decode_dtype)

    def encode(self, arr: np.ndarray) -> np.ndarray:
        return raw_view(arr, self.decode_dtype, "astype").astype(self.encode_dtype)

    def decode(self, buf: Any) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return raw_view(buf, self.encode_dtype, "astype").astype(self.decode_dtype)
