"""``vlen-bytes``: variable-length byte strings (v3 ``variable_length_bytes``; v2 ``|O``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from zarr3.codecs._filter import register_filter
from zarr3.codecs._vlen import VlenCodec, VlenFilter, pack_items, unpack_items

__all__ = ["VlenBytesCodec", "VlenBytesFilter", "encode_bytes_items", "decode_bytes_items"]


def encode_bytes_items(arr: np.ndarray) -> bytes:
    """Encode an object array of bytes in C order (``None`` as empty)."""
    items = []
    for x in np.asarray(arr).reshape(-1).tolist():
        if x is None:
            x = b""
        if isinstance(x, str):
            x = x.encode("utf-8")
        if not isinstance(x, (bytes, bytearray, memoryview)):
            raise TypeError(f"vlen-bytes can only encode bytes, not {type(x).__name__}")
        items.append(bytes(x))
    return pack_items(items)


def decode_bytes_items(buf: Any, expected: int | None = None) -> np.ndarray:
    """Decode into a flat object array of bytes."""
    items = unpack_items(buf, "vlen-bytes", expected)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


@register_filter
class VlenBytesFilter(VlenFilter):
    """The v2 object codec ``{"id": "vlen-bytes"}`` (first entry of ``filters``)."""

    codec_id = "vlen-bytes"
    encode_items = staticmethod(encode_bytes_items)
    decode_items = staticmethod(decode_bytes_items)


class VlenBytesCodec(VlenCodec):
    """The v3 array -> bytes codec ``vlen-bytes`` for bytes arrays."""

    name = "vlen-bytes"
    kinds = ('vbytes', 'object')
    kind_text = "bytes"
    encode_items = staticmethod(encode_bytes_items)
    decode_items = staticmethod(decode_bytes_items)
