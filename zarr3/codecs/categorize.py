"""numcodecs ``categorize`` filter: string labels stored as 1-based integer codes (0 = ``""``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr3.codecs._filter import Filter, check_keys, filter_dtype, raw_view, register_filter
from zarr3.errors import MetadataError

__all__ = ["CategorizeFilter"]

MAX_LABELS = 1 << 16


@register_filter
class CategorizeFilter(Filter):
    """``{"id": "categorize", "labels": [...], "dtype": "<U5" or "|O", "astype": "|u1"}``."""

    codec_id = "categorize"

    def __init__(self, labels: list[str], dtype: np.dtype[Any], astype: np.dtype[Any]):
        self.labels = list(labels)
        self.dtype = np.dtype(dtype)
        self.astype = np.dtype(astype)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> CategorizeFilter:
        check_keys(config, ("labels", "dtype", "astype"), field)
        labels = config.get("labels")
        if not isinstance(labels, list) or len(labels) > MAX_LABELS or not all(isinstance(x, str) for x in labels):
            raise MetadataError(f"{field}.labels", labels, f"expected a list of at most {MAX_LABELS} strings")
        dtype = filter_dtype(config.get("dtype"), f"{field}.dtype", allow_text=True)
        astype = filter_dtype(config.get("astype", "|u1"), f"{field}.astype")
        if astype.kind not in "iu":
            raise MetadataError(f"{field}.astype", config.get("astype"), "expected an integer dtype")
        return cls(labels, dtype, astype)

    def config(self) -> dict[str, Any]:
        return {"astype": self.astype.str, "dtype": self.dtype.str, "labels": self.labels}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return self.astype

    def encode(self, arr: np.ndarray) -> np.ndarray:
        a = np.asarray(arr).reshape(-1)
        if self.dtype.kind != "O":
            a = a.astype(self.dtype, copy=False)
        out = np.zeros(a.shape, dtype=self.astype)
        for i, label in enumerate(self.labels):
            out[a == label] = i + 1
        return out

    def decode(self, buf: Any) -> np.ndarray:
        enc = raw_view(buf, self.astype, "categorize")
        out = np.full(enc.shape, "", dtype=self.dtype)
        for i, label in enumerate(self.labels):
            out[enc == i + 1] = label
        return out
