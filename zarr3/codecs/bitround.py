"""numcodecs ``bitround`` filter: float mantissas rounded to ``keepbits`` bits (decode is a no-op)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr3.codecs._filter import Filter, check_keys, register_filter
from zarr3.errors import MetadataError

__all__ = ["BitRoundFilter"]

_MANTISSA = {2: 10, 4: 23, 8: 52}


@register_filter
class BitRoundFilter(Filter):
    """``{"id": "bitround", "keepbits": 10}``: the stored values are ordinary floats."""

    codec_id = "bitround"

    def __init__(self, keepbits: int):
        self.keepbits = keepbits

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> BitRoundFilter:
        check_keys(config, ("keepbits",), field)
        keep = config.get("keepbits")
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
            raise MetadataError(f"{field}.keepbits", keep, "expected a non-negative integer")
        return cls(keep)

    def config(self) -> dict[str, Any]:
        return {"keepbits": self.keepbits}

    def encode(self, arr: np.ndarray) -> np.ndarray:
        a = np.asarray(arr)
        if a.dtype.kind != "f" or a.dtype.itemsize not in _MANTISSA:
            raise MetadataError("filters", self.to_v2(), f"bitround needs float16/32/64 data, not {a.dtype}")
        bits = _MANTISSA[a.dtype.itemsize]
        if self.keepbits > bits:
            raise MetadataError("filters", self.to_v2(), f"keepbits exceeds the {bits} mantissa bits of {a.dtype}")
        if self.keepbits == bits:
            return a
        ints = a.copy().view(a.dtype.str.replace("f", "i"))
        drop = bits - self.keepbits
        mask = (np.array(-1, ints.dtype) >> drop) << drop
        ints += ((ints >> drop) & 1) + ((1 << (drop - 1)) - 1)
        ints &= mask
        return ints.view(a.dtype)

    def decode(self, buf: Any) -> np.ndarray:
        return np.asarray(buf).reshape(-1)
