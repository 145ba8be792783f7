"""numcodecs ``json2`` object codec (v2 ``|O`` arrays of JSON values), read with size limits.

The layout is a JSON list: the elements in C order, then the dtype string, then the shape.
Only object (``|O``) payloads are accepted; the dtype and shape in the data never choose
what is allocated (the chunk's own shape does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import Filter, register_filter
from zarr3.engine import json_text
from zarr3.errors import MetadataError

__all__ = ["Json2Filter"]

_KNOWN = (
    "encoding", "skipkeys", "ensure_ascii", "check_circular", "allow_nan",
    "sort_keys", "indent", "separators", "strict",
)  # fmt: skip


@register_filter
class Json2Filter(Filter):
    """``{"id": "json2", ...}``: encoder settings are kept and written back as they were."""

    codec_id = "json2"
    variable = True

    def __init__(self, settings: Mapping[str, Any] | None = None):
        self.settings = dict(settings or {})

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> Json2Filter:
        for key in config:
            if key != "id" and key not in _KNOWN:
                raise MetadataError(f"{field}.{key}", config[key], "unknown json2 setting")
        encoding = config.get("encoding", "utf-8")
        if str(encoding).lower().replace("-", "") not in ("utf8",):
            raise MetadataError(f"{field}.encoding", encoding, "only utf-8 json2 is supported")
        return cls({k: v for k, v in config.items() if k != "id"})

    def config(self) -> dict[str, Any]:
        return dict(self.settings)

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype("u1")

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int | None:
        return None

    def encode(self, arr: np.ndarray) -> np.ndarray:
        a = np.asarray(arr)
        items: list[Any] = np.atleast_1d(a).tolist()
        items.append("|O")
        items.append(list(a.shape))
        return np.frombuffer(json_text.dumps(items).encode("utf-8"), dtype=np.uint8)

    def decode(self, buf: Any) -> np.ndarray:
        raw = np.ascontiguousarray(np.asarray(buf)).reshape(-1).view(np.uint8).tobytes()
        try:
            items = json_text.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptionError(f"json2: invalid JSON chunk: {e}") from e
        if not isinstance(items, list) or len(items) < 2 or items[-2] not in ("|O", "O"):
            raise CorruptionError("json2: expected [items..., '|O', shape]")
        shape = items[-1]
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
            raise CorruptionError("json2: invalid shape")
        if not shape:  # 0-d: the single value
            out = np.empty(1, dtype=object)
            out[0] = items[0]
            return out
        flat: list[Any] = []
        _flatten(items[:-2], shape, flat)
        out = np.empty(len(flat), dtype=object)
        for i, v in enumerate(flat):
            out[i] = v
        return out


def _flatten(values: Any, shape: list[int], out: list[Any]) -> None:
    """Collect the elements of nested lists of exactly ``shape`` in C order."""
    if not isinstance(values, list) or len(values) != shape[0]:
        raise CorruptionError(f"json2: nested items do not match the shape {shape}")
    if len(shape) == 1:
        out.extend(values)
        return
    for v in values:
        _flatten(v, shape[1:], out)
