"""Reading the Zarr arrays of a PyTree item: batched metadata, batched small arrays, regions.

Orbax stores every array leaf as a Zarr array under ``<param name>/``.  Restoring thousands
of small arrays one by one would pay one storage round trip (and, for OCDBT, one B-tree
descent) per metadata file and per chunk, so a whole-item read

* parses each distinct metadata document once (layers of a model repeat them),
* fetches the single chunk of many small arrays with one ``get_many`` per batch and decodes
  them on the worker pool (:mod:`.singles`: neighbours in a data file share slabs and are
  decoded a run at a time, :mod:`.slabs`), while the previous batch is handed out and the
  next one is fetched,
* streams the chunks of all large arrays through one bounded fetch -> decode pipeline,
* for items on the local filesystem, reads through :mod:`ocdbt_py.checkpoint.restore.localread`
  (coalesced ``preadv`` into reused buffers, ``mmap`` for large chunks) instead of allocating
  fresh buffers for every value,
* and, for items anywhere else (object stores, fsspec URLs, any other :class:`KvStore`),
  sends the chunks of all arrays through :mod:`ocdbt_py.checkpoint.restore.remoteread`: located once,
  merged across arrays into few range reads, fetched within a byte budget, decoded as they
  arrive.

Region reads (lazy arrays, JAX targets) go through :mod:`zarr3`, which touches only the
chunks a selection needs.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.restore import remoteread
from ocdbt_py.checkpoint.restore.gcpause import paused_gc
from ocdbt_py.checkpoint.restore.localread import LocalSource, Placement
from ocdbt_py.checkpoint.restore.locations import LocationTable
from ocdbt_py.checkpoint.restore.pages import HUGE_MIN, output_pages
from ocdbt_py.checkpoint.restore.remoteread import PartView, Prefetch, RemoteSource
from ocdbt_py.checkpoint.restore.singles import SingleBatch
from ocdbt_py.checkpoint.restore.storage import ArrayStore
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, normalize_request, slice_range
from ocdbt_py.kvstore.prefixed import PrefixStore
from ocdbt_py.kvstore.wrapper import WrapperStore
from zarr3.array import Array
from zarr3.engine.alloc import empty
from zarr3.engine.executor import num_threads, run_pipeline
from zarr3.errors import ChunkNotFoundError, MetadataError
from zarr3.metadata_v2 import parse_zarray
from zarr3.metadata_v3 import ArrayMetadataV3, parse_zarr_json
from zarr3.stored import DENSE_MAX, first_missing, stored_chunks

__all__ = ["ArrayReader", "LazyArray", "OverlayStore"]

#: A fetched batch: its keys, their values (``None`` if absent), the callback releasing a
#: value's buffer once decoded (``None`` for plain ``bytes``), and where the values lie in the
#: buffers they were read into (local reads, see :class:`~.localread.Placement`; else ``None``).
Fetched = tuple[list[str], list[Any], "Callable[[int], None] | None", "Placement | None"]

#: Bytes of (decoded) small arrays whose chunks are fetched in one batch (two batches are in
#: memory at a time: one decoding, the next being fetched).
BATCH_BYTES = 32 << 20
#: Arrays at most this large are batched; larger ones are streamed one at a time.
SMALL_ARRAY_BYTES = 8 << 20
#: Fetched chunk bytes held at a time while large arrays stream (besides the outputs).
IN_FLIGHT_BYTES = 64 << 20
#: Largest number of chunk keys prefetched for one small array (beyond: streamed).
MAX_PREFETCH_CHUNKS = 4096
#: an OCDBT data file: ``d/<name>`` (possibly below an ``ocdbt.process_<i>/`` directory)
_DATA_FILE = re.compile(r"(?:^|/)d/[^/]+$")


class OverlayStore(WrapperStore):
    """A read-only view of ``base`` in which some values were fetched in advance.

    ``cache`` maps keys to their value, or to ``None`` for keys known to be absent; other keys
    are read from ``base``.  Capabilities that would read around the cache (direct file or
    buffer reads, read-ahead) or write are withheld; values come from memory (not remote).
    """

    withheld = frozenset({
        "exists", "size", "local_path", "no_follow_root", "fsspec_location", "supports_read_into",
        "read_into", "supports_read_parts", "read_parts", "supports_read_ahead", "read_ahead", "is_remote", "set",
        "set_parts", "delete", "delete_prefix", "get_with_generation", "set_if", "syncs_later", "note_written",
        "supports_conditional_writes", "close",
    })

    def __init__(self, base: KvStore, cache: dict[str, bytes | None]):
        super().__init__(base)
        self.read_only = True
        self.cache = cache

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        if key in self.cache:
            v = self.cache[key]
            return None if v is None else slice_range(v, byte_range)
        return self.base.get(key, byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        out: list[bytes | None] = [None] * len(reqs)
        miss: list[int] = []
        for i, (k, r) in enumerate(reqs):
            if k in self.cache:
                v = self.cache[k]
                out[i] = None if v is None else slice_range(v, r)
            else:
                miss.append(i)
        if miss:
            for i, v in zip(miss, self.base.get_many([reqs[i] for i in miss])):
                out[i] = v
        return out


#: Parsed Zarr metadata by (file name, raw bytes): checkpoints repeat the same metadata for
#: many arrays (every layer of a model), and metadata objects are read-only once parsed.
_PARSED: dict[tuple[str, bytes], Any] = {}
_PARSED_MAX = 4096


def parse_zarr_metadata(name: str, raw: bytes) -> Any:
    """Parse ``.zarray`` / ``zarr.json`` bytes (cached by content)."""
    key = (name, raw)
    hit = _PARSED.get(key)
    if hit is not None:
        return hit

    meta = parse_zarr_json(raw) if name == "zarr.json" else parse_zarray(raw)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[key] = meta
    return meta


def _all_chunk_keys(meta: Any) -> Iterator[str]:
    grid = [math.ceil(s / c) if c else 0 for s, c in zip(meta.shape, meta.chunk_shape)]
    for coords in itertools.product(*(range(n) for n in grid)):
        yield meta.chunk_key(coords)


def _nchunks(meta: Any) -> int:
    return math.prod(math.ceil(s / c) if c else 0 for s, c in zip(meta.shape, meta.chunk_shape))


def _nbytes(meta: Any) -> int:
    return math.prod(meta.shape) * meta.data_type.dtype.itemsize


def start_prefetch(store: ArrayStore, sizes: dict[str, int]) -> Prefetch | None:
    """A :class:`Prefetch` of the data files of ``store``'s OCDBT databases (named, with their
    sizes, by the item directory's listing), or ``None`` where it does not apply: not an
    object store, no databases, no sizes, or ``OCDBT_PY_PREFETCH=0``."""
    if os.environ.get("OCDBT_PY_PREFETCH", "1") in ("0", "false", "no"):
        return None
    item_kv = store.item_kv
    if not sizes or not store.databases or item_kv is None or not item_kv.supports_read_ahead:
        return None
    files: list[tuple[int, str, int]] = []
    claimed: set[str] = set()
    for si, prefix in enumerate(store.db_prefixes):
        pre = prefix.rstrip("/") + "/" if prefix else ""
        for path, size in sizes.items():
            if path.startswith(pre) and path not in claimed and _DATA_FILE.search(path) and size > 0:
                claimed.add(path)
                files.append((si, path[len(pre):], size))
    if not files:
        return None
    return Prefetch([db.kvstore for db in store.databases], files)


class ArrayReader:
    """Opens and reads the Zarr arrays of one item.

    ``fill_missing`` is ``False`` for checkpoints written with
    ``store_array_data_equal_to_fill_value`` (a missing chunk is then an error, as in Orbax).
    ``zarr3`` says which metadata file to try first.
    """

    def __init__(self, store: ArrayStore, *, fill_missing: bool, zarr3: bool):
        self.store = store
        self.kv = store.kv
        self.fill_missing = fill_missing
        self.prefer_v3 = zarr3
        self._meta: dict[str, Any] = {}
        self._local: LocalSource | None | bool = False  # False: not looked at yet
        self._remote: RemoteSource | None = None
        self._prefetch: Prefetch | None = None
        self._stored: dict[str, list[tuple[int, ...]]] = {}

    def _table(self) -> Mapping[str, Any] | None:
        """Key -> location of every key, if a whole-item read already scanned the B+tree."""
        src = self._local
        if isinstance(src, LocalSource):
            return src.table
        return self._remote.table if self._remote is not None else None

    def remote_source(self) -> RemoteSource:
        """Located, coalesced, budgeted fetches for items not on the local filesystem (one
        scan of the B+tree, done on first use, locates every chunk and metadata value)."""
        if self._remote is None:
            if self.store.databases:
                with paused_gc():  # thousands of entries, all alive: nothing for the collector
                    self._remote = RemoteSource.for_ocdbt(self.kv, self.store.databases)
            else:
                self._remote = RemoteSource(self.kv)
        return self._remote

    def prefetch_all(self, sizes: dict[str, int]) -> bool:
        """Start fetching the item's data files (``sizes``: the listing's sizes of the files
        below the item directory) before their contents are located, for a restore that will
        read every array of an OCDBT item from a remote store; ``False`` where that does not
        apply (see :func:`start_prefetch`).  The next whole read uses what arrives."""
        if self._prefetch is not None or self.local_source() is not None:
            return False
        self._prefetch = start_prefetch(self.store, sizes)
        return self._prefetch is not None

    def local_source(self) -> LocalSource | None:
        """Fast local-file reads, when the item is on the local filesystem (else ``None``)."""
        if self._local is False:
            src: LocalSource | None = None
            item_kv = self.store.item_kv
            root = item_kv.local_path() if item_kv is not None else None  # through prefix views
            if item_kv is not None and root is not None:
                anchor = item_kv.no_follow_root()
                if self.store.databases:
                    src = LocalSource.for_ocdbt([(os.path.join(root, *p.split("/")) if p else root, db)
                                                 for p, db in zip(self.store.db_prefixes, self.store.databases)],
                                                anchor)
                else:
                    src = LocalSource.for_dirs(root, anchor)
            self._local = src
        return self._local if isinstance(self._local, LocalSource) else None

    # -- metadata ------------------------------------------------------------------------------
    def _parse(self, param: str, name: str, raw: bytes) -> Any:

        try:
            meta = parse_zarr_metadata(name, raw)
        except MetadataError as e:
            raise CorruptionError(f"array {param!r}: {e}", path=f"{self.kv.url.rstrip('/')}/{param}/{name}") from e
        if meta.zarr_format == 3 and not isinstance(meta, ArrayMetadataV3):
            raise CorruptionError(f"{param}/zarr.json describes a group, not an array", path=self.kv.url)
        return meta

    def metadata_many(self, params: Sequence[str]) -> list[Any]:
        """Zarr metadata of each param (fetched in one batch; cached)."""
        todo = [p for p in dict.fromkeys(params) if p not in self._meta]
        if todo:
            names = ("zarr.json", ".zarray") if self.prefer_v3 else (".zarray", "zarr.json")
            pending = todo
            table = self._table()
            for name in names:
                if not pending:
                    break
                if table is not None:  # the B+tree was scanned already: inline values are there
                    keys = [f"{p}/{name}" for p in pending]
                    if isinstance(table, LocationTable):
                        got, out_of_line = table.inline_values(keys)
                    else:
                        locs = [table.get(k) for k in keys]
                        got = [None if loc is None else loc.inline for loc in locs]
                        out_of_line = any(loc is not None and loc.inline is None for loc in locs)
                    if out_of_line:
                        got = self.kv.get_many(keys)
                else:
                    got = self.kv.get_many([f"{p}/{name}" for p in pending])
                nxt = []
                for p, raw in zip(pending, got):
                    if raw is None:
                        nxt.append(p)
                    else:
                        self._meta[p] = self._parse(p, name, raw)
                pending = nxt
            if pending:
                raise CorruptionError(
                    f"no Zarr metadata (.zarray or zarr.json) for {len(pending)} array(s), e.g. "
                    f"{pending[0]!r}; the checkpoint is incomplete (was it copied without all files?)",
                    path=self.kv.url,
                )
        return [self._meta[p] for p in params]

    def metadata(self, param: str) -> Any:
        """Zarr metadata of one param."""
        return self.metadata_many([param])[0]

    # -- arrays --------------------------------------------------------------------------------
    def array(self, param: str, kv: KvStore | None = None) -> Any:
        """The :class:`zarr3.Array` of ``param``."""

        meta = self.metadata(param)
        return Array(PrefixStore(kv or self.kv, param), meta, mode="r", fill_missing=self.fill_missing)

    def read(self, param: str, selection: Any = Ellipsis, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read ``selection`` of one array (only the chunks it touches)."""
        return self._wrap(param, lambda: self.array(param).read(selection, out=out))

    def _wrap(self, param: str, fn: Any) -> Any:

        try:
            return fn()
        except ChunkNotFoundError as e:
            raise CorruptionError(
                f"array {param!r}: {e} (the checkpoint stores every chunk, so a missing one means "
                f"it is damaged or incomplete)",
                path=self.kv.url,
            ) from e

    def read_many(self, params: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(param, whole array)`` for every param (in no particular order).

        Arrays stored as one chunk (most arrays of a checkpoint) are fetched in batches of up to
        :data:`BATCH_BYTES` and decoded straight into their output on the worker threads; other
        small arrays are batched too; large ones stream chunk by chunk through :mod:`zarr3`.
        The next batch is fetched while the current one decodes (see :mod:`.singles`).
        """
        if self.local_source() is None:  # one B+tree scan locates every chunk (and holds the metadata)
            # remote: every chunk of every array through one located, coalesced, budgeted fetch
            self.remote_source()
            for (p, _, _), a in self.read_rows([(p, None, None) for p in params]):
                yield p, a
            return
        with paused_gc():
            plan = self._plan(params)
        if len(plan) <= 1:
            for kind, payload in plan:
                yield from self._run_step(kind, payload, None)
            return
        # Batch i decodes on the workers while the main thread fetches batch i + 1 and hands
        # out batch i - 1's arrays.  Fetching a local batch is Python work (locating, mapping),
        # so a thread of its own for it bought nothing: it only contended for the GIL (a fetch
        # took 10-16 ms there instead of 4-5 ms, for the same total).
        ahead: Fetched | None = None
        decoding: list[SingleBatch] = []
        try:
            for i, (kind, payload) in enumerate(plan):
                fetched, ahead = ahead, None
                if kind != "single":
                    while decoding:
                        yield from decoding.pop(0).results()
                    yield from self._run_step(kind, payload, fetched)
                    continue
                decoding.append(self._single(payload, fetched if fetched is not None else self._fetch(kind, payload)))
                if i + 1 < len(plan) and plan[i + 1][0] != "big":
                    ahead = self._fetch(*plan[i + 1])
                if len(decoding) > 1:
                    yield from decoding.pop(0).results()
            while decoding:
                yield from decoding.pop(0).results()
        finally:
            for batch in decoding:
                batch.abandon()
            if ahead is not None and ahead[3] is not None:
                ahead[3].release_all()

    def _plan(self, params: Sequence[str]) -> list[tuple[str, Any]]:
        """Split the arrays into ``("single", batch)``, ``("multi", batch)`` and ``("big", param)``."""
        metas = self.metadata_many(params)
        plan: list[tuple[str, Any]] = []
        single: list[tuple[str, Any]] = []
        multi: list[tuple[str, Any]] = []
        big: list[str] = []
        single_bytes = multi_bytes = 0
        sizes: dict[int, tuple[int, int]] = {}  # id(meta) -> (bytes, chunks): metadata repeats
        for p, m in zip(params, metas):
            sz = sizes.get(id(m))
            if sz is None:
                sz = sizes[id(m)] = (_nbytes(m), _nchunks(m))
            nb, n = sz
            if n == 1 and nb <= SMALL_ARRAY_BYTES:
                if single and single_bytes + nb > BATCH_BYTES:
                    plan.append(("single", single))
                    single, single_bytes = [], 0
                single.append((p, m))
                single_bytes += nb
            elif nb <= SMALL_ARRAY_BYTES and n <= MAX_PREFETCH_CHUNKS:
                if multi and multi_bytes + nb > BATCH_BYTES:
                    plan.append(("multi", multi))
                    multi, multi_bytes = [], 0
                multi.append((p, m))
                multi_bytes += nb
            else:
                big.append(p)
        if single:
            plan.append(("single", single))
        if multi:
            plan.append(("multi", multi))
        if big:
            plan.append(("big", big))
        return plan

    @staticmethod
    def _batch_keys(kind: str, batch: list[tuple[str, Any]]) -> list[str]:
        if kind == "single":
            first: dict[int, str] = {}  # id(meta) -> its chunk (0, ...): metadata repeats
            keys = []
            for p, m in batch:
                ck = first.get(id(m))
                if ck is None:
                    ck = first[id(m)] = m.chunk_key((0,) * len(m.shape))
                keys.append(f"{p}/{ck}")
            return keys
        return [f"{p}/{k}" for p, m in batch for k in _all_chunk_keys(m)]

    def _fetch(self, kind: str, payload: Any) -> Fetched:
        keys = self._batch_keys(kind, payload)
        local = self.local_source() if kind == "single" else None
        if local is not None:
            where = Placement(len(keys))
            datas, done = local.fetch(keys, where)
            return keys, datas, done, where
        return keys, list(self.kv.get_many(keys)), None, None

    def _run_step(self, kind: str, payload: Any, fetched: Fetched | None) -> Iterator[tuple[str, np.ndarray]]:
        if kind == "big":
            yield from self._read_whole(payload)
            return
        if kind == "single":
            yield from self._single(payload, fetched if fetched is not None else self._fetch(kind, payload)).results()
            return
        keys, datas, _, _ = fetched if fetched is not None else self._fetch(kind, payload)
        overlay = OverlayStore(self.kv, dict(zip(keys, datas)))
        for p, _ in payload:
            yield p, self._wrap(p, lambda p=p: self.array(p, overlay).read())

    def _single(self, batch: list[tuple[str, Any]], fetched: Fetched) -> SingleBatch:
        """Start decoding a batch of single-chunk arrays (see :mod:`.singles`)."""
        keys, datas, done, where = fetched
        return SingleBatch(batch, keys, datas, done, where, fill_missing=self.fill_missing, url=self.kv.url)

    def _read_whole(self, params: list[str]) -> Iterator[tuple[str, np.ndarray]]:
        """Large arrays, whole: the chunks of all of them flow through one bounded fetch ->
        decode pipeline (no drain between arrays), each decoded straight into its output."""
        for (p, _, _), a in self.read_rows([(p, None, None) for p in params]):
            yield p, a

    def read_rows(self, requests: Sequence[tuple[str, int | None, int | None]]
                  ) -> list[tuple[tuple[str, int | None, int | None], np.ndarray]]:
        """Rows ``[start, stop)`` (first axis; ``None`` = all) of several arrays, read through
        one bounded pipeline.  ``start`` and ``stop`` must fall on chunk boundaries (or the
        array's end), so that every chunk is decoded once, straight into its output."""
        # many small objects, all alive until the end: nothing for the collector to find; and
        # outputs on huge pages where the kernel has them free, else ordinary pages (see .pages)
        metas = self.metadata_many([p for p, _, _ in requests])
        big = sum(n for m in metas if (n := _nbytes(m)) >= HUGE_MIN)
        with paused_gc(), output_pages(big):
            return self._read_rows(requests)

    def _read_rows(self, requests: Sequence[tuple[str, int | None, int | None]]
                   ) -> list[tuple[tuple[str, int | None, int | None], np.ndarray]]:

        results: list[tuple[tuple[str, int | None, int | None], np.ndarray]] = []
        units: list[tuple[str, str, Any, np.ndarray, tuple[slice, ...], tuple[slice, ...] | None]] = []
        biggest = 1
        fast = self.local_source()
        metas = self.metadata_many([p for p, _, _ in requests])  # one batch, not one request per array
        whole_key: dict[int, str] = {}  # id(meta) -> key of its chunk (0, ...): metadata repeats
        for req, m in zip(requests, metas):
            p, r0, r1 = req
            shape = tuple(m.shape)
            cs = tuple(m.chunk_shape)
            if r0 is None and r1 is None and shape == cs:  # the common case: one chunk, no edge
                out = empty(shape, m.data_type.dtype, f"restoring array {p!r}")
                results.append((req, out))
                biggest = max(biggest, out.nbytes)
                ck = whole_key.get(id(m))
                if ck is None:
                    ck = whole_key[id(m)] = m.chunk_key((0,) * len(shape))
                units.append((f"{p}/{ck}", p, m, out, (), None))
                continue
            lo = 0 if r0 is None or not shape else r0
            hi = (shape[0] if shape else 0) if r1 is None or not shape else min(r1, shape[0])
            if shape and (lo % cs[0] or (hi % cs[0] and hi != shape[0]) or lo > hi):
                raise ValueError(f"rows [{lo}, {hi}) of {p!r} do not fall on chunk boundaries of {cs[0]}")
            out_shape = ((hi - lo,) + shape[1:]) if shape else ()
            out = empty(out_shape, m.data_type.dtype, f"restoring array {p!r}")
            results.append((req, out))
            biggest = max(biggest, math.prod(cs) * out.dtype.itemsize)
            grid = [range(-(-s // c)) if c else range(0) for s, c in zip(shape, cs)]
            if shape:
                grid[0] = range(lo // cs[0], -(-hi // cs[0])) if cs[0] else range(0)
            # a large declared grid: only what is stored (itertools.product would also copy
            # every range into a tuple first)
            big = math.prod(len(g) for g in grid) > DENSE_MAX
            for coords in self._stored_in(p, m, grid, out) if big else itertools.product(*grid):
                sl = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, cs, shape))
                edge = any(x.stop - x.start != c for x, c in zip(sl, cs))
                local = tuple(slice(0, x.stop - x.start) for x in sl) if edge else None
                if shape:
                    sl = (slice(sl[0].start - lo, sl[0].stop - lo),) + sl[1:]
                units.append((f"{p}/{m.chunk_key(coords)}", p, m, out, sl, local))

        def handle(unit: tuple[str, str, Any, np.ndarray, tuple[slice, ...], tuple[slice, ...] | None],
                   got: Any) -> list[Callable[[], None]]:
            key, p, m, out, sl, local = unit
            region = out[sl + (Ellipsis,)]
            data, release = got if type(got) is tuple else (got, None)
            if release is not None:
                return [_then(_decode_job(m, data, region, local), release)]
            if data is None:
                fv = self._missing_chunk(p, key, m)
                return [lambda: region.__setitem__(Ellipsis, fv)]
            return [_decode_job(m, data, region, local)]

        if fast is None:
            self._fetch_remote(units)
            return results

        # keep about IN_FLIGHT_BYTES of fetched chunks in memory at a time
        workers = num_threads()
        per_batch = max(1, min(workers, IN_FLIGHT_BYTES // (3 * biggest)))
        source: Any = self.kv if fast is None else _LocalFetcher(fast)
        run_pipeline(source, units, lambda u: (u[0], None), handle, batch=per_batch,
                     max_pending=max(1, min(2 * workers, IN_FLIGHT_BYTES // (2 * biggest))))
        return results

    def stored(self, param: str, meta: Any) -> list[tuple[int, ...]]:
        """Sorted grid positions of the chunks of ``param`` that are stored (one listing of the
        array's keys, cached: a directory walk, a B+tree range or an object listing)."""
        got = self._stored.get(param)
        if got is None:
            got = self._stored[param] = stored_chunks(self.kv, meta, f"{param}/")
        return got

    def _stored_in(self, param: str, meta: Any, grid: list[range], out: np.ndarray) -> list[tuple[int, ...]]:
        """The stored chunks of the box ``grid`` of a large grid; the first missing one is
        :class:`CorruptionError` at once where every chunk must be stored, else ``out`` gets
        the fill value once (the stored chunks are then decoded over it)."""
        found = [c for c in self.stored(param, meta) if all(i in g for i, g in zip(c, grid))]
        if len(found) < math.prod(len(g) for g in grid):
            if not self.fill_missing:
                gap = first_missing(grid, found)
                assert gap is not None
                self._missing_chunk(param, f"{param}/{meta.chunk_key(gap)}", meta)
            out[...] = self._missing_chunk(param, "", meta)
        return found

    def _missing_chunk(self, param: str, key: str, meta: Any) -> Any:
        """The value an absent chunk reads as (its fill value) where absent chunks are allowed;
        otherwise the checkpoint is damaged: :class:`CorruptionError`."""
        if not self.fill_missing:
            raise CorruptionError(f"array {param!r}: chunk {key!r} is missing (the checkpoint stores every "
                                  f"chunk, so a missing one means it is damaged or incomplete)", path=self.kv.url)
        fv = meta.fill_value
        return 0 if fv is None else fv

    def _fetch_remote(self, units: Sequence[tuple[str, str, Any, np.ndarray, tuple[slice, ...],
                                                  tuple[slice, ...] | None]]) -> None:
        """Fetch and decode ``units`` through :class:`RemoteSource` (see :mod:`.remoteread`)."""
        src = self.remote_source()

        def consume(i: int, data: Any) -> None:
            key, p, m, out, sl, local = units[i]
            region = out[sl + (Ellipsis,)]
            if data is None:
                region[...] = self._missing_chunk(p, key, m)
                return
            try:
                if isinstance(data, PartView):  # read in parts: decoded as they arrive where it can be
                    if local is None and data.nbytes >= remoteread.STREAM_MIN and m.chain.streams_into(region):
                        m.chain.decode_stream_into(data, region)
                        return
                    data = data.whole()
                _decode_job(m, data, region, local)()
            except CorruptionError as e:
                raise CorruptionError(f"array {p!r}: {e.reason}", path=self.kv.url) from e

        hints = [math.prod(u[2].chunk_shape) * u[3].dtype.itemsize for u in units]
        pre, self._prefetch = self._prefetch, None
        src.run([u[0] for u in units], hints, consume, pre)


class _LocalFetcher:
    """``get_many`` for zarr3's pipeline over a :class:`LocalSource`: each value comes with the
    function that returns its buffer to the pool once decoded."""

    def __init__(self, local: LocalSource):
        self.local = local

    def get_many(self, requests: Sequence[Any]) -> list[Any]:
        keys = [r[0] if isinstance(r, tuple) else r for r in requests]
        datas, done = self.local.fetch(keys)
        return [None if d is None else (d, (lambda i=i: done(i))) for i, d in enumerate(datas)]


def _decode_job(m: Any, data: Any, region: np.ndarray, local: tuple[slice, ...] | None) -> Callable[[], None]:
    if local is None:
        return lambda: m.chain.decode_into(data, region)
    return lambda: np.copyto(region, m.chain.decode(data)[local], casting="no")


def _then(job: Callable[[], None], after: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            job()
        finally:
            after()
    return run


class LazyArray:
    """An array in a checkpoint, read when converted (``np.asarray``) or sliced.

    Has ``shape``, ``dtype``, ``ndim``, ``size``, ``nbytes`` and ``chunks`` without reading
    any data; ``a[...]`` / ``np.asarray(a)`` read everything, ``a[i:j]`` reads only the chunks
    the slice touches.
    """

    def __init__(self, reader: ArrayReader, param: str, *, cast: np.dtype | None = None):
        self._reader = reader
        self.param = param
        self._meta = reader.metadata(param)
        self._cast = cast

    @property
    def shape(self) -> tuple[int, ...]:
        """Array shape."""
        return tuple(self._meta.shape)

    @property
    def dtype(self) -> np.dtype:
        """NumPy dtype of the data returned."""
        return self._cast if self._cast is not None else self._meta.data_type.dtype

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._meta.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._meta.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array in memory."""
        return self.size * self.dtype.itemsize

    @property
    def chunks(self) -> tuple[int, ...]:
        """Storage chunk shape."""
        return tuple(self._meta.chunk_shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def read(self, selection: Any = Ellipsis) -> np.ndarray:
        """Read ``selection`` (NumPy basic indexing) from storage."""
        a = self._reader.read(self.param, selection)
        return a if self._cast is None else a.astype(self._cast)

    def __getitem__(self, selection: Any) -> np.ndarray:
        return self.read(selection)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"LazyArray({self.param!r}, shape={self.shape}, dtype={self.dtype})"
