"""``vlen-utf8``: variable-length UTF-8 strings (v3 ``string`` arrays; v2 ``|O`` object codec)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import Filter, check_keys, register_filter
from zarr3.codecs._vlen import MAX_VLEN_CHUNK_NBYTES, pack_items, unpack_items
from zarr3.codecs.base import ArrayBytesCodec, Buffer, ChunkSpec, check_config
from zarr3.dtypes import STRING_DTYPE
from zarr3.errors import MetadataError

__all__ = ["VlenUtf8Codec", "VlenUtf8Filter", "encode_strings", "decode_strings"]


def encode_strings(arr: np.ndarray) -> bytes:
    """Encode an array of str (StringDType, object or ``U``) in C order."""
    items = []
    for x in np.asarray(arr).reshape(-1).tolist():
        if x is None:
            x = ""
        if not isinstance(x, str):
            raise TypeError(f"vlen-utf8 can only encode str, not {type(x).__name__}")
        items.append(x.encode("utf-8"))
    return pack_items(items)


def decode_strings(buf: Any, expected: int | None = None) -> np.ndarray:
    """Decode into a flat StringDType array."""
    try:
        items = [b.decode("utf-8") for b in unpack_items(buf, "vlen-utf8", expected)]
    except UnicodeDecodeError as e:
        raise CorruptionError(f"vlen-utf8: invalid UTF-8: {e}") from e
    return np.array(items, dtype=STRING_DTYPE)


@register_filter
class VlenUtf8Filter(Filter):
    """The v2 object codec ``{"id": "vlen-utf8"}`` (first entry of ``filters``)."""

    codec_id = "vlen-utf8"
    variable = True

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> VlenUtf8Filter:
        check_keys(config, (), field)
        return cls()

    def config(self) -> dict[str, Any]:
        return {}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype("u1")

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int | None:
        return None

    def encode(self, arr: np.ndarray) -> np.ndarray:
        return np.frombuffer(encode_strings(arr), dtype=np.uint8)

    def decode(self, buf: Any) -> np.ndarray:
        return decode_strings(buf)


class VlenUtf8Codec(ArrayBytesCodec):
    """The v3 array -> bytes codec ``vlen-utf8`` for ``string`` arrays."""

    name = "vlen-utf8"

    @classmethod
    def from_config(cls, config: Any, field: str) -> VlenUtf8Codec:
        check_config(config, (), field)
        return cls()

    def configuration(self) -> dict[str, Any] | None:
        return {}

    def resolve(self, spec: ChunkSpec, field: str) -> VlenUtf8Codec:
        if spec.dtype.kind not in ("string", "object"):
            raise MetadataError(f"{field}.name", self.name, f"needs a string data type, not {spec.dtype.name}")
        return self

    def max_encoded_size(self, spec: ChunkSpec) -> int:
        return MAX_VLEN_CHUNK_NBYTES

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer:
        return encode_strings(arr)

    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        out = decode_strings(data, spec.size).reshape(spec.shape)
        return out if out.dtype == spec.dtype.dtype else out.astype(spec.dtype.dtype)
