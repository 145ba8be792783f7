"""numcodecs ``quantize`` filter: floats rounded to a power-of-two step of ``10**-digits``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr3.codecs._filter import Filter, check_keys, filter_dtype, raw_view, register_filter, viewed_count
from zarr3.errors import MetadataError

__all__ = ["QuantizeFilter"]


@register_filter
class QuantizeFilter(Filter):
    """``{"id": "quantize", "digits": 2, "dtype": "<f8", "astype": "<f4"}`` (lossy; decode casts)."""

    codec_id = "quantize"

    def __init__(self, digits: int, dtype: np.dtype[Any], astype: np.dtype[Any] | None = None):
        self.digits = digits
        self.dtype = np.dtype(dtype)
        self.astype = self.dtype if astype is None else np.dtype(astype)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> QuantizeFilter:
        check_keys(config, ("digits", "dtype", "astype"), field)
        digits = config.get("digits")
        if not isinstance(digits, int) or isinstance(digits, bool) or not -300 <= digits <= 300:
            raise MetadataError(f"{field}.digits", digits, "expected an integer")
        dtype = filter_dtype(config.get("dtype"), f"{field}.dtype")
        astype = config.get("astype")
        return cls(digits, dtype, None if astype is None else filter_dtype(astype, f"{field}.astype"))

    def config(self) -> dict[str, Any]:
        return {"astype": self.astype.str, "digits": self.digits, "dtype": self.dtype.str}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return self.astype

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int:
        return viewed_count(n, dtype, self.dtype)

    def encode(self, arr: np.ndarray) -> np.ndarray:
        x = raw_view(arr, self.dtype, "quantize")
        exp = math.log10(10.0**-self.digits)
        exp = math.floor(exp) if exp < 0 else math.ceil(exp)
        scale = 2.0 ** math.ceil(math.log2(10.0**-exp))
        return (np.around(scale * x) / scale).astype(self.astype, copy=False)

    def decode(self, buf: Any) -> np.ndarray:
        return raw_view(buf, self.astype, "quantize").astype(self.dtype, copy=False)
