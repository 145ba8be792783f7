"""A :class:`KvStore` wrapper that adds a fixed delay to every request and counts requests.

It models an object store reached over a network: each call into the wrapped store is one
request that first waits ``delay`` seconds.  :meth:`LatencyStore.get_many` coalesces byte
ranges (see :mod:`ocdbt_py.kvstore.coalesce`) and issues the merged requests concurrently, the
way a store backed by an async HTTP client would.

:class:`RequestStats` records, per operation, how many requests were made and how many bytes
came back, plus ``depth``: the longest chain of requests in which each one started only after
the previous one had finished.  A request that starts after another has finished *may* depend
on it, so ``depth`` is an upper bound on the number of round trips a caller made in sequence;
with a fixed delay per request, wall time is at least ``depth * delay``.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence

from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, normalize_request
from ocdbt_py.kvstore.coalesce import DEFAULT_GAP, DEFAULT_MAX_SPAN, coalesced_get_many
from ocdbt_py.kvstore.wrapper import WrapperStore
from ocdbt_py.pools import dedicated

__all__ = ["LatencyStore", "RequestStats"]


@dataclasses.dataclass
class RequestStats:
    """Counters kept by :class:`LatencyStore` (reset with :meth:`reset`)."""

    requests: int = 0
    bytes_read: int = 0
    by_op: dict[str, int] = dataclasses.field(default_factory=dict)
    #: longest chain of requests each started after the previous one finished
    depth: int = 0
    #: most requests in flight at once
    max_in_flight: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        self.requests = self.bytes_read = self.depth = self.max_in_flight = 0
        self.by_op = {}


#: members that would read around the delay and the counters: KvStore's defaults instead
_AROUND = frozenset({
    "exists", "list_sized", "delete_prefix", "local_path", "no_follow_root", "fsspec_location",
    "syncs_later", "note_written", "supports_read_into", "read_into", "supports_read_parts",
    "read_parts", "supports_read_ahead", "read_ahead", "lists_sizes",
})


class LatencyStore(WrapperStore):
    """Wrap ``base``: every request sleeps ``delay`` seconds first and is counted in ``stats``.

    ``coalesce`` turns on byte-range merging in :meth:`get_many` within ``gap`` bytes and up
    to ``max_span`` bytes per request; ``max_concurrency`` bounds requests in flight.
    Every other capability of ``base`` is forwarded, except those that would go around the
    delay (:data:`_AROUND`).
    """

    withheld = _AROUND

    def __init__(
        self,
        base: KvStore,
        delay: float = 0.0,
        *,
        coalesce: bool = True,
        gap: int = DEFAULT_GAP,
        max_span: int = DEFAULT_MAX_SPAN,
        max_concurrency: int = 64,
    ):
        if delay < 0:
            raise ValueError("delay must be >= 0")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        super().__init__(base)
        self.delay = float(delay)
        self.coalesce = coalesce
        self.gap = gap
        self.max_span = max_span
        self.max_concurrency = max_concurrency
        self.stats = RequestStats()
        self._lock = threading.Lock()
        self._in_flight = 0
        # depth of the longest chain among finished requests: a new request extends it
        self._finished_depth = 0

    @property
    def is_remote(self) -> bool:
        return True

    @property
    def supports_conditional_writes(self) -> bool:
        return self.base.supports_conditional_writes

    @property
    def renames_atomically(self) -> bool:
        return self.base.renames_atomically

    # -- accounting ----------------------------------------------------------------------
    def _begin(self, op: str, depth: int | None = None) -> int:
        with self._lock:
            self.stats.requests += 1
            self.stats.by_op[op] = self.stats.by_op.get(op, 0) + 1
            self._in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
            return self._finished_depth + 1 if depth is None else depth

    def _end(self, depth: int, nbytes: int = 0) -> None:
        with self._lock:
            self._in_flight -= 1
            self.stats.bytes_read += nbytes
            self._finished_depth = max(self._finished_depth, depth)
            self.stats.depth = max(self.stats.depth, depth)

    def reset_stats(self) -> None:
        """Zero the counters (between the phases of a test or benchmark)."""
        with self._lock:
            self.stats.reset()
            self._finished_depth = 0

    def _wait(self) -> None:
        if self.delay:
            time.sleep(self.delay)

    # -- reading -------------------------------------------------------------------------
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self._get(key, byte_range, None)

    def _get(self, key: str, byte_range: ByteRange | None, depth: int | None) -> bytes | None:
        d = self._begin("get", depth)
        n = 0
        try:
            self._wait()
            data = self.base.get(key, byte_range)
            n = 0 if data is None else len(data)
            return data
        finally:
            self._end(d, n)

    def _fetch(self, reqs: builtins.list[tuple[str, ByteRange | None]]) -> builtins.list[bytes | None]:
        if len(reqs) == 1:
            return [self.get(*reqs[0])]
        # one batch: its requests depend on none of each other, so they share one depth
        # (when there are more than max_concurrency, later ones queue behind earlier ones)
        with self._lock:
            depth = self._finished_depth + 1
        workers = min(self.max_concurrency, len(reqs))
        with dedicated("io", workers, name="latency") as pool:
            futs = [
                pool.submit(self._get, k, r, depth + i // self.max_concurrency) for i, (k, r) in enumerate(reqs)
            ]
            return [f.result() for f in futs]

    def get_many(self, requests: Sequence[ReadRequest]) -> builtins.list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        if not reqs:
            return []
        if not self.coalesce:
            return self._fetch(reqs)
        return coalesced_get_many(reqs, self._fetch, gap=self.gap, max_span=self.max_span)

    def size(self, key: str) -> int | None:
        d = self._begin("size")
        try:
            self._wait()
            return self.base.size(key)
        finally:
            self._end(d)

    def list(
        self, prefix: str = "", *, start: str | None = None, stop: str | None = None
    ) -> Iterator[str]:
        d = self._begin("list")
        try:
            self._wait()
            keys = builtins.list(self.base.list(prefix, start=start, stop=stop))
        finally:
            self._end(d)
        yield from keys

    def list_dir(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[str]]:
        d = self._begin("list")
        try:
            self._wait()
            return self.base.list_dir(prefix)
        finally:
            self._end(d)

    # -- writing -------------------------------------------------------------------------
    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        d = self._begin("set")
        try:
            self._wait()
            self.base.set(key, value)
        finally:
            self._end(d)

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        d = self._begin("set")
        try:
            self._wait()
            self.base.set_parts(key, parts)
        finally:
            self._end(d)

    def delete(self, key: str) -> None:
        d = self._begin("delete")
        try:
            self._wait()
            self.base.delete(key)
        finally:
            self._end(d)

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        d = self._begin("get_with_generation")
        n = 0
        try:
            self._wait()
            value, gen = self.base.get_with_generation(key)
            n = 0 if value is None else len(value)
            return value, gen
        finally:
            self._end(d, n)

    def set_if(
        self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None
    ) -> str:
        d = self._begin("set_if")
        try:
            self._wait()
            return self.base.set_if(key, value, if_generation=if_generation)
        finally:
            self._end(d)
