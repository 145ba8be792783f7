"""Byte-range coalescing: turn many small reads into few large ones.

Over a network every request costs a round trip, so reads of nearby byte ranges of the same
object are merged into one request when the gap between them is at most ``gap`` bytes and the
merged span stays within ``max_span`` bytes (TensorStore and zarr-python do the same).  A
request for a whole object absorbs every other plain range of that object.  Suffix ranges
(``(-n, None)``) are left alone: their position is unknown until the size is.

:func:`plan` groups requests into :class:`Span` objects; :func:`coalesced_get_many` runs a plan
through any "fetch these ranges" function and slices the answers back out, in request order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar, Union

from ocdbt_py.kvstore.base import ByteRange, ReadRequest, check_range, normalize_request

__all__ = ["DEFAULT_GAP", "DEFAULT_MAX_SPAN", "Span", "plan", "coalesced_get_many", "merge_ranges"]

T = TypeVar("T")

#: Merge ranges separated by at most this many bytes (wasted bytes cost less than a round trip).
DEFAULT_GAP = 1 << 20
#: Never merge past this many bytes in one request (keeps reads concurrent and memory bounded).
DEFAULT_MAX_SPAN = 32 << 20


@dataclasses.dataclass
class Span:
    """One request to issue: ``key`` and ``byte_range``, serving the requests in ``members``.

    ``members`` holds ``(index, start, stop)`` of each original request it answers, with
    ``start``/``stop`` absolute offsets in the object (``stop=None``: to the end).
    """

    key: str
    byte_range: ByteRange | None
    members: list[tuple[int, int, int | None]]

    def split(self, data: bytes | None) -> list[tuple[int, bytes | None]]:
        """Cut the fetched ``data`` into each member's answer (``None`` stays ``None``)."""
        if data is None:
            return [(i, None) for i, _, _ in self.members]
        base = 0 if self.byte_range is None else self.byte_range[0]
        if base < 0:  # a suffix span: never merged, the data is the answer
            return [(i, data) for i, _, _ in self.members]
        mv = memoryview(data)
        out: list[tuple[int, bytes | None]] = []
        for i, start, stop in self.members:
            lo = start - base
            if stop is None:
                out.append((i, data if lo == 0 and len(self.members) == 1 else bytes(mv[lo:])))
            else:
                out.append((i, data if (lo == 0 and stop - base >= len(data) and len(self.members) == 1)
                            else bytes(mv[lo : stop - base])))
        return out


def merge_ranges(
    ranges: Iterable[tuple[int, int | None, T]],
    *,
    gap: int,
    max_span: Union[int, Callable[[], int]],
) -> Iterator[tuple[int, int | None, list[T]]]:
    """Merge byte ranges of one object, given sorted by start, into ``(start, stop, members)``.

    The one range-merging rule of the project (kvstore reads, local and remote restores): a
    range joins the current group when it starts at most ``gap`` bytes after the group's end
    and the merged group stays within ``max_span`` bytes.  ``stop=None`` is open-ended (to
    the end of the object): such a range starts a group that takes every later range, and
    never joins a bounded one.  ``max_span`` may be a function, asked at each decision, so a
    caller can let the limit grow with the groups it has received so far (a group is yielded
    as soon as it is closed).
    """
    cur: list[T] = []
    lo = 0
    hi: int | None = 0
    for start, stop, item in ranges:
        if cur:
            if hi is None:
                cur.append(item)
                continue
            limit = max_span() if callable(max_span) else max_span
            if stop is not None and start <= hi + gap and max(hi, stop) - lo <= limit:
                cur.append(item)
                hi = max(hi, stop)
                continue
            yield lo, hi, cur
        cur, lo, hi = [item], start, stop
    if cur:
        yield lo, hi, cur


def plan(
    requests: Sequence[ReadRequest], *, gap: int = DEFAULT_GAP, max_span: int = DEFAULT_MAX_SPAN
) -> list[Span]:
    """Group ``requests`` into as few spans as the gap and size limits allow.

    Spans come out grouped by key, in order of first appearance, ranges ascending.
    """
    if gap < 0 or max_span <= 0:
        raise ValueError("gap must be >= 0 and max_span > 0")
    by_key: dict[str, list[tuple[int, ByteRange | None]]] = {}
    for i, req in enumerate(requests):
        key, rng = normalize_request(req)
        check_range(rng)
        by_key.setdefault(key, []).append((i, rng))
    spans: list[Span] = []
    for key, reqs in by_key.items():
        whole = [i for i, r in reqs if r is None]
        plain: list[tuple[int, int, int | None]] = []
        for i, r in reqs:
            if r is None:
                continue
            start, stop = r
            if start < 0:
                spans.append(Span(key, r, [(i, start, stop)]))
            else:
                plain.append((i, start, stop))
        if whole:
            spans.append(Span(key, None, [(i, 0, None) for i in whole] + plain))
            continue
        plain.sort(key=lambda m: (m[1], -1 if m[2] is None else m[2]))
        for lo, hi, members in merge_ranges(((m[1], m[2], m) for m in plain), gap=gap, max_span=max_span):
            spans.append(Span(key, (lo, hi), members))
    return spans


def coalesced_get_many(
    requests: Sequence[ReadRequest],
    fetch: Callable[[list[tuple[str, ByteRange | None]]], Sequence[bytes | None]],
    *,
    gap: int = DEFAULT_GAP,
    max_span: int = DEFAULT_MAX_SPAN,
) -> list[bytes | None]:
    """Answer ``requests`` (in order) by calling ``fetch`` once with the coalesced spans.

    ``fetch`` receives ``(key, byte_range)`` pairs and returns one result per pair, ``None``
    for a missing object; it should issue them concurrently.
    """
    spans = plan(requests, gap=gap, max_span=max_span)
    results = fetch([(s.key, s.byte_range) for s in spans])
    if len(results) != len(spans):
        raise RuntimeError(f"fetch returned {len(results)} results for {len(spans)} requests")
    out: list[bytes | None] = [None] * len(requests)
    for span, data in zip(spans, results):
        for i, piece in span.split(data):
            out[i] = piece
    return out
