"""The set of changes one commit applies: writes, deletes, range deletes and conditions.

Kept in the normal form TensorStore's staged mutations have: a write (or delete) per key, and
disjoint delete ranges that contain no written key.  A later ``delete_range`` drops the
writes it covers; a later write inside a delete range splits the range around its key.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator
from typing import Any, NamedTuple, Union

from ocdbt_py.errors import InvalidKeyError
from ocdbt_py.format.btree import MAX_KEY_LENGTH
from ocdbt_py.format.data_file_table import IndirectDataReference

__all__ = [
    "Mutation",
    "MutationSet",
    "ChunkedValue",
    "Value",
    "as_key",
    "as_value",
    "value_length",
    "WRITE",
    "DELETE_RANGE",
    "ANY",
]

WRITE = 0
DELETE_RANGE = 1
_READ_CHUNK = 16 << 20


class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: Default of ``if_equal`` arguments: no condition.
ANY: Any = _Any()


@dataclasses.dataclass(frozen=True)
class ChunkedValue:
    """A value held as several buffers (read from a stream), never joined in memory."""

    parts: tuple[bytes, ...]

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)


#: A value to write: bytes, a byte view of a caller's buffer, chunks, or (once staged) a
#: reference to where the bytes were written.
Value = Union[bytes, memoryview, ChunkedValue, IndirectDataReference]


def as_key(key: Any) -> bytes:
    """Validate and normalise a key (``bytes``-like or ``str``, UTF-8) to ``bytes``."""
    if isinstance(key, bytes):
        k = key
    elif isinstance(key, str):
        k = key.encode("utf-8")
    elif isinstance(key, (bytearray, memoryview)):
        k = bytes(key)
    else:
        raise InvalidKeyError(f"keys must be bytes or str, not {type(key).__name__}")
    if len(k) > MAX_KEY_LENGTH:
        raise InvalidKeyError(f"key of {len(k)} bytes exceeds the OCDBT limit of {MAX_KEY_LENGTH} bytes")
    return k


def as_value(value: Any) -> bytes | memoryview | ChunkedValue:
    """Normalise a value: ``bytes`` as is, other buffers as a byte view, streams as chunks.

    Mutable buffers are not copied: they must not change until the commit that writes them.
    A binary file object (anything with ``read``) is read to its end in 16 MiB chunks.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        raise TypeError("values must be bytes-like, not str (encode it first)")
    if isinstance(value, ChunkedValue):
        return value
    read = getattr(value, "read", None)
    if read is not None and not isinstance(value, (bytearray, memoryview)):
        parts: list[bytes] = []
        while True:
            chunk = read(_READ_CHUNK)
            if not chunk:
                break
            if not isinstance(chunk, (bytes, bytearray)):
                raise TypeError("a streamed value must be read from a binary file")
            parts.append(bytes(chunk))
        if len(parts) <= 1:
            return parts[0] if parts else b""
        return ChunkedValue(tuple(parts))
    try:
        view = memoryview(value)
    except TypeError:
        raise TypeError(f"values must be bytes-like, not {type(value).__name__}") from None
    if not view.contiguous:
        raise TypeError("value buffers must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def value_length(value: Value) -> int:
    """Size of a value in bytes."""
    if isinstance(value, IndirectDataReference):
        return value.length
    if isinstance(value, memoryview):
        return value.nbytes
    return len(value)


class Mutation(NamedTuple):
    """One entry of the sorted mutation list.

    ``kind == WRITE``: ``key`` gets ``value`` (``None`` deletes it).
    ``kind == DELETE_RANGE``: keys in ``[key, stop)`` are deleted (``stop=None``: no bound).
    """

    key: bytes
    kind: int
    value: Value | None
    stop: bytes | None


class SortedMutations:
    """The mutations of a commit in key order, as parallel lists (cheap for a million writes).

    Entry ``i`` writes ``values[i]`` at ``keys[i]`` (``None`` deletes), unless ``kinds[i]`` is
    ``DELETE_RANGE``: then keys in ``[keys[i], stops[i])`` are deleted.  ``range_index``
    lists the positions of the range deletes.
    """

    __slots__ = ("keys", "values", "kinds", "stops", "range_index")

    def __init__(self, keys: list[bytes], values: list[Any], kinds: list[int] | None = None,
                 stops: list[bytes | None] | None = None):
        self.keys = keys
        self.values = values
        n = len(keys)
        self.kinds = kinds if kinds is not None else [WRITE] * n
        self.stops = stops if stops is not None else [None] * n
        self.range_index = [i for i, k in enumerate(self.kinds) if k == DELETE_RANGE] if kinds else []

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> Mutation:
        return Mutation(self.keys[i], self.kinds[i], self.values[i], self.stops[i])

    def has_range_in(self, a: int, b: int) -> bool:
        """Whether a range delete lies among entries ``[a, b)``."""
        ri = self.range_index
        if not ri:
            return False
        j = bisect.bisect_left(ri, a)
        return j < len(ri) and ri[j] < b


class MutationSet:
    """Pending writes, deletes and range deletes, plus conditions on the base version."""

    def __init__(self) -> None:
        #: key -> value (``None``: delete).  Add entries with :meth:`set` (or directly, when
        #: there are no delete ranges).
        self.writes: dict[bytes, Value | None] = {}
        self._lo: list[bytes] = []
        self._hi: list[bytes | None] = []
        self._sorted: list[bytes] | None = None
        #: key -> expected base entry (``None``: absent; bytes: value; a reference: exactly
        #: that stored value).  Checked against the version a commit applies to.
        self.conditions: dict[bytes, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.writes or self._lo)

    def __len__(self) -> int:
        return len(self.writes) + len(self._lo)

    @property
    def ranges(self) -> list[tuple[bytes, bytes | None]]:
        """The disjoint delete ranges, in order."""
        return list(zip(self._lo, self._hi))

    def _range_index(self, key: bytes) -> int:
        """Index of the delete range containing ``key``, or -1."""
        i = bisect.bisect_right(self._lo, key) - 1
        if i >= 0:
            hi = self._hi[i]
            if hi is None or key < hi:
                return i
        return -1

    def in_deleted_range(self, key: bytes) -> bool:
        """Whether a pending range delete covers ``key`` (and no later write re-added it)."""
        return key not in self.writes and self._range_index(key) >= 0

    def set(self, key: bytes, value: Value | None) -> None:
        """Write ``value`` at ``key`` (``None`` deletes)."""
        i = self._range_index(key)
        if i >= 0:
            lo, hi = self._lo[i], self._hi[i]
            after = key + b"\x00"
            del self._lo[i]
            del self._hi[i]
            if hi is None or after < hi:
                self._lo.insert(i, after)
                self._hi.insert(i, hi)
            if lo < key:
                self._lo.insert(i, lo)
                self._hi.insert(i, key)
        self.writes[key] = value

    def delete_range(self, start: bytes, stop: bytes | None) -> None:
        """Delete every key in ``[start, stop)``."""
        if stop is not None and stop <= start:
            return
        for k in [k for k in self.writes if k >= start and (stop is None or k < stop)]:
            del self.writes[k]
        self._sorted = None
        lo, hi = start, stop
        # merge with overlapping or adjacent ranges
        i = bisect.bisect_left(self._lo, lo)
        if i > 0 and (self._hi[i - 1] is None or self._hi[i - 1] >= lo):  # type: ignore[operator]
            i -= 1
            lo = self._lo[i]
        j = i
        while j < len(self._lo) and (hi is None or self._lo[j] <= hi):
            h = self._hi[j]
            if h is None or (hi is not None and h > hi):
                hi = h
            j += 1
        self._lo[i:j] = [lo]
        self._hi[i:j] = [hi]

    @property
    def has_ranges(self) -> bool:
        """Whether any range delete is pending."""
        return bool(self._lo)

    def sorted_keys(self) -> list[bytes]:
        """The written keys in order (cached while the key set does not change)."""
        w = self.writes
        cached = self._sorted
        if cached is None or len(cached) != len(w):
            cached = self._sorted = sorted(w)
        return cached

    def sorted(self, replace: dict[int, Value] | None = None) -> SortedMutations:
        """All mutations ordered by key (a range by its start).

        ``replace`` maps positions in :meth:`sorted_keys` to the values to use instead of the
        pending ones (references to values already staged in data files).
        """
        w = self.writes
        keys = list(self.sorted_keys())
        values: list[Any] = list(map(w.__getitem__, keys))
        if replace:
            for i, v in replace.items():
                values[i] = v
        if not self._lo:
            return SortedMutations(keys, values)
        entries = sorted(
            [(k, WRITE, v, None) for k, v in zip(keys, values)]
            + [(lo, DELETE_RANGE, None, hi) for lo, hi in zip(self._lo, self._hi)],
            key=lambda e: e[0],
        )
        return SortedMutations(
            [e[0] for e in entries], [e[2] for e in entries], [e[1] for e in entries], [e[3] for e in entries]
        )

    def staged_values(self) -> Iterator[tuple[bytes, Value]]:
        """``(key, value)`` of every pending write (not deletes), in key order."""
        w = self.writes
        for k in self.sorted_keys():
            v = w[k]
            if v is not None:
                yield k, v
