"""A bounds-checked cursor over a byte buffer, and the primitive writers.

Every decoder in :mod:`ocdbt_py.format` reads through :class:`Reader`, so truncation and
out-of-range values become :class:`~ocdbt_py.errors.CorruptionError` naming the file and offset.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from ocdbt_py.errors import CorruptionError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Reader", "put_varint", "varint_size"]

_U64 = struct.Struct("<Q")
#: columns at least this long are decoded with NumPy when they hold multi-byte varints
_VECTOR_MIN = 128
_I32 = struct.Struct("<i")


class Reader:
    """Sequential reader of OCDBT primitives over ``data[pos:end]``.

    ``base`` is added to positions in error messages (the offset of ``data`` within its file).
    """

    __slots__ = ("data", "pos", "end", "path", "base")

    def __init__(self, data: bytes | memoryview, *, path: str | None = None, base: int = 0):
        self.data = data
        self.pos = 0
        self.end = len(data)
        self.path = path
        self.base = base

    def error(self, message: str, pos: int | None = None) -> CorruptionError:
        """Build a :class:`CorruptionError` at ``pos`` (default: the cursor)."""
        return CorruptionError(message, path=self.path, offset=self.base + (self.pos if pos is None else pos))

    def remaining(self) -> int:
        """Bytes left to read."""
        return self.end - self.pos

    def varint(self, max_value: int = (1 << 64) - 1, what: str = "varint") -> int:
        """Read an unsigned LEB128 varint (over-long encodings accepted) up to ``max_value``."""
        data = self.data
        pos = self.pos
        end = self.end
        if pos < end:
            b = data[pos]
            if b < 0x80:
                self.pos = pos + 1
                if b > max_value:
                    raise self.error(f"{what} {b} exceeds {max_value}", pos)
                return b
        result = 0
        shift = 0
        start = pos
        while True:
            if pos >= end:
                raise self.error(f"truncated {what}", start)
            b = data[pos]
            pos += 1
            if shift == 63 and b > 1:
                raise self.error(f"{what} overflows 64 bits", start)
            result |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise self.error(f"{what} is longer than 10 bytes", start)
        self.pos = pos
        if result > max_value:
            raise self.error(f"{what} {result} exceeds {max_value}", start)
        return result

    def varint32(self, what: str = "varint") -> int:
        """Read a varint that must fit in 32 bits."""
        return self.varint(0xFFFFFFFF, what)

    def byte(self, what: str = "byte") -> int:
        """Read one raw byte."""
        if self.pos >= self.end:
            raise self.error(f"truncated {what}")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def u64le(self, what: str = "uint64") -> int:
        """Read a little-endian uint64."""
        if self.end - self.pos < 8:
            raise self.error(f"truncated {what}")
        (v,) = _U64.unpack_from(self.data, self.pos)
        self.pos += 8
        return int(v)

    def i32le(self, what: str = "int32") -> int:
        """Read a little-endian int32."""
        if self.end - self.pos < 4:
            raise self.error(f"truncated {what}")
        (v,) = _I32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(v)

    def take(self, n: int, what: str = "bytes") -> bytes:
        """Read ``n`` raw bytes."""
        if n < 0 or self.end - self.pos < n:
            raise self.error(f"truncated {what}: need {n} bytes, have {self.end - self.pos}")
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def varint_column(self, n: int, max_value: int = (1 << 64) - 1, what: str = "varint") -> list[int]:
        """Read ``n`` consecutive varints.

        Fast path: when the next ``n`` bytes all lack the continuation bit, they are the values.
        """
        if n == 0:
            return []
        pos = self.pos
        if self.end - pos >= n:
            chunk = bytes(self.data[pos : pos + n])
            top = max(chunk)
            if top < 0x80:
                if top > max_value:
                    return [self.varint(max_value, what) for _ in range(n)]
                self.pos = pos + n
                return list(chunk)
        if n >= _VECTOR_MIN:
            values = self._varint_column_numpy(n, max_value)
            if values is not None:
                return values.tolist()  # type: ignore[no-any-return]
        # slow path: also produces the precise error for malformed input
        return [self.varint(max_value, what) for _ in range(n)]

    def varint_array(self, n: int, max_value: int = (1 << 63) - 1, what: str = "varint") -> np.ndarray:
        """Like :meth:`varint_column`, as an ``int64`` NumPy array (``max_value < 2**63``)."""

        if not 0 <= max_value < 1 << 63:
            raise ValueError("varint_array needs max_value < 2**63")
        pos = self.pos
        if n <= self.end - pos:
            chunk = np.frombuffer(self.data, dtype=np.uint8, count=n, offset=pos)
            top = int(chunk.max()) if n else 0
            if top < 0x80 and top <= max_value:
                self.pos = pos + n
                return chunk.astype(np.int64)
        if n >= _VECTOR_MIN:
            values = self._varint_column_numpy(n, max_value)
            if values is not None:
                return values.astype(np.int64)
        # slow path: also produces the precise error for malformed input
        return np.array([self.varint(max_value, what) for _ in range(n)], dtype=np.int64)

    def _varint_column_numpy(self, n: int, max_value: int) -> np.ndarray | None:
        """Decode ``n`` well-formed varints of at most 9 bytes at once (``uint64``); ``None`` to fall back."""

        pos = self.pos
        avail = self.end - pos
        # varints are mostly short: look for the n terminating bytes in 3 bytes a value first
        short = min(avail, 3 * n)
        arr = np.frombuffer(self.data, dtype=np.uint8, count=short, offset=pos)
        ends = np.flatnonzero(arr < 0x80)
        if len(ends) < n and short < min(avail, 10 * n):
            arr = np.frombuffer(self.data, dtype=np.uint8, count=min(avail, 10 * n), offset=pos)
            ends = np.flatnonzero(arr < 0x80)
        if len(ends) < n:
            return None
        ends = ends[:n]
        starts = np.empty(n, dtype=np.int64)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        lengths = ends - starts
        longest = int(lengths.max()) + 1
        if longest > 9:
            return None
        total = int(ends[-1]) + 1
        # byte k of every varint longer than k, OR-ed in at bit 7k (at most 63 bits in all)
        values = (arr[starts] & 0x7F).astype(np.uint64)
        for k in range(1, longest):
            longer = lengths >= k
            if 4 * int(np.count_nonzero(longer)) >= n:
                # most varints are this long: read byte k of all of them (clipped to the
                # column), keeping it only where the varint has one
                part = arr[np.minimum(starts + k, total - 1)] & 0x7F
                part *= longer
                values |= part.astype(np.uint64) << np.uint64(7 * k)
            else:
                rows = np.flatnonzero(longer)
                part = arr[starts[rows] + k] & 0x7F
                values[rows] |= part.astype(np.uint64) << np.uint64(7 * k)
        if int(values.max()) > max_value:
            return None
        self.pos = pos + total
        return values

    def expect_end(self, what: str) -> None:
        """Raise unless every byte has been consumed."""
        if self.pos != self.end:
            raise self.error(f"{self.end - self.pos} unexpected trailing byte(s) after {what}")


def varint_size(v: int) -> int:
    """Number of bytes of the canonical varint encoding of ``v``."""
    n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


def put_varint(out: bytearray, v: int) -> None:
    """Append the canonical varint encoding of ``v`` (0 <= v < 2**64) to ``out``."""
    if v < 0 or v >= 1 << 64:
        raise ValueError(f"varint out of range: {v}")
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def put_u64le(out: bytearray, v: int) -> None:
    """Append a little-endian uint64."""
    out += _U64.pack(v)


def put_i32le(out: bytearray, v: int) -> None:
    """Append a little-endian int32."""
    out += _I32.pack(v)
