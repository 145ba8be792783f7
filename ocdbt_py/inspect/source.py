"""The arrays of a checkpoint as named tensors, and their stored chunks fetched and decoded in
parallel with bounded memory.

:func:`open_checkpoint` accepts what :func:`ocdbt_py.checkpoint.restore` accepts (an item
directory, a step directory, a CheckpointManager root with ``step``) and lists every numeric
leaf as a :class:`Tensor` with its dotted name (items of a step directory get their item name in
front, as ``ocdbt export`` names them).  :func:`run_chunks` streams a set of chunk units through
a thread pool: each task fetches a few chunks with one ``get_many`` and reduces them to a small
result, so at most a few chunks per worker are in memory at a time.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import fnmatch
import functools
import itertools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from ocdbt_py import pools
from ocdbt_py.checkpoint.dtypes import ML_DTYPE_NAMES
from ocdbt_py.checkpoint.layout import Kind
from ocdbt_py.checkpoint.meta import LeafMetadata, item_metadata
from ocdbt_py.checkpoint.restore.api import PathLike, Resolved, resolve
from ocdbt_py.checkpoint.restore.item import ARRAY, INLINE, SCALAR, PyTreeItem
from ocdbt_py.errors import CorruptionError, NotFoundError
from ocdbt_py.kvstore.prefixed import PrefixStore
from zarr3.stored import DENSE_MAX, first_missing

__all__ = ["Tensor", "Checkpoint", "ChunkUnit", "open_checkpoint", "chunk_units", "run_chunks",
           "numeric_view", "is_float", "default_workers", "task_bytes", "Fetched", "fetch_raw", "same_bytes",
           "decode", "group_units", "Scratch"]

T = TypeVar("T")
R = TypeVar("R")

#: Decoded bytes of the chunks one task handles (small chunks are grouped up to this).
TASK_BYTES = 4 << 20
#: Most chunks in one task.
TASK_CHUNKS = 256
#: Decoded bytes of the tasks in flight at a time (beyond the first; see :func:`run_chunks`).
IN_FLIGHT_BYTES = 128 << 20


#: Threads at least, when some chunks come from a remote store (they mostly wait on it).
REMOTE_WORKERS = 8


def default_workers(remote: bool = False) -> int:
    """Worker threads for fetching, decoding and reducing chunks: ``pools.size("inspect")``
    (the CPU count), at least :data:`REMOTE_WORKERS` for remote stores."""
    n = pools.size("inspect")
    return max(n, REMOTE_WORKERS) if remote else n


def is_float(dt: np.dtype) -> bool:
    """Whether ``dt`` is a floating-point type (NumPy's or an ml_dtypes one such as bfloat16)."""
    return dt.kind == "f" or (dt.name in ML_DTYPE_NAMES and dt.name.startswith(("bfloat", "float")))


def numeric_view(a: np.ndarray) -> np.ndarray | None:
    """``a`` as a type NumPy computes with: ml_dtypes floats as float32 (exact), ml_dtypes
    integers (int4, ...) as int8/uint8, bool as uint8; ``None`` for types without an order
    (complex, structured, strings)."""
    dt = a.dtype
    if dt.name in ML_DTYPE_NAMES:
        if dt.name.startswith("uint"):
            return a.astype(np.uint8)
        if dt.name.startswith("int"):
            return a.astype(np.int8)
        return a.astype(np.float32)
    if dt.kind == "b":
        return a.view(np.uint8)
    if dt.kind in "iuf":
        return a
    return None


@dataclasses.dataclass
class Tensor:
    """One numeric leaf of a checkpoint.

    ``name`` is dotted (``params.layer0.kernel``); ``path`` its parts (for trees).  ``item`` and
    ``param`` say where a stored array lives (``None`` for an inline value, held in
    ``value``).  ``meta`` is the leaf's :class:`LeafMetadata` (sizes, codecs).
    """

    name: str
    path: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    meta: LeafMetadata | None
    item: PyTreeItem | None = None
    param: str | None = None
    value: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Size in memory."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def stored_bytes(self) -> int | None:
        """Size on storage (``None`` when unknown)."""
        if self.item is None:
            return 0
        return self.meta.stored_bytes if self.meta is not None else None

    def zarr(self) -> Any:
        """The Zarr metadata of a stored array (``None`` for inline values)."""
        if self.item is None or self.param is None:
            return None
        return self.item.reader.metadata(self.param)

    def read(self, selection: tuple[slice, ...]) -> np.ndarray:
        """Read a region (only the chunks it touches)."""
        if self.value is not None:
            return np.asarray(self.value[selection])
        assert self.item is not None and self.param is not None
        return self.item.reader.read(self.param, selection)


class Checkpoint:
    """The tensors of one checkpoint location (see :func:`open_checkpoint`); close it after use."""

    def __init__(self, resolved: Resolved, tensors: list[Tensor], items: list[tuple[str, PyTreeItem]]):
        self.resolved = resolved
        self.tensors = tensors
        self.items = items

    @property
    def step(self) -> int | None:
        """The step read, when the location was a manager root."""
        return self.resolved.step

    @property
    def remote(self) -> bool:
        """Whether the checkpoint is on a remote store (object store, HTTP, ...)."""
        return bool(self.resolved.kv.is_remote)

    def by_name(self) -> dict[str, Tensor]:
        """``{name: tensor}``."""
        return {t.name: t for t in self.tensors}

    def close(self) -> None:
        """Release the items' array stores."""
        for _, it in self.items:
            it.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _items(r: Resolved) -> list[tuple[str, PyTreeItem]]:
    if r.kind == Kind.PYTREE:
        return [("", PyTreeItem(r.kv, listing=r.listing))]
    if r.kind != Kind.STEP:
        raise NotFoundError(f"{r.kv.url} holds no arrays (a {r.kind.value} item)")
    items = r.items()
    names = [n for n, k in items.items() if k == Kind.PYTREE]
    single = r.single_item(items)
    return [("" if n == single else n, PyTreeItem(PrefixStore(r.kv, n), listing=r.item_listings.get(n)))
            for n in names]


def _flatten(tree: Any) -> list[LeafMetadata]:
    out: list[LeafMetadata] = []
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, LeafMetadata):
            out.append(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return out


def _wanted(name: str, include: Sequence[str] | None) -> bool:
    return not include or any(fnmatch.fnmatchcase(name, g) for g in include)


def open_checkpoint(path: PathLike, *, step: int | None = None, storage_options: dict[str, Any] | None = None,
                    include: Sequence[str] | None = None, stored_sizes: bool | None = False) -> Checkpoint:
    """The numeric tensors of a checkpoint (metadata only; no array data read).

    ``include``: glob patterns on dotted names (any may match); ``stored_sizes``: compute each
    array's stored size (free for OCDBT; one request per file for per-parameter directories).
    """
    r = resolve(path, step=step, storage_options=storage_options)
    items = _items(r)
    tensors: list[Tensor] = []
    for prefix, it in items:
        by_name = {md.name: md for md in _flatten(item_metadata(it, stored_sizes=stored_sizes))}
        for leaf in it.leaves:
            name = f"{prefix}.{leaf.param_name}" if prefix else leaf.param_name
            parts = ((prefix,) if prefix else ()) + tuple(str(k) for k in leaf.names)
            if not _wanted(name, include):
                continue
            md = by_name.get(leaf.param_name)
            if leaf.kind == INLINE:
                arr = np.asarray(leaf.value)
                if numeric_view(arr) is None:
                    continue
                tensors.append(Tensor(name, parts, arr.shape, arr.dtype, md, value=arr))
            elif leaf.kind in (ARRAY, SCALAR) and md is not None and md.shape is not None and md.dtype is not None:
                tensors.append(Tensor(name, parts, tuple(md.shape), np.dtype(md.dtype), md, it, it.data_param(leaf)))
    return Checkpoint(r, tensors, items)


@dataclasses.dataclass
class ChunkUnit:
    """One stored chunk of a tensor: its key, the region of the array it covers, and the part
    of the decoded chunk inside the array (``None`` when the chunk is whole)."""

    tensor: Tensor
    key: str
    region: tuple[slice, ...]
    local: tuple[slice, ...] | None
    nbytes: int
    #: ``> 0``: no chunk but a run of this many elements equal to the fill value (the absent
    #: chunks of a large grid, see :func:`chunk_units`); ``key`` is then empty
    fill: int = 0


def fill_scalar(t: Tensor) -> np.ndarray:
    """One element of ``t``'s fill value (what its absent chunks read as), as a 1-element array."""
    m = t.zarr()
    fv = m.fill_value
    return np.full(1, 0 if fv is None else fv, dtype=m.data_type.dtype)


def chunk_units(t: Tensor, *, runs: bool = False) -> Iterator[ChunkUnit]:
    """The chunks of ``t`` in grid order (one unit covering everything for inline values).

    With ``runs``, a grid of more than :data:`~zarr3.stored.DENSE_MAX` chunks yields only its
    stored chunks (from one listing) and, when some are absent, first one unit with
    ``fill`` = the number of elements they cover (or :class:`CorruptionError` naming the first
    absent one where every chunk must be stored): work proportional to what is stored."""
    if t.item is None:
        yield ChunkUnit(t, "", tuple(slice(0, s) for s in t.shape), None, t.nbytes)
        return
    m = t.zarr()
    shape, cs = tuple(m.shape), tuple(m.chunk_shape)
    grid = [range(-(-s // c)) if c else range(0) for s, c in zip(shape, cs)]
    item_bytes = m.data_type.dtype.itemsize
    coords_of: Any = None  # itertools.product would copy every range into a tuple first
    if runs and math.prod(len(g) for g in grid) > DENSE_MAX:
        assert t.param is not None
        coords_of = t.item.reader.stored(t.param, m)
        if len(coords_of) < math.prod(len(g) for g in grid):
            if not t.item.fill_missing:
                gap = first_missing(grid, coords_of)
                raise CorruptionError(f"array {t.name!r}: chunk {t.param + '/' + m.chunk_key(gap)!r} is missing (the "
                                      f"checkpoint stores every chunk, so a missing one means it is damaged or "
                                      f"incomplete)", path=t.item.kv.url)
            covered = sum(math.prod(min((i + 1) * c, s) - i * c for i, c, s in zip(coords, cs, shape))
                          for coords in coords_of)
            absent = math.prod(shape) - covered
            yield ChunkUnit(t, "", (), None, absent * item_bytes, fill=absent)
    for coords in itertools.product(*grid) if coords_of is None else coords_of:
        sl = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, cs, shape))
        edge = any(x.stop - x.start != c for x, c in zip(sl, cs))
        local = tuple(slice(0, x.stop - x.start) for x in sl) if edge else None
        n = math.prod(x.stop - x.start for x in sl) * item_bytes
        yield ChunkUnit(t, f"{t.param}/{m.chunk_key(coords)}", sl, local, n)


class Fetched:
    """The stored bytes of some units (``values[i]``: bytes or a memoryview, ``None`` for an
    absent chunk, the value itself for inline tensors); :meth:`release` gives a buffer back
    once its value is decoded or compared."""

    def __init__(self, n: int):
        self.values: list[Any] = [None] * n
        self._done: list[Callable[[], None] | None] = [None] * n

    def release(self, i: int) -> None:
        """Done with value ``i``."""
        self.values[i] = None
        cb, self._done[i] = self._done[i], None
        if cb is not None:
            cb()

    def release_all(self) -> None:
        """Done with every value (also after an error, when a decoded view may still hold a
        buffer: that one is then left to the garbage collector)."""
        for i in range(len(self.values)):
            try:
                self.release(i)
            except BufferError:
                pass


def fetch_raw(units: Sequence[ChunkUnit]) -> Fetched:
    """The stored bytes of each unit, one batched read per item: on the local filesystem
    through the restore's coalescing reader (reused buffers, ``mmap`` for large values),
    elsewhere with one ``get_many``."""
    out = Fetched(len(units))
    by_item: dict[int, list[int]] = {}
    for i, u in enumerate(units):
        if u.tensor.item is None:
            out.values[i] = u.tensor.value
        elif not u.fill:
            by_item.setdefault(id(u.tensor.item), []).append(i)
    for idx in by_item.values():
        item = units[idx[0]].tensor.item
        assert item is not None
        keys = [units[i].key for i in idx]
        local = item.reader.local_source()
        if local is not None:
            datas, done = local.fetch(keys)
            for j, (i, v) in enumerate(zip(idx, datas)):
                out.values[i] = v
                out._done[i] = functools.partial(done, j)
        else:
            for i, v in zip(idx, item.array_store.kv.get_many(keys)):
                out.values[i] = v
    return out


def same_bytes(x: Any, y: Any) -> bool:
    """Whether two stored values (bytes or buffers) are equal, byte for byte (compared as
    64-bit words, a few MiB at a time, stopping at the first difference)."""
    if x is None or y is None:
        return False
    a = np.frombuffer(x, np.uint8)
    b = np.frombuffer(y, np.uint8)
    if a.size != b.size:
        return False
    words = a.size // 8
    step = 1 << 19  # words: 4 MiB
    for lo in range(0, words, step):
        hi = min(lo + step, words)
        if not (a[8 * lo:8 * hi].view(np.uint64) == b[8 * lo:8 * hi].view(np.uint64)).all():
            return False
    return bool(np.array_equal(a[8 * words:], b[8 * words:]))


class Scratch(threading.local):
    """Per-thread output buffers for decoding, reused from chunk to chunk (a fresh buffer per
    chunk would pay its page faults every time).  ``slot`` tells apart buffers alive at once."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}

    def get(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``."""
        n = math.prod(shape) * dtype.itemsize
        buf = self.buffers.get(slot)
        if buf is None or buf.nbytes < n:
            buf = self.buffers[slot] = np.empty(max(n, 1), np.uint8)
        return buf[:n].view(dtype).reshape(shape)


def decode(u: ChunkUnit, raw: Any, scratch: Scratch | None = None, slot: int = 0) -> np.ndarray:
    """The values of the array inside chunk ``u`` (its fill value when the chunk is absent
    and the checkpoint allows that; :class:`CorruptionError` otherwise).  With ``scratch`` the
    result lives in that thread's buffer ``slot`` until the next decode into it."""
    t = u.tensor
    if t.item is None:
        return np.asarray(raw)
    m = t.zarr()
    shape = tuple(x.stop - x.start for x in u.region)
    if raw is None:
        if not t.item.fill_missing:
            raise CorruptionError(f"array {t.name!r}: chunk {u.key!r} is missing (the checkpoint stores every "
                                  f"chunk, so a missing one means it is damaged or incomplete)", path=t.item.kv.url)
        fv = m.fill_value
        return np.full(shape, 0 if fv is None else fv, dtype=m.data_type.dtype)
    try:
        if scratch is None:
            a = m.chain.decode(raw)
        else:
            a = scratch.get(slot, tuple(m.chunk_shape), m.data_type.dtype)
            m.chain.decode_into(raw, a)
    except CorruptionError as e:
        raise CorruptionError(f"array {t.name!r}: chunk {u.key!r}: {e.reason}", path=t.item.kv.url) from e
    return a if u.local is None else a[u.local]


def task_bytes(units: list[ChunkUnit]) -> int:
    """Decoded bytes of a task's chunks (its weight for :func:`run_chunks`)."""
    return sum(u.nbytes for u in units if not u.fill)  # a run of the fill value holds no memory


def group_units(units: Iterable[ChunkUnit], max_bytes: int = TASK_BYTES, max_count: int = TASK_CHUNKS
                ) -> Iterator[list[ChunkUnit]]:
    """Consecutive units grouped into tasks of about ``max_bytes`` decoded bytes."""
    group: list[ChunkUnit] = []
    acc = 0
    for u in units:
        if group and (acc + u.nbytes > max_bytes or len(group) >= max_count):
            yield group
            group, acc = [], 0
        group.append(u)
        acc += u.nbytes
    if group:
        yield group


def run_chunks(tasks: Iterable[T], fn: Callable[[T], R], *, workers: int | None = None,
               progress: Callable[[T], None] | None = None, weight: Callable[[T], int] | None = None,
               budget: int = IN_FLIGHT_BYTES) -> Iterator[R]:
    """``fn(task)`` for every task on ``workers`` threads, results in submission order.

    At most ``2 * workers`` tasks are in flight, and (with ``weight``) no more than ``budget``
    bytes of them beyond the first, so memory stays at a few chunks per worker however large
    the checkpoint.  ``progress(task)`` is called after each task."""
    n = workers or default_workers()
    if n <= 1:
        for task in tasks:
            r = fn(task)
            if progress is not None:
                progress(task)
            yield r
        return
    it = iter(tasks)
    w = weight or (lambda _t: 0)
    with pools.dedicated("inspect", n) as pool:
        pending: collections.deque[tuple[T, int, concurrent.futures.Future[R]]] = collections.deque()
        held = 0
        nxt: list[T] = []  # a task taken from ``it`` that did not fit yet
        try:
            while True:
                while len(pending) < 2 * n:
                    got = nxt.pop() if nxt else next(it, None)
                    if got is None:
                        break
                    tw = w(got)
                    if pending and held + tw > budget:
                        nxt.append(got)
                        break
                    pending.append((got, tw, pool.submit(fn, got)))
                    held += tw
                if not pending:
                    return
                task, tw, fut = pending.popleft()
                r = fut.result()
                held -= tw
                if progress is not None:
                    progress(task)
                yield r
        finally:
            for _, _, fut in pending:
                fut.cancel()
