"""A bounded decoder for the legacy msgpack ``checkpoint`` file (Orbax up to 0.5.x).

The file is one msgpack document: nested maps/arrays whose leaves are either the string
``PLACEHOLDER://<param name>`` (data stored by TensorStore) or an inline value.  Inline
values use Flax's extension types:

====  ===========================================================================
code  payload (itself msgpack)
====  ===========================================================================
1     numpy array: ``[shape, dtype_name, raw C-order bytes]``
2     Python complex: ``[real, imag]``
3     numpy scalar: same payload as code 1, 0-d
4     tuple: a msgpack array of values (which may use these extensions again)
====  ===========================================================================

Arrays larger than 1 GiB were split into ``{"__msgpack_chunked_array__": true, "shape":
{"0": d0, ...}, "chunks": {"0": flat_part, ...}}``.

Nothing here executes code from the file: no pickle, no object hooks.  Every length is
checked against the bytes actually present before anything is allocated, extension payloads
are decoded from memoryview slices of the one input buffer (never copied per level), and
nesting depth -- containers and extensions together -- is limited to :data:`MAX_DEPTH`, so a
hostile file raises :class:`CorruptionError` instead of exhausting memory or the stack.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.dtypes import dtype_from_name
from ocdbt_py.errors import CorruptionError, UnsupportedError

__all__ = ["unpack", "Placeholder", "PLACEHOLDER_PREFIXES", "MAX_DEPTH", "ExtValue"]

#: Leaf strings that stand for data stored outside the msgpack file.
PLACEHOLDER_PREFIXES = ("PLACEHOLDER://", "AGGREGATED://")

#: Deepest nesting accepted (maps, arrays and extension payloads each count one level; real
#: Flax checkpoints nest a few tens at most).
MAX_DEPTH = 100
_CHUNKED = "__msgpack_chunked_array__"


class Placeholder(str):
    """A ``PLACEHOLDER://name`` leaf; the ``str`` value is the param name."""


class ExtValue:
    """An extension value with an unknown type code (kept opaque)."""

    def __init__(self, code: int, data: bytes | memoryview):
        self.code = code
        self.data = bytes(data)

    def __repr__(self) -> str:
        return f"ExtValue({self.code}, {len(self.data)} bytes)"


def _dtype(name: Any) -> np.dtype:
    if isinstance(name, (bytes, bytearray, memoryview)):
        try:
            name = bytes(name).decode("ascii")
        except UnicodeDecodeError as e:
            raise CorruptionError(f"msgpack array has a non-ASCII dtype name {name!r}") from e
    if not isinstance(name, str):
        raise CorruptionError(f"msgpack array dtype name is {type(name).__name__}, not a string")

    try:
        dt = dtype_from_name(name)
    except (TypeError, ValueError) as e:
        raise UnsupportedError(f"msgpack array has unsupported dtype {name!r}") from e
    if dt.hasobject or dt.fields is not None:
        raise UnsupportedError(f"msgpack array has unsupported dtype {name!r}")
    return dt


def _ndarray(payload: memoryview, depth: int) -> np.ndarray:
    doc = _Decoder(payload, depth=depth, raw_bins=True).document()
    if not isinstance(doc, (list, tuple)) or len(doc) != 3:
        raise CorruptionError("msgpack ndarray payload is not [shape, dtype, bytes]")
    shape, name, buf = doc
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CorruptionError(f"msgpack ndarray has a bad shape {shape!r}")
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise CorruptionError("msgpack ndarray data is not binary")
    dt = _dtype(name)
    count = math.prod(shape)
    if count * dt.itemsize != len(buf):
        raise CorruptionError(
            f"msgpack ndarray of shape {tuple(shape)} and dtype {dt} needs {count * dt.itemsize} "
            f"bytes, found {len(buf)}"
        )
    return np.frombuffer(buf, dtype=dt).reshape(tuple(shape)).copy()  # the one copy of the data


class _Decoder:
    def __init__(self, data: bytes | memoryview, *, depth: int = 0, raw_bins: bool = False):
        self.data = memoryview(data)
        self.pos = 0
        self.base_depth = depth
        #: binary values come back as memoryview slices (an ndarray payload: copied once, later)
        self.raw_bins = raw_bins

    def _take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise CorruptionError(
                f"msgpack data truncated: need {n} bytes at offset {self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def _uint(self, n: int) -> int:
        return int.from_bytes(self._take(n), "big")

    def _check_count(self, n: int, per_item: int) -> None:
        # Every element needs at least one byte: refuse counts the data cannot back.
        if n * per_item > len(self.data) - self.pos:
            raise CorruptionError(f"msgpack container claims {n} elements at offset {self.pos}: truncated")

    def document(self) -> Any:
        value = self.value(self.base_depth)
        if self.pos != len(self.data):
            raise CorruptionError(f"msgpack data has {len(self.data) - self.pos} trailing bytes")
        return value

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CorruptionError(f"msgpack nesting deeper than {MAX_DEPTH}")
        b = self._take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self._map(b & 0x0F, depth)
        if 0x90 <= b <= 0x9F:
            return self._array(b & 0x0F, depth)
        if 0xA0 <= b <= 0xBF:
            return self._str(b & 0x1F)
        if b == 0xC0:
            return None
        if b == 0xC2:
            return False
        if b == 0xC3:
            return True
        if b in (0xC4, 0xC5, 0xC6):
            n = self._uint(1 << (b - 0xC4))
            raw = self._take(n)
            return raw if self.raw_bins else bytes(raw)
        if b in (0xC7, 0xC8, 0xC9):
            n = self._uint(1 << (b - 0xC7))
            code = struct.unpack(">b", self._take(1))[0]
            return self._ext(code, self._take(n), depth)
        if b == 0xCA:
            return struct.unpack(">f", self._take(4))[0]
        if b == 0xCB:
            return struct.unpack(">d", self._take(8))[0]
        if 0xCC <= b <= 0xCF:
            return self._uint(1 << (b - 0xCC))
        if 0xD0 <= b <= 0xD3:
            n = 1 << (b - 0xD0)
            return int.from_bytes(self._take(n), "big", signed=True)
        if 0xD4 <= b <= 0xD8:
            n = 1 << (b - 0xD4)
            code = struct.unpack(">b", self._take(1))[0]
            return self._ext(code, self._take(n), depth)
        if 0xD9 <= b <= 0xDB:
            return self._str(self._uint(1 << (b - 0xD9)))
        if b in (0xDC, 0xDD):
            return self._array(self._uint(2 if b == 0xDC else 4), depth)
        if b in (0xDE, 0xDF):
            return self._map(self._uint(2 if b == 0xDE else 4), depth)
        raise CorruptionError(f"invalid msgpack type byte 0x{b:02x} at offset {self.pos - 1}")

    def _str(self, n: int) -> str:
        raw = self._take(n)
        try:
            s = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptionError(f"msgpack string is not UTF-8 at offset {self.pos - n}") from e
        for prefix in PLACEHOLDER_PREFIXES:
            if s.startswith(prefix):
                return Placeholder(s[len(prefix):])
        return s

    def _array(self, n: int, depth: int) -> list[Any]:
        self._check_count(n, 1)
        return [self.value(depth + 1) for _ in range(n)]

    def _map(self, n: int, depth: int) -> dict[Any, Any]:
        self._check_count(n, 2)
        out: dict[Any, Any] = {}
        for _ in range(n):
            k = self.value(depth + 1)
            if isinstance(k, (bytes, memoryview)):
                k = bytes(k).decode("utf-8", "replace")
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise CorruptionError(f"msgpack map key of type {type(k).__name__} is not supported")
            if isinstance(k, Placeholder):
                k = str(k)
            out[k] = self.value(depth + 1)
        if out.get(_CHUNKED) is True:
            return _unchunk(out)  # type: ignore[return-value]
        return out

    def _ext(self, code: int, data: memoryview, depth: int) -> Any:
        if code in (1, 3):
            arr = _ndarray(data, depth + 1)
            return arr if code == 1 else arr[()]
        if code == 2:
            pair = _Decoder(data, depth=depth + 1).document()
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
            ):
                raise CorruptionError("msgpack complex payload is not [real, imag]")
            return complex(pair[0], pair[1])
        if code == 4:
            items = _Decoder(data, depth=depth + 1).document()
            if not isinstance(items, list):
                raise CorruptionError("msgpack tuple payload is not an array")
            return tuple(items)
        return ExtValue(code, data)


def _index_dict(d: Any, what: str) -> list[Any]:
    if not isinstance(d, dict):
        raise CorruptionError(f"chunked msgpack array: {what} is not a map")
    try:
        return [d[str(i)] for i in range(len(d))]
    except KeyError as e:
        raise CorruptionError(f"chunked msgpack array: {what} keys are not 0..n-1") from e


def _unchunk(d: dict[Any, Any]) -> np.ndarray:
    shape = _index_dict(d.get("shape"), "shape")
    chunks = _index_dict(d.get("chunks"), "chunks")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise CorruptionError(f"chunked msgpack array has a bad shape {shape!r}")
    if not chunks or not all(isinstance(c, np.ndarray) and c.ndim == 1 for c in chunks):
        raise CorruptionError("chunked msgpack array chunks are not 1-D arrays")
    if len({c.dtype for c in chunks}) != 1:
        raise CorruptionError("chunked msgpack array chunks disagree on dtype")
    flat = np.concatenate(chunks)
    if flat.size != math.prod(shape):
        raise CorruptionError(f"chunked msgpack array holds {flat.size} elements, shape {tuple(shape)}")
    return flat.reshape(tuple(shape))


def unpack(data: bytes) -> Any:
    """Decode a legacy Orbax msgpack ``checkpoint`` file.

    Placeholder leaves come back as :class:`Placeholder` (a ``str`` holding the param name);
    numpy arrays and scalars, complex numbers and tuples are rebuilt from their extension
    types; anything malformed raises :class:`CorruptionError`.
    """
    try:
        return _Decoder(data).document()
    except RecursionError as e:  # a deep stack at the call site; MAX_DEPTH normally stops first
        raise CorruptionError(f"msgpack nesting too deep for the stack (limit {MAX_DEPTH})") from e
