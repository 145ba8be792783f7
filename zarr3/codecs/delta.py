"""numcodecs ``delta`` filter: first element, then differences (optionally in ``astype``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr3.codecs._filter import Filter, check_keys, filter_dtype, raw_view, register_filter, viewed_count

__all__ = ["DeltaFilter"]


@register_filter
class DeltaFilter(Filter):
    """``{"id": "delta", "dtype": "<i4", "astype": "<i2"}``."""

    codec_id = "delta"

    def __init__(self, dtype: np.dtype[Any], astype: np.dtype[Any] | None = None):
        self.dtype = np.dtype(dtype)
        self.astype = self.dtype if astype is None else np.dtype(astype)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> DeltaFilter:
        check_keys(config, ("dtype", "astype"), field)
        dtype = filter_dtype(config.get("dtype"), f"{field}.dtype")
        astype = config.get("astype")
        return cls(dtype, None if astype is None else filter_dtype(astype, f"{field}.astype"))

    def config(self) -> dict[str, Any]:
        return {"astype": self.astype.str, "dtype": self.dtype.str}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return self.astype

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int:
        return viewed_count(n, dtype, self.dtype)

    def encode(self, arr: np.ndarray) -> np.ndarray:
        x = raw_view(arr, self.dtype, "delta")
        out = np.empty(x.shape, dtype=self.astype)
        if x.size:
            out[0] = x[0]
            out[1:] = np.diff(x)
        return out

    def decode(self, buf: Any) -> np.ndarray:
        enc = raw_view(buf, self.astype, "delta")
        out = np.empty(enc.shape, dtype=self.dtype)
        np.cumsum(enc, out=out)
        return out
