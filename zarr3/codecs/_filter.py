"""numcodecs-style filters: the common base of the v2 ``filters`` and v3 ``numcodecs.*`` codecs.

A filter works on a flat array exactly as numcodecs does: ``encode`` takes the chunk's
elements (flattened in memory order) and returns an array, ``decode`` takes the raw bytes of
the next stage (or an array whose bytes it re-reads as its encoded dtype) and returns the
decoded elements.  Every decode is linear in its input (no filter can expand data by more
than 8x, ``packbits``), and every size mismatch is a :class:`CorruptionError`.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.errors import MetadataError

__all__ = ["Filter", "FILTERS", "register_filter", "filter_dtype", "raw_view", "viewed_count", "check_keys"]

_DTYPE = re.compile(r"^[<>|=]?[biufcSU][0-9]{1,7}$")
#: A dtype by name, as numcodecs takes it through ``np.dtype(name)`` (zarr-python 3.1 writes
#: ``"int32"`` into ``numcodecs.delta`` etc.): a short lowercase word, maybe with digits.
_DTYPE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
#: Numeric kinds a dtype name may resolve to (``"object"``, ``"datetime64"``... may not).
_NAMED_KINDS = "biufc"


def filter_dtype(value: Any, field: str, *, allow_text: bool = False) -> np.dtype[Any]:
    """A dtype from a filter configuration: a NumPy dtype string (``"<i4"``, ``"|u1"``,
    ``"<U5"``...) or, as numcodecs accepts, a numeric dtype name (``"int32"``, ``"float64"``,
    ``"bool"``; native byte order, as ``np.dtype(name)`` gives)."""
    if allow_text and value in ("|O", "O", "object"):
        return np.dtype(object)
    if isinstance(value, str) and not _DTYPE.match(value) and _DTYPE_NAME.match(value):
        try:
            named = np.dtype(value)
        except TypeError:
            named = None
        if named is None or named.kind not in _NAMED_KINDS:
            raise MetadataError(field, value, "expected a NumPy dtype string such as '<i4' or a numeric dtype name")
        return named
    if not isinstance(value, str) or not _DTYPE.match(value):
        raise MetadataError(field, value, "expected a NumPy dtype string such as '<i4'")
    dt = np.dtype(value)
    if dt.kind in "SU" and not allow_text or dt.itemsize == 0 or dt.itemsize > 1 << 20:
        raise MetadataError(field, value, "unsupported dtype for this filter")
    return dt


def raw_view(buf: Any, dtype: np.dtype[Any], what: str) -> np.ndarray:
    """The bytes of ``buf`` (bytes or a contiguous array) re-read as a flat ``dtype`` array."""
    arr = np.asarray(buf)
    if arr.dtype == dtype:
        return np.ascontiguousarray(arr).reshape(-1)
    if arr.dtype.hasobject or arr.dtype.kind == "T":
        raise CorruptionError(f"{what}: expected bytes, got {arr.dtype} elements")
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    if raw.size % dtype.itemsize:
        raise CorruptionError(f"{what}: {raw.size} bytes is not a whole number of {dtype} elements")
    return raw.view(dtype)


def viewed_count(n: int, dtype: np.dtype[Any], view: np.dtype[Any]) -> int:
    """How many ``view`` elements the bytes of ``n`` elements of ``dtype`` hold: numcodecs'
    delta/fixedscaleoffset/quantize/astype read their input through their own ``dtype``, which
    may differ from the array's (a size that does not divide is caught as corrupt on decode)."""
    return n * dtype.itemsize // view.itemsize if dtype.itemsize != view.itemsize else n


def check_keys(config: Mapping[str, Any], allowed: tuple[str, ...], field: str) -> None:
    """Reject configuration members a filter does not know (``id`` is always allowed)."""
    for key in config:
        if key != "id" and key not in allowed:
            raise MetadataError(f"{field}.{key}", config[key], "unknown filter configuration member")


class Filter(abc.ABC):
    """One numcodecs filter.  ``codec_id`` is its numcodecs ``id``."""

    codec_id: ClassVar[str]
    #: whether ``encode``/``decode`` may run on a v3 chunk (array -> array) as well as in v2
    variable: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> Filter:
        """Build from a numcodecs configuration (``id`` included or not)."""

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """The numcodecs configuration without ``id``, as numcodecs writes it."""

    def to_v2(self) -> dict[str, Any]:
        """The v2 ``filters`` entry."""
        return {"id": self.codec_id, **self.config()}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        """Element dtype of the encoded array for input elements of ``dtype``."""
        return dtype

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int | None:
        """Number of encoded elements for ``n`` input elements (``None``: data dependent)."""
        return n

    @abc.abstractmethod
    def encode(self, arr: np.ndarray) -> np.ndarray:
        """Encode a flat array."""

    @abc.abstractmethod
    def decode(self, buf: Any) -> np.ndarray:
        """Decode bytes (or an array re-read as bytes) into a flat array."""

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_v2() == other.to_v2()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(repr(self.to_v2()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config()})"


#: Filter classes by numcodecs id.
FILTERS: dict[str, type[Filter]] = {}


def register_filter(cls: type[Filter]) -> type[Filter]:
    """Register a filter class under its ``codec_id`` (a decorator)."""
    FILTERS[cls.codec_id] = cls
    return cls
