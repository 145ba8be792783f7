"""Reading the chunks of a checkpoint on a remote store: located once, coalesced across
arrays, fetched concurrently within an explicit byte budget, decoded while the rest arrives.

Over a network the cost of a restore is round trips and transfer, not CPU.  So for items that
are not on the local filesystem the reader

* locates every chunk once (for OCDBT items, one scan of the B+tree gives each key's data
  file, offset and length, and the inline values such as the Zarr metadata),
* sorts the chunks of *all* requested arrays by data file and offset and merges neighbours
  (at most :data:`GAP` bytes apart, up to :data:`MAX_SPAN` bytes per request) into few large
  ranged reads, whatever array each chunk belongs to,
* keeps requests in flight until :func:`fetch_budget` bytes (64 MiB, more for large reads
  and large requests) of fetched-but-not-yet-decoded bytes are outstanding (a byte budget,
  not a CPU count: a 2-core client can wait on dozens of requests), and
* hands each range to the decode workers as soon as it arrives, so decoding overlaps the
  transfer of the rest.

A whole-item restore need not wait for the B+tree to start moving data: every chunk of the item
will be read, and they lie in the data files the directory listing named (with their sizes).
:class:`Prefetch` requests the first budget's worth of them straight after the
listing, while the B+tree and the Zarr metadata are read and parsed; the plan then assigns the
values that fall inside those requests to them and fetches only the rest.

Stores that read in parts (:meth:`~ocdbt_py.kvstore.base.KvStore.read_parts`: the obstore
route) do better still: each range is requested as parts that are usable as they arrive, its
values go to the decode workers as :class:`PartView` objects when the request starts, and a
large chunk whose codecs allow it (zstd or none, see
:meth:`~zarr3.codecs.chain.CodecChain.streams_into`) is decoded straight into the output part
by part, each part freed once decoded: a 60 MiB chunk's decode then overlaps its own transfer
instead of starting after it (256 MiB in 4 chunks from moto: 0.89-0.96 s -> 0.57 s).  Stores
with :meth:`~ocdbt_py.kvstore.object_store.ObjectStore.read_into` (the fsspec route for S3,
GCS, Azure) read each range straight into a buffer taken from a small reuse pool; any other
store gets ``get_many`` calls on I/O threads.  Memory held for fetched bytes never exceeds the
budget (a single value larger than the budget is fetched alone).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.restore.bufpool import SlabPool
from ocdbt_py.checkpoint.restore.locations import Location, LocationTable
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.coalesce import merge_ranges
from ocdbt_py.kvstore.futures import all_done
from ocdbt_py.pools import shared
from zarr3.engine.executor import get_pool, num_threads

__all__ = ["RemoteSource", "Prefetch", "Parts", "PartView", "IN_FLIGHT_BYTES", "MAX_SPAN", "GAP", "STREAM_MIN",
           "fetch_budget"]

#: Fetched bytes (compressed, not yet decoded) held at a time; ``OCDBT_PY_FETCH_BYTES``
#: overrides it.  This, not the CPU count, sets how many requests are in flight.
IN_FLIGHT_BYTES = 64 << 20
#: ... and for reads of more than 8 times that, up to an eighth of the read, at most this.
#: (1 GiB restored from the benchmark's S3 server: 0.56x / 0.75x TensorStore's time without
#: / with 20 ms latency at 128 MiB, 0.61x / 0.81x at 64 MiB; peak RSS 1.21x vs 1.17x.)
MAX_IN_FLIGHT_BYTES = 128 << 20
#: Neighbouring values of one data file at most this far apart are fetched with one request
#: (skipped bytes cost less than a round trip)...
GAP = 1 << 20
#: ...as long as the request stays within this many bytes; a larger single value is one request.
#: (Each request has a cost of its own at the server; on the benchmark's S3 server 32 MiB
#: restored a 250 MiB checkpoint 5% faster than 16 MiB or 24 MiB.)
MAX_SPAN = 32 << 20
#: The first requests are smaller (this, doubling up to MAX_SPAN) so decoding starts early.
FIRST_SPAN = 4 << 20
#: Data files smaller than this are not prefetched (see :class:`Prefetch`).
PREFETCH_MIN_FILE = 64 << 10
#: The first prefetched range is requested alone, the others once it has arrived: sharing the
#: link with them it arrives when they all do (4 x 32 MiB: ~0.1 s from the GCS emulator),
#: alone in a fraction of that, and decoding starts that much earlier (1 GiB from the GCS
#: emulator: best of 8 interleaved, 1.039 s vs 1.080 s; 5 of 8 pairs faster).
PREFETCH_FIRST_ALONE = True
#: Values of one request are decoded in jobs of about this many bytes (both workers share
#: the last request instead of one decoding it alone).
DECODE_JOB_BYTES = 4 << 20
#: Values of at least this many bytes read in parts (stores with ``read_parts``) are decoded
#: as their parts arrive, where their codecs can (one zstd, or none): the decode of a large
#: chunk then overlaps its own transfer instead of starting after it.
STREAM_MIN = 1 << 20
#: Most requests in flight at once (on top of the byte budget).
MAX_REQUESTS = 64
#: Keys per ``get_many`` when values cannot be located in advance (one object per chunk).
KEYS_PER_BATCH = 64

def fetch_budget(total: int = 0, largest: int = 0) -> int:
    """The in-flight byte budget for reading ``total`` bytes: ``OCDBT_PY_FETCH_BYTES`` if set,
    else :data:`IN_FLIGHT_BYTES`, growing with large reads (an eighth of ``total``) up to
    :data:`MAX_IN_FLIGHT_BYTES`: more requests in flight keep a long link busy, at a memory
    cost that stays a small fraction of what the read returns.  It also grows, up to the same
    cap, to twice the ``largest`` request, so that the next one is on its way while one is
    decoded (four 60 MiB chunks within 64 MiB were fetched and decoded strictly in turn)."""
    env = os.environ.get("OCDBT_PY_FETCH_BYTES")
    if env:
        try:
            return max(1 << 20, int(env))
        except ValueError:
            pass
    return max(IN_FLIGHT_BYTES, min(MAX_IN_FLIGHT_BYTES, max(total // 8, 2 * largest)))


class _Pool(SlabPool):
    """The fetch buffers of one read: slabs of :data:`MAX_SPAN` bytes (see :class:`SlabPool`)."""

    def __init__(self, limit: int):
        super().__init__(limit, MAX_SPAN)


def _claim(vals: list[tuple[int, int, int]], jobs: list[_Job], join: bool = True
           ) -> tuple[list[tuple[int, int, int]], list[tuple[tuple[int, int, int], _Job, _Job]]]:
    """Give each value (``(index, offset, length)``, sorted by offset) that lies wholly inside
    one of ``jobs``' ranges to that job.  Return the values left for new requests, and (with
    ``join``) the values that straddle two adjacent ranges (with those two jobs): they are
    joined from the two ranges' bytes when both have arrived instead of being fetched again."""
    spans = sorted(jobs, key=lambda j: j.spans[0][2])
    rest: list[tuple[int, int, int]] = []
    split: list[tuple[tuple[int, int, int], _Job, _Job]] = []
    k = 0
    for v in vals:
        a, b = v[1], v[1] + v[2]
        while k < len(spans) and spans[k].spans[0][3] <= a:
            k += 1
        if k < len(spans) and spans[k].spans[0][2] <= a and b <= spans[k].spans[0][3]:
            spans[k].spans[0][4].append(v)
        elif (join and k + 1 < len(spans) and spans[k].spans[0][2] <= a
              and spans[k + 1].spans[0][2] == spans[k].spans[0][3] and b <= spans[k + 1].spans[0][3]):
            split.append((v, spans[k], spans[k + 1]))
        else:
            rest.append(v)
    return rest, split


class _Job:
    """One request (or one ``get_many`` batch) and the values it answers."""

    __slots__ = ("nbytes", "spans", "buf", "keys", "feeds", "pending", "parts", "early")

    def __init__(self, nbytes: int, spans: list[tuple[int, str, int, int, list[tuple[int, int, int]]]],
                 keys: list[tuple[int, str]] | None = None):
        self.nbytes = nbytes
        #: (store, data file key, start, stop, [(value index, offset, length)])
        self.spans = spans
        self.buf: np.ndarray | None = None
        #: whole keys of the item store (no locations known): (value index, key)
        self.keys = keys
        #: jobs of values straddling this range and the next, which this range's bytes complete
        self.feeds: list[_Job] = []
        #: for such a joined value: how many of its two ranges have not arrived yet
        self.pending = 0
        #: the range's parts, from a store that reads in parts
        self.parts: Parts | None = None
        #: its values were handed to the decode workers when it started (they wait for parts)
        self.early = False


class Parts:
    """The parts of one requested range ``[lo, hi)`` of a data file
    (:meth:`~ocdbt_py.kvstore.base.KvStore.read_parts`), in offset order.  A part is let go
    (its bytes freed) once every :class:`PartView` over it has read past it."""

    __slots__ = ("where", "lo", "hi", "offsets", "futs", "users", "lock", "got", "freed", "on_free")

    def __init__(self, where: str, lo: int, hi: int, parts: Sequence[tuple[int, concurrent.futures.Future[Any]]]):
        self.where = where
        self.lo = lo
        self.hi = hi
        self.offsets = [o for o, _ in parts]
        self.futs: list[concurrent.futures.Future[Any] | None] = [f for _, f in parts]
        #: per part: how many views still need it
        self.users = [0] * len(self.futs)
        self.lock = threading.Lock()
        #: per part, once looked at: its chunks and the data-file offset of each
        self.got: list[tuple[list[memoryview], list[int]] | None] = [None] * len(self.futs)
        #: bytes of the parts let go so far, and who is told of each (the budget's keeper)
        self.freed = 0
        self.on_free: Callable[[int], None] | None = None

    def index(self, offset: int) -> int:
        """The part holding byte ``offset`` of the data file."""
        return bisect.bisect_right(self.offsets, offset) - 1

    def use(self, first: int, last: int, n: int) -> None:
        """Parts ``first`` to ``last`` gain (``n=1``) or lose (``n=-1``) a user; one that
        loses its last is let go."""
        freed = 0
        with self.lock:
            for k in range(first, last + 1):
                self.users[k] += n
                if self.users[k] <= 0 and self.futs[k] is not None:
                    self.futs[k] = None
                    self.got[k] = None
                    freed += (self.offsets[k + 1] if k + 1 < len(self.offsets) else self.hi) - self.offsets[k]
            self.freed += freed
        if freed and self.on_free is not None:
            self.on_free(freed)

    def _chunks(self, k: int) -> tuple[list[memoryview], list[int]]:
        """Part ``k`` once it has arrived (checked to be all there): its chunks (a part is one
        buffer or a list of consecutive ones) and the data-file offset of each."""
        cached = self.got[k]
        if cached is not None:
            return cached
        fut = self.futs[k]
        if fut is None:
            raise RuntimeError("a part was read after every reader let it go")
        got = fut.result()
        lo = self.offsets[k]
        want = (self.offsets[k + 1] if k + 1 < len(self.offsets) else self.hi) - lo
        if got is None:
            raise CorruptionError("data file referenced by the database is missing", path=self.where)
        mvs: list[memoryview] = []
        starts: list[int] = []
        off = lo
        for c in got if isinstance(got, list) else [got]:
            mv = memoryview(c)
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
            if mv.nbytes:
                mvs.append(mv)
                starts.append(off)
                off += mv.nbytes
        if off - lo != want:
            raise CorruptionError(f"data file is truncated: wanted {want} bytes at offset {lo}, got {off - lo}",
                                  path=self.where, offset=lo)
        with self.lock:
            if self.futs[k] is not None:
                self.got[k] = (mvs, starts)
        return mvs, starts

    def chunk(self, offset: int) -> tuple[memoryview, int]:
        """The chunk holding byte ``offset`` of the data file (once its part has arrived) and
        the chunk's own offset."""
        mvs, starts = self._chunks(self.index(offset))
        j = bisect.bisect_right(starts, offset) - 1
        return mvs[j], starts[j]


class PartView:
    """Bytes ``[a, b)`` of a :class:`Parts`: a value as ``consume`` gets it from a store that
    reads in parts.  :meth:`whole` waits for all of it (a view where it lies in one part, else
    a joined copy); :meth:`read` and :meth:`head` (a
    :class:`~zarr3.codecs.base.ByteSource`) give it piece by piece as the parts arrive, for
    decoding while the rest is on its way."""

    __slots__ = ("parts", "a", "b", "_pos", "_kept")

    def __init__(self, parts: Parts, a: int, b: int):
        self.parts = parts
        self.a = a
        self.b = b
        self._pos = a
        #: the first part this view still holds on to (parts before it are let go)
        self._kept = parts.index(a)
        if b > a:
            parts.use(self._kept, parts.index(b - 1), 1)

    @property
    def nbytes(self) -> int:
        """The value's length."""
        return self.b - self.a

    def __len__(self) -> int:
        return self.b - self.a

    def _slice(self, lo: int, hi: int) -> memoryview | bytes:
        """Bytes ``[lo, hi)`` of the data file (within the view): a view of one part, or a
        copy joined from several."""
        mv, off = self.parts.chunk(lo)
        if hi - off <= len(mv):
            return mv[lo - off: hi - off]
        out = bytearray()
        while lo < hi:
            mv, off = self.parts.chunk(lo)
            piece = mv[lo - off: min(hi - off, len(mv))]
            out += piece
            lo += len(piece)
        return memoryview(out)

    def release(self) -> None:
        """Let go of every part this view still holds (it is not read again)."""
        if self.b > self.a:
            last = self.parts.index(self.b - 1)
            if self._kept <= last:
                self.parts.use(self._kept, last, -1)
                self._kept = last + 1

    def whole(self) -> memoryview | bytes:
        """All of the value, once it has arrived."""
        return self._slice(self.a, self.b)

    def head(self, n: int) -> memoryview | bytes:
        """The first ``n`` bytes (fewer if the value is shorter), waiting for them."""
        return self._slice(self.a, min(self.b, self.a + max(0, n)))

    def read(self, n: int) -> memoryview | bytes:
        """The next piece of at most ``n`` bytes (within one part), empty at the end.  Parts
        read past are let go (this view no longer needs them)."""
        pos = self._pos
        parts = self.parts
        if pos >= self.b or n <= 0:
            if pos >= self.b:
                self.release()
            return b""
        k = parts.index(pos)
        if k > self._kept:
            parts.use(self._kept, k - 1, -1)
            self._kept = k
        mv, off = parts.chunk(pos)
        end = min(off + len(mv), self.b, pos + n)
        self._pos = end
        return mv[pos - off: end - off]


def _start_span(job: _Job, stores: Sequence[KvStore], _pool: _Pool) -> concurrent.futures.Future[Any]:
    """Start the one ranged read of ``job``: in parts that can be used as they arrive, or
    into a pooled buffer, where the store can."""
    si, fk, lo, hi, _ = job.spans[0]
    store = stores[si]
    if store.supports_read_parts:
        parts = store.read_parts(fk, lo, hi)
        job.parts = Parts(f"{store.url.rstrip('/')}/{fk}", lo, hi, parts)
        return _when_all([f for _, f in parts])
    if store.supports_read_into:
        job.buf = _pool.take(hi - lo)
        return store.read_into([(fk, lo, job.buf.data[: hi - lo])])[0]
    return shared("io").submit(stores[si].get_many, [(fk, (lo, hi))])


def _when_all(futs: Sequence[concurrent.futures.Future[Any]]) -> concurrent.futures.Future[None]:
    """A future that finishes (with ``None``) once all of ``futs`` have, holding none of their
    results (the parts' bytes are let go as they are decoded, not kept here)."""
    out: concurrent.futures.Future[None] = concurrent.futures.Future()
    left = [len(futs)]
    lock = threading.Lock()

    def one(_f: concurrent.futures.Future[Any]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            out.set_result(None)

    if not futs:
        out.set_result(None)
    for f in futs:
        f.add_done_callback(one)
    return out


def _chain(src: concurrent.futures.Future[Any], dst: concurrent.futures.Future[Any]) -> None:
    """Complete ``dst`` with ``src``'s outcome once ``src`` is done."""
    def done(f: concurrent.futures.Future[Any]) -> None:
        err = f.exception()
        if err is not None:
            dst.set_exception(err)
        else:
            dst.set_result(f.result())

    src.add_done_callback(done)


class Prefetch:
    """The first ranges of an item's data files, requested before their contents are located.

    ``files`` are ``(store index, data file key, size)`` from the directory listing (keys of
    ``stores[index]``, the databases' stores).  Ranges of up to :data:`MAX_SPAN` bytes start at
    offset 0 of each file in turn, largest file first, until ``budget`` bytes are requested
    (the first alone, the others once it is in: :data:`PREFETCH_FIRST_ALONE`); files under
    :data:`PREFETCH_MIN_FILE` bytes (B+tree nodes, mostly) are left to the plan.
    Hand the object to :meth:`RemoteSource.run`, which gives each range the values it holds
    (a value across two adjacent ranges is joined from both); a range that holds none is
    dropped when it arrives.
    """

    def __init__(self, stores: Sequence[KvStore], files: Sequence[tuple[int, str, int]], budget: int | None = None):
        if budget is None:
            budget = fetch_budget(sum(f[2] for f in files), max((f[2] for f in files), default=0))
        self.budget = budget
        self.pool = _Pool(self.budget)
        self.jobs: list[tuple[_Job, concurrent.futures.Future[Any]]] = []
        self.used = False
        held = 0
        later: list[tuple[_Job, concurrent.futures.Future[Any]]] = []
        for si, fk, size in sorted(files, key=lambda f: (-f[2], f[0], f[1])):
            if size < PREFETCH_MIN_FILE:
                continue
            if stores[si].supports_read_parts:
                # parts arrive in the order asked for, each usable at once: whole files that
                # fit (no value is cut), or the first budget's worth of the first one
                if held + size > self.budget and self.jobs:
                    continue
                hi = min(size, self.budget - held)
                job = _Job(hi, [(si, fk, 0, hi, [])])
                self.jobs.append((job, _start_span(job, stores, self.pool)))
                held += hi
                continue
            lo = 0
            while lo < size and held < self.budget:
                # full-size requests: they arrive while the B+tree is still being read
                hi = min(size, lo + MAX_SPAN, lo + self.budget - held)
                job = _Job(hi - lo, [(si, fk, lo, hi, [])])
                if not self.jobs or not PREFETCH_FIRST_ALONE:
                    fut = _start_span(job, stores, self.pool)
                else:
                    fut = concurrent.futures.Future()
                    later.append((job, fut))
                self.jobs.append((job, fut))
                held += hi - lo
                lo = hi
        if later:
            # the first range alone, so that it arrives (and decoding starts) in a fraction of
            # the time all of them take sharing the link; the others once it is in
            def rest(_: Any) -> None:
                for job, fut in later:
                    try:
                        _chain(_start_span(job, stores, self.pool), fut)
                    except BaseException as e:  # noqa: BLE001 - the run loop raises it
                        fut.set_exception(e)

            self.jobs[0][1].add_done_callback(rest)

    @property
    def nbytes(self) -> int:
        """Bytes requested."""
        return sum(j.nbytes for j, _ in self.jobs)

    def spans(self) -> dict[tuple[int, str], list[_Job]]:
        """The requested ranges by ``(store index, data file)``, in file order."""
        out: dict[tuple[int, str], list[_Job]] = {}
        for job, _ in self.jobs:
            out.setdefault((job.spans[0][0], job.spans[0][1]), []).append(job)
        return out

    def wait(self) -> None:
        """Wait until every request has finished (their buffers are then free to reuse)."""
        concurrent.futures.wait([f for _, f in self.jobs])


class _Freed:
    """Bytes of parts let go by the decode workers, for the run loop to take back into its
    budget; :attr:`wake` finishes when there are some."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nbytes = 0
        self.wake: concurrent.futures.Future[None] = concurrent.futures.Future()

    def add(self, n: int) -> None:
        with self.lock:
            self.nbytes += n
            wake = self.wake
            if not wake.done():
                wake.set_result(None)

    def take(self) -> int:
        """The bytes let go since the last call (and a fresh :attr:`wake`)."""
        with self.lock:
            n, self.nbytes = self.nbytes, 0
            if self.wake.done():
                self.wake = concurrent.futures.Future()
            return n


def _decode(pool: Any, consume: Callable[[int, Any], None], answers: list[tuple[int, Any]]
            ) -> concurrent.futures.Future[Any]:
    """Call ``consume`` on each answer: on ``pool`` (a decode executor) in jobs of about
    :data:`DECODE_JOB_BYTES`, or right here without one.  The future finishes once all are
    done: with ``None``, a single job's error, or (several jobs, :func:`all_done`) the list of
    their outcomes."""
    def decode_all(some: list[tuple[int, Any]]) -> None:
        for i, v in some:
            try:
                consume(i, v)
            finally:
                if isinstance(v, PartView):
                    v.release()  # its parts are freed once every value over them is decoded

    if pool is None:
        decode_all(answers)
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        f.set_result(None)
        return f
    jobs: list[concurrent.futures.Future[Any]] = []
    lo = acc = 0
    for k, (_, v) in enumerate(answers):
        acc += len(v) if v is not None else 0
        if acc >= DECODE_JOB_BYTES:
            jobs.append(pool.submit(decode_all, answers[lo: k + 1]))
            lo, acc = k + 1, 0
    if lo < len(answers):
        jobs.append(pool.submit(decode_all, answers[lo:]))
    return jobs[0] if len(jobs) == 1 else all_done(jobs)


class RemoteSource:
    """Locates and fetches the chunk values of one item on a remote store.

    ``stores`` hold the data files named by ``table`` (one per database); ``kv`` is the
    item's array store, used for keys when ``table`` is ``None`` (no locations known).
    """

    def __init__(self, kv: KvStore, stores: Sequence[KvStore] = (), table: Mapping[str, Location] | None = None):
        self.kv = kv
        self.stores = list(stores)
        #: for OCDBT items: every key's location (inline values included), from one B+tree scan
        self.table = table

    @classmethod
    def for_ocdbt(cls, kv: KvStore, databases: Sequence[Any]) -> RemoteSource:
        """Scan the B+tree of each database (searched in order, first hit wins)."""
        table = LocationTable()
        stores: list[KvStore] = []
        for si, db in enumerate(databases):
            stores.append(db.kvstore)
            table.add(db, db.kvstore.url, si)
        return cls(kv, stores, table)

    # -- planning ----------------------------------------------------------------------------
    def _plan(self, keys: Sequence[str], size_hints: Sequence[int], prefetched: Prefetch | None = None
              ) -> tuple[list[_Job], list[tuple[int, Any]]]:
        """Jobs to fetch, and ``(index, value)`` answers known without a request.  Values lying
        wholly inside a ``prefetched`` range become members of that range's job instead."""
        ready: list[tuple[int, Any]] = []
        jobs: list[_Job] = []
        if self.table is None:
            batch: list[tuple[int, str]] = []
            acc = 0
            limit = max(1, fetch_budget() // 4)
            for i, k in enumerate(keys):
                if batch and (len(batch) >= KEYS_PER_BATCH or acc + size_hints[i] > limit):
                    jobs.append(_Job(acc, [], batch))
                    batch, acc = [], 0
                batch.append((i, k))
                acc += size_hints[i]
            if batch:
                jobs.append(_Job(acc, [], batch))
            return jobs, ready
        by_file: dict[tuple[int, str], list[tuple[int, int, int]]] = {}
        for i, k in enumerate(keys):
            loc = self.table.get(k)
            if loc is None:
                ready.append((i, None))
            elif loc.file is None:
                ready.append((i, loc.inline))
            elif loc.length == 0:
                ready.append((i, b""))
            else:
                by_file.setdefault((loc.store, loc.file), []).append((i, loc.offset, loc.length))
        pre = prefetched.spans() if prefetched is not None else {}
        for (si, fk), vals in by_file.items():
            vals.sort(key=lambda v: v[1])
            if pre.get((si, fk)):
                vals, split = _claim(vals, pre[(si, fk)], join=not self.stores[si].supports_read_parts)
                for v, first, second in split:
                    joined = _Job(v[2], [(si, fk, v[1], v[1] + v[2], [v])])
                    joined.pending = 2
                    first.feeds.append(joined)
                    second.feeds.append(joined)
            # the first requests are small, so decoding starts early; later ones up to MAX_SPAN
            def span() -> int:
                return MAX_SPAN if len(jobs) >= 8 else min(MAX_SPAN, FIRST_SPAN << len(jobs))

            for lo, hi, cur in merge_ranges(((v[1], v[1] + v[2], v) for v in vals), gap=GAP, max_span=span):
                assert hi is not None
                jobs.append(_Job(hi - lo, [(si, fk, lo, hi, cur)]))
        return jobs, ready

    # -- fetching ----------------------------------------------------------------------------
    def _start(self, job: _Job, pool: _Pool) -> concurrent.futures.Future[Any]:
        if job.keys is not None:
            kv = self.kv
            return shared("io").submit(kv.get_many, [k for _, k in job.keys])
        return _start_span(job, self.stores, pool)

    def _data(self, job: _Job, result: Any) -> memoryview:
        """The bytes of ``job``'s one range, checked to be all there."""
        si, fk, lo, hi, _ = job.spans[0]
        if job.buf is not None:
            got = result
            data: Any = None if got is None else job.buf.data[:got]
        else:
            data = result[0]
            got = None if data is None else len(data)
            if data is not None:
                data = memoryview(data)
        where = f"{self.stores[si].url.rstrip('/')}/{fk}"
        if data is None:
            raise CorruptionError(f"data file {fk!r} referenced by the database is missing", path=where)
        if got != hi - lo:
            raise CorruptionError(f"data file is truncated: wanted {hi - lo} bytes at offset {lo}, got {got}",
                                  path=where, offset=lo)
        return data  # type: ignore[no-any-return]

    def _answers(self, job: _Job, result: Any) -> list[tuple[int, Any]]:
        if job.keys is not None:
            return [(i, v) for (i, _), v in zip(job.keys, result)]
        _, _, lo, _, members = job.spans[0]
        if job.parts is not None:
            parts = job.parts
            return [(i, PartView(parts, off, off + n)) for i, off, n in members]
        data = self._data(job, result)
        return [(i, data[off - lo: off - lo + n]) for i, off, n in members]

    def _feed(self, job: _Job, result: Any, pool: _Pool) -> tuple[int, list[_Job]]:
        """Copy the part of each straddling value ``job``'s range holds into that value's
        buffer (taken from ``pool`` by whichever of its two ranges arrives first).  Returns the
        bytes newly taken and the values now complete."""
        data = np.frombuffer(self._data(job, result), dtype=np.uint8)
        lo, hi = job.spans[0][2], job.spans[0][3]
        taken = 0
        done: list[_Job] = []
        for joined in job.feeds:
            a, b = joined.spans[0][2], joined.spans[0][3]
            if joined.buf is None:
                joined.buf = pool.take(b - a)
                taken += b - a
            x, y = max(a, lo), min(b, hi)
            joined.buf[x - a: y - a] = data[x - lo: y - lo]
            joined.pending -= 1
            if joined.pending == 0:
                done.append(joined)
        job.feeds = []
        return taken, done

    def run(self, keys: Sequence[str], size_hints: Sequence[int], consume: Callable[[int, Any], None],
            prefetched: Prefetch | None = None) -> None:
        """Fetch the value of every key and call ``consume(index, value)`` for each, on the
        decode workers (``value``: a bytes-like object valid only during the call, or ``None``
        when the key is absent).  Returns when every value was consumed; re-raises the first
        error after every request started has finished.  ``prefetched`` (used once) supplies
        ranges already requested."""

        if prefetched is not None and (prefetched.used or self.table is None):
            prefetched = None
        jobs, ready = self._plan(keys, size_hints, prefetched)
        largest = max((j.nbytes for j in jobs), default=0)
        budget = fetch_budget(sum(j.nbytes for j in jobs), largest)
        if prefetched is not None:
            budget = max(budget, prefetched.budget)
        # per read: reuse within it, nothing kept after it
        buffers = prefetched.pool if prefetched is not None else _Pool(budget)
        pool = get_pool() if num_threads() > 1 else None
        queue = deque(jobs)
        fetching: dict[concurrent.futures.Future[Any], _Job] = {}
        decoding: dict[concurrent.futures.Future[Any], _Job | None] = {}
        held = 0

        # parts decoded and let go give their bytes back to the budget at once (the next
        # request starts while the last parts of a large chunk are still being decoded)
        freed = _Freed()

        def start_early(job: _Job) -> None:
            # values read in parts go to the decode workers at once: each is decoded as its
            # parts arrive (see PartView), while the rest of the read is on its way
            if pool is not None and job.parts is not None and job.spans[0][4]:
                job.early = True
                job.parts.on_free = freed.add
                submit_decode(self._answers(job, None), job)

        def finished(job: _Job) -> None:
            nonlocal held
            held -= job.nbytes - (job.parts.freed if job.parts is not None and job.early else 0)
            job.parts = None
            if job.buf is not None:
                buffers.give(job.buf)
                job.buf = None

        def submit_decode(answers: list[tuple[int, Any]], job: _Job | None) -> None:
            decoding[_decode(pool, consume, answers)] = job

        try:
            if prefetched is not None:
                prefetched.used = True
                for job, fut in prefetched.jobs:
                    held += job.nbytes
                    fetching[fut] = job
                    start_early(job)
            for lo in range(0, len(ready), 256):
                submit_decode(ready[lo: lo + 256], None)
            while queue or fetching or decoding:
                held -= freed.take()
                while queue and len(fetching) < MAX_REQUESTS and (
                        held + queue[0].nbytes <= budget or not (fetching or decoding)):
                    job = queue.popleft()
                    held += job.nbytes
                    fetching[self._start(job, buffers)] = job
                    start_early(job)
                waits = list(fetching) + list(decoding)
                if queue:
                    waits.append(freed.wake)
                done, _ = concurrent.futures.wait(waits, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    if f is freed.wake:
                        continue
                    if f in fetching:
                        job = fetching.pop(f)
                        if job.early:  # its values are being decoded already
                            continue
                        if job.feeds:  # a prefetched range holding part of a straddling value
                            taken, joined = self._feed(job, f.result(), buffers)
                            held += taken
                            for jj in joined:
                                submit_decode(self._answers(jj, jj.spans[0][3] - jj.spans[0][2]), jj)
                        if job.keys is None and not job.spans[0][4]:  # a prefetched range nothing fell in
                            finished(job)
                            continue
                        submit_decode(self._answers(job, f.result()), job)
                    else:
                        dj = decoding.pop(f)
                        res = f.result()  # raises a single part's error
                        if isinstance(res, list):  # several parts (all_done): the first error
                            err = next((r for r in res if isinstance(r, BaseException)), None)
                            if err is not None:
                                raise err
                        if dj is not None:
                            finished(dj)
        except BaseException:
            queue.clear()
            # buffers may still be written into: let every started request finish first
            concurrent.futures.wait(list(fetching) + list(decoding))
            raise
