"""``vlen-utf8``: variable-length UTF-8 strings (v3 ``string`` arrays; v2 ``|O`` object codec)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import register_filter
from zarr3.codecs._vlen import VlenCodec, VlenFilter, pack_items, unpack_items
from zarr3.dtypes import STRING_DTYPE

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
class VlenUtf8Filter(VlenFilter):
    """The v2 object codec ``{"id": "vlen-utf8"}`` (first entry of ``filters``)."""

    codec_id = "vlen-utf8"
    encode_items = staticmethod(encode_strings)
    decode_items = staticmethod(decode_strings)


class VlenUtf8Codec(VlenCodec):
    """The v3 array -> bytes codec ``vlen-utf8`` for string arrays."""

    name = "vlen-utf8"
    kinds = ('string', 'object')
    kind_text = "string"
    encode_items = staticmethod(encode_strings)
    decode_items = staticmethod(decode_strings)
