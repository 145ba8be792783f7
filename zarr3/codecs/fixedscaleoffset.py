"""numcodecs ``fixedscaleoffset`` filter: ``round((x - offset) * scale)`` stored as ``astype``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr3.codecs._filter import Filter, check_keys, filter_dtype, raw_view, register_filter, viewed_count
from zarr3.errors import MetadataError

__all__ = ["FixedScaleOffsetFilter"]


def _number(value: Any, field: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MetadataError(field, value, "expected a number")
    return value


@register_filter
class FixedScaleOffsetFilter(Filter):
    """``{"id": "fixedscaleoffset", "scale": 10, "offset": 0, "dtype": "<f8", "astype": "<i4"}``."""

    codec_id = "fixedscaleoffset"

    def __init__(self, offset: float, scale: float, dtype: np.dtype[Any], astype: np.dtype[Any] | None = None):
        self.offset = offset
        self.scale = scale
        self.dtype = np.dtype(dtype)
        self.astype = self.dtype if astype is None else np.dtype(astype)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> FixedScaleOffsetFilter:
        check_keys(config, ("offset", "scale", "dtype", "astype"), field)
        scale = _number(config.get("scale", 1), f"{field}.scale")
        if scale == 0:
            raise MetadataError(f"{field}.scale", scale, "scale must not be 0")
        astype = config.get("astype")
        return cls(
            _number(config.get("offset", 0), f"{field}.offset"),
            scale,
            filter_dtype(config.get("dtype"), f"{field}.dtype"),
            None if astype is None else filter_dtype(astype, f"{field}.astype"),
        )

    def config(self) -> dict[str, Any]:
        return {"astype": self.astype.str, "dtype": self.dtype.str, "offset": self.offset, "scale": self.scale}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return self.astype

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int:
        return viewed_count(n, dtype, self.dtype)

    def encode(self, arr: np.ndarray) -> np.ndarray:
        x = raw_view(arr, self.dtype, "fixedscaleoffset")
        return np.around((x - self.offset) * self.scale).astype(self.astype, copy=False)

    def decode(self, buf: Any) -> np.ndarray:
        enc = raw_view(buf, self.astype, "fixedscaleoffset")
        with np.errstate(over="ignore", invalid="ignore"):
            return ((enc / self.scale) + self.offset).astype(self.dtype, copy=False)
