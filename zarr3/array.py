"""Zarr arrays: open, create, read and write with NumPy basic indexing.

Reading fetches only the chunks a selection touches (for sharded arrays: the shard indexes,
then only the byte ranges of the touched inner chunks, or whole shards when every inner chunk
is needed) in concurrent batches, and decodes them on a thread pool straight into the
preallocated output.  Writing encodes on the same pool; partially covered chunks are read,
modified and rewritten; chunks equal to the fill value are deleted rather than stored unless
``write_empty_chunks=True`` (TensorStore's ``store_data_equal_to_fill_value``).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError, MissingDependencyError, ReadOnlyError
from ocdbt_py.kvstore import KvStore, PrefixStore, open_kvstore
from zarr3.chunk_grid import ChunkKeyEncoding, parse_shape
from zarr3.codecs import (
    BytesCodec,
    ShardingCodec,
    TransposeCodec,
    codec_from_dict,
    compressor_from_v2,
    filters_from_v2,
)
from zarr3.codecs._filter import Filter
from zarr3.codecs.base import Buffer, BytesBytesCodec, Codec
from zarr3.codecs.chain import CodecChain, equals_fill
from zarr3.codecs.sharding import MISSING
from zarr3.codecs.vlen_bytes import VlenBytesCodec
from zarr3.codecs.vlen_utf8 import VlenUtf8Codec
from zarr3.dtypes import DataType, data_type_from_numpy, struct_v2_json, v2_dtype_string
from zarr3.engine import dask_blocks
from zarr3.engine.alloc import empty
from zarr3.engine.executor import IoSink, Job, LocalFetcher, batched, run_jobs, run_pipeline
from zarr3.errors import (
    ArrayNotFoundError,
    ChunkNotFoundError,
    MetadataError,
    NodeExistsError,
)
from zarr3.fill_value import default_fill_value, normalize_fill_value
from zarr3.indexing import ChunkDimSel, Selection, dim_chunks, normalize_selection
from zarr3.metadata_v2 import ArrayMetadataV2, GroupMetadataV2, parse_zarray, parse_zattrs
from zarr3.metadata_v3 import ArrayMetadataV3, GroupMetadataV3, parse_zarr_json
from zarr3.stored import first_missing, grid_shape, stored_chunks, use_listing

__all__ = ["Array", "open", "create", "resolve_store", "load_metadata", "ArrayMetadata"]

ArrayMetadata = ArrayMetadataV3 | ArrayMetadataV2
NodeMetadata = ArrayMetadataV3 | ArrayMetadataV2 | GroupMetadataV3 | GroupMetadataV2

_MODES = ("r", "r+", "a", "w", "w-")


# -- store and metadata resolution ---------------------------------------------------------
def resolve_store(
    store: Any, path: str = "", *, mode: str = "r", storage_options: dict[str, Any] | None = None
) -> KvStore:
    """Turn an ocdbt_py store, a :class:`KvStore` or a path/URL into a KvStore at ``path``."""
    if hasattr(store, "as_kvstore") and not isinstance(store, KvStore):
        kv: KvStore = store.as_kvstore()
    elif isinstance(store, KvStore):
        kv = store
    elif isinstance(store, (str, os.PathLike)):
        kv = open_kvstore(store, storage_options, read_only=mode == "r")
    else:
        raise TypeError(f"store must be an ocdbt_py store, a KvStore or a path/URL, not {type(store).__name__}")
    path = (path or "").strip("/")
    return PrefixStore(kv, path) if path else kv


def _describe(store: KvStore) -> str:
    return store.url


def load_metadata(store: KvStore, zarr_format: int | None = None) -> NodeMetadata:
    """Read the array or group metadata stored at the root of ``store``.

    v3 (``zarr.json``) wins over v2 (``.zarray`` / ``.zgroup``) when both exist, unless
    ``zarr_format`` picks one.
    """
    if zarr_format not in (None, 2, 3):
        raise ValueError(f"zarr_format must be 2, 3 or None, not {zarr_format!r}")
    keys = []
    if zarr_format in (None, 3):
        keys.append("zarr.json")
    if zarr_format in (None, 2):
        keys += [".zarray", ".zgroup", ".zattrs"]
    found = dict(zip(keys, store.get_many(keys)))
    where = _describe(store)
    try:
        if found.get("zarr.json") is not None:
            return parse_zarr_json(found["zarr.json"])  # type: ignore[arg-type]
        if found.get(".zarray") is not None:
            return parse_zarray(found[".zarray"], found.get(".zattrs"))  # type: ignore[arg-type]
        if found.get(".zgroup") is not None:
            return GroupMetadataV2(parse_zattrs(found.get(".zattrs")))
    except MetadataError as e:
        if e.path is None:
            e.path = where
            e.args = (f"{e.args[0]} (in {where})",)
        raise
    raise ArrayNotFoundError(f"no zarr array or group metadata at {where}")


class _Scratch:
    """Per-thread chunk buffers that live as long as one read or write operation.

    Reusing one buffer per worker avoids a fresh allocation (and its page faults) per chunk.
    """

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._local = threading.local()

    def get(self) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            # uninitialised (no zero-fill): a page costs memory only once a decoder writes it,
            # so a chunk that fails to decode early costs what was decoded, not its declared size
            buf = self._local.buf = np.empty(self.nbytes, np.uint8).data
        result: memoryview = buf
        return result

    def array(self, shape: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
        """The buffer as a C-contiguous array of ``shape`` (must fit in ``nbytes``)."""
        if dtype.hasobject or dtype.kind == "T":  # variable-length elements cannot live in bytes
            return np.empty(shape, dtype)
        n = math.prod(shape) * dtype.itemsize
        return np.frombuffer(self.get()[:n], dtype=np.uint8).view(dtype).reshape(shape)


def _fetch_buffer_bytes(chain: CodecChain, max_bytes: int | None = None) -> int:
    """Size of the reused per-worker fetch buffer: the largest encoded chunk, except for
    variable-length data, whose bound (1 GiB) is no size to allocate up front."""
    n = chain.max_encoded_size if max_bytes is None else max_bytes
    return min(n, 1 << 22) if chain.spec.dtype.variable else n


def _as_elements(value: Any, dt: DataType) -> np.ndarray:
    """``value`` as an array; byte strings for object arrays keep their trailing NULs (a
    NumPy ``S`` array, which ``np.asarray`` would make of them, drops them)."""
    if dt.kind in ("vbytes", "object") and not isinstance(value, np.ndarray):
        try:
            out = np.empty((), dtype=object) if isinstance(value, bytes) else np.empty(np.shape(value), dtype=object)
        except ValueError:  # ragged nested lists: let NumPy decide
            return np.asarray(value)
        if out.ndim:
            out[...] = value
        else:
            out[()] = value
        return out
    return np.asarray(value)


def _shard_fetch_bytes(chain: CodecChain, shard: ShardingCodec) -> int:
    """:func:`_fetch_buffer_bytes` for whole shards."""
    return _fetch_buffer_bytes(chain, shard.max_encoded_size(chain.ab_spec))


def _inner_index(cps: Sequence[int], coords: Sequence[int], combo: Sequence[ChunkDimSel]) -> int:
    """C-order index, within shard ``coords``, of the inner chunk that ``combo`` selects."""
    idx = 0
    for d, p in enumerate(combo):
        idx = idx * cps[d] + (p.chunk - coords[d] * cps[d])
    return idx


def _fill_region(region: np.ndarray, fill: np.ndarray | None) -> None:
    # "no fill value" means zero bits (not the number 0: float8_e8m0fnu has no zero)
    region[...] = np.zeros((), region.dtype) if fill is None else fill


class Array:
    """A Zarr v2 or v3 array in a :class:`~ocdbt_py.kvstore.KvStore`.

    Use :func:`zarr3.open` or :func:`zarr3.create` rather than the constructor.
    ``fill_missing=False`` makes a missing chunk an error (:class:`ChunkNotFoundError`), as
    Orbax requires for checkpoints saved with ``store_array_data_equal_to_fill_value``.
    ``write_empty_chunks=True`` stores chunks even when they equal the fill value.
    """

    #: How to reopen the array by location (set by :func:`open` for paths/URLs; used by to_dask)
    _source: Any = None

    def __init__(
        self,
        store: KvStore,
        metadata: ArrayMetadata,
        *,
        mode: str = "r",
        fill_missing: bool = True,
        write_empty_chunks: bool = False,
    ):
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, not {mode!r}")
        self._store = store
        self._meta = metadata
        self._mode = mode
        self.fill_missing = fill_missing
        self.write_empty_chunks = write_empty_chunks
        chain = metadata.chain
        self._chain: CodecChain = chain
        ab = chain.ab
        self._shard: ShardingCodec | None = (
            ab if isinstance(ab, ShardingCodec) and not chain.aa and not chain.bb else None
        )

    # -- properties ------------------------------------------------------------------------
    @property
    def store(self) -> KvStore:
        """The key-value store holding this array (already scoped to its path)."""
        return self._store

    @property
    def metadata(self) -> ArrayMetadata:
        """Parsed metadata (:class:`ArrayMetadataV3` or :class:`ArrayMetadataV2`)."""
        return self._meta

    @property
    def zarr_format(self) -> int:
        """2 or 3."""
        return int(self._meta.zarr_format)

    @property
    def shape(self) -> tuple[int, ...]:
        """Array shape."""
        return self._meta.shape

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._meta.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._meta.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """NumPy dtype of the data returned (native byte order; ml_dtypes for bfloat16/float8)."""
        return self._meta.data_type.dtype

    @property
    def data_type(self) -> DataType:
        """The Zarr data type."""
        return self._meta.data_type

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array in memory."""
        return self.size * self.dtype.itemsize

    @property
    def chunks(self) -> tuple[int, ...]:
        """Read chunk shape: the inner chunk shape for sharded arrays, else the grid chunk."""
        ab = self._chain.ab
        if isinstance(ab, ShardingCodec) and not self._chain.aa:
            return ab.chunk_shape
        return self._meta.chunk_shape

    @property
    def shards(self) -> tuple[int, ...] | None:
        """Shard shape (the chunk grid) for sharded arrays, else ``None``."""
        ab = self._chain.ab
        if isinstance(ab, ShardingCodec) and not self._chain.aa:
            return self._meta.chunk_shape
        return None

    @property
    def fill_value(self) -> Any:
        """Fill value as a NumPy scalar (``None`` for a v2 array with ``fill_value: null``)."""
        fv = self._meta.fill_value
        return None if fv is None else fv[()]

    @property
    def attrs(self) -> dict[str, Any]:
        """User attributes (a copy; use :meth:`update_attributes` to change them)."""
        return self._meta.attrs

    @property
    def dimension_names(self) -> tuple[str | None, ...] | None:
        """Dimension names (v3 only)."""
        return self._meta.dimension_names

    @property
    def read_only(self) -> bool:
        """Whether writes are refused."""
        return self._mode == "r"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"<zarr3.Array {self._store.url} shape={self.shape} dtype={self.data_type.name} "
            f"chunks={self.chunks} zarr_format={self.zarr_format}>"
        )

    # -- reading ---------------------------------------------------------------------------
    def __getitem__(self, selection: Any) -> np.ndarray:
        return self.read(selection)

    def to_dask(self, *, block_bytes: int | None = None) -> Any:
        """This array as a lazy ``dask.array.Array`` (needs dask): blocks of whole stored chunks
        (shards when sharded) merged up to ``block_bytes`` (default 128 MiB).

        An array opened from a path or URL gives tasks that carry that location and its
        storage options (each worker opens the array once), so the graph runs on
        ``dask.distributed`` worker processes; one opened from a store object ships that
        object with the graph (fine for threads; it must pickle for processes).
        """
        stored = self.shards or self.chunks
        chunks = dask_blocks.merged_chunks(self.shape, stored, self.dtype.itemsize,
                                           block_bytes or dask_blocks.DEFAULT_BLOCK_BYTES)
        src = getattr(self, "_source", None)
        MissingDependencyError.require("dask.array", "dask", "Array.to_dask()")
        import dask.base  # optional: to_dask needs dask anyway

        if src is not None:
            name = f"zarr3-{dask.base.tokenize(src, chunks)}"
            return dask_blocks.block_array(name, self.shape, self.dtype, chunks, read_source_block, src)
        name = f"zarr3-{dask.base.tokenize(id(self), self._store.url, chunks)}"
        return dask_blocks.block_array(name, self.shape, self.dtype, chunks, dask_blocks.read_object_block, self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.read()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def read(self, selection: Any = Ellipsis, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read ``selection`` (NumPy basic indexing) into a new array, or into ``out``."""
        sel = normalize_selection(selection, self.shape)
        counts = sel.counts
        if out is None:
            buf = empty(counts, self.dtype, f"reading array {self._store.url}")
        else:
            if not isinstance(out, np.ndarray) or out.shape != sel.result_shape:
                raise ValueError(f"out must be an array of shape {sel.result_shape}")
            if out.dtype != self.dtype:
                raise ValueError(f"out must have dtype {self.dtype}, not {out.dtype}")
            if not out.flags.writeable:
                raise ValueError("out is read-only")
            if out.shape == counts:
                buf = out
            elif out.flags.c_contiguous:
                buf = out.reshape(counts)
            else:
                raise ValueError("out must be C-contiguous when the selection drops or adds axes")
        dest = buf[sel.flips + (Ellipsis,)]  # "...": a view even for 0-d arrays
        if buf.size:
            self._read_into(sel, dest)
        if out is not None:
            return out
        return buf.reshape(sel.result_shape)

    def _fill_for_missing(self) -> np.ndarray | None:
        """The value missing chunks read as: the fill value; for a v2 ``fill_value: null``
        zero bits, except variable-length types (``""``, ``b""``, ``None``) and datetimes (NaT),
        as zarr-python 3 reads them."""
        fill = self._meta.fill_value
        if fill is None and (self.data_type.variable or self.data_type.kind == "datetime"):
            return default_fill_value(self.data_type)
        return fill

    def _missing(self, key: str) -> None:
        if not self.fill_missing:
            raise ChunkNotFoundError(
                f"{self._store.url.rstrip('/')}/{key}",
                f"chunk {key!r} of {self._store.url} is missing (fill_missing=False)",
            )

    def _stored_in(self, per_dim: list[list[ChunkDimSel]], dest: np.ndarray, fill: Any
                   ) -> list[tuple[ChunkDimSel, ...]]:
        """The pieces of a large selection whose chunks are stored (from one listing, see
        :mod:`zarr3.stored`); the rest of ``dest`` gets the fill value at once, or the first
        missing chunk is :class:`ChunkNotFoundError` when missing chunks are not allowed."""
        meta = self._meta
        index = [{p.chunk: p for p in pieces} for pieces in per_dim]
        found = [c for c in stored_chunks(self._store, meta) if all(i in ix for i, ix in zip(c, index))]
        if len(found) < math.prod(len(p) for p in per_dim):
            if not self.fill_missing:
                gap = first_missing([sorted(ix) for ix in index], found)
                assert gap is not None
                self._missing(meta.chunk_key(gap))
            _fill_region(dest, fill)
        return [tuple(ix[i] for i, ix in zip(c, index)) for c in found]

    def _read_into(self, sel: Selection, dest: np.ndarray) -> None:
        meta = self._meta
        if self._shard is not None:
            self._read_sharded(sel, dest, self._shard)
            return
        chain = self._chain
        fill = self._fill_for_missing()
        per_dim = [dim_chunks(d, c, n) for d, c, n in zip(sel.dims, meta.chunk_shape, meta.shape)]
        scratch = _Scratch(chain.spec.nbytes)
        selected = math.prod(len(p) for p in per_dim)
        big = use_listing(selected, math.prod(grid_shape(meta.shape, meta.chunk_shape)))
        sparse = self._stored_in(per_dim, dest, fill) if big else None

        def units() -> Iterator[tuple[str, tuple[ChunkDimSel, ...]]]:
            combos = itertools.product(*per_dim) if sparse is None else sparse
            for combo in combos:
                yield meta.chunk_key([p.chunk for p in combo]), combo

        def handle(unit: tuple[str, tuple[ChunkDimSel, ...]], data: bytes | None) -> list[Job]:
            key, combo = unit
            region = dest[tuple(p.out for p in combo) + (Ellipsis,)]
            if data is None:
                self._missing(key)
                return [lambda: _fill_region(region, fill)]
            chain.check_decodable(data)  # before a chunk-sized scratch buffer exists
            if all(p.full for p in combo):
                return [lambda: chain.decode_into(data, region, scratch.get())]
            local = tuple(p.local for p in combo)

            def job() -> None:
                np.copyto(region, chain.decode(data, scratch.get())[local], casting="no")

            return [job]

        fetch = LocalFetcher.for_store(self._store, _fetch_buffer_bytes(chain))
        run_pipeline(self._store, units(), lambda u: (u[0], None), handle, fetch_one=fetch)

    def _shard_groups(
        self, sel: Selection, shard: ShardingCodec
    ) -> Iterator[tuple[tuple[int, ...], list[list[ChunkDimSel]], bool]]:
        """Yield ``(shard coords, per-dim inner pieces, whole)`` for every touched shard."""
        meta = self._meta
        inner = shard.chunk_shape
        cps = shard.chunks_per_shard
        per_dim: list[list[tuple[int, list[ChunkDimSel]]]] = []
        for d, (ds, n) in enumerate(zip(sel.dims, meta.shape)):
            groups: list[tuple[int, list[ChunkDimSel]]] = []
            for piece in dim_chunks(ds, inner[d], n):
                s = piece.chunk // cps[d]
                if groups and groups[-1][0] == s:
                    groups[-1][1].append(piece)
                else:
                    groups.append((s, [piece]))
            per_dim.append(groups)
        for combo in itertools.product(*per_dim):
            coords = tuple(g[0] for g in combo)
            pieces = [g[1] for g in combo]
            whole = True
            for d, (s, plist) in enumerate(combo):
                lo = s * meta.chunk_shape[d]
                inb = min(cps[d], -(-(meta.shape[d] - lo) // inner[d]))
                if len(plist) != inb:
                    whole = False
                    break
            yield coords, pieces, whole

    def _read_sharded(self, sel: Selection, dest: np.ndarray, shard: ShardingCodec) -> None:
        meta = self._meta
        fill = self._fill_for_missing()
        inner = shard.inner
        assert inner is not None
        cps = shard.chunks_per_shard
        scratch = _Scratch(inner.spec.nbytes)
        whole_units: list[tuple[str, tuple[int, ...], list[list[ChunkDimSel]]]] = []
        partial_units: list[tuple[str, tuple[int, ...], list[list[ChunkDimSel]]]] = []
        for coords, pieces, whole in self._shard_groups(sel, shard):
            unit = (meta.chunk_key(coords), coords, pieces)
            (whole_units if whole else partial_units).append(unit)

        def inner_job(data: Buffer, combo: tuple[ChunkDimSel, ...]) -> Job:
            region = dest[tuple(p.out for p in combo) + (Ellipsis,)]
            inner.check_decodable(data)  # before a chunk-sized scratch buffer exists
            if all(p.full for p in combo):
                return lambda: inner.decode_into(data, region, scratch.get())
            local = tuple(p.local for p in combo)

            def job() -> None:
                np.copyto(region, inner.decode(data, scratch.get())[local], casting="no")

            return job

        def fill_all(key: str, pieces: list[list[ChunkDimSel]]) -> list[Job]:
            self._missing(key)
            jobs: list[Job] = []
            for combo in itertools.product(*pieces):
                region = dest[tuple(p.out for p in combo) + (Ellipsis,)]
                jobs.append(lambda region=region: _fill_region(region, fill))  # type: ignore[misc]
            return jobs

        # 1. shards needed entirely: one read each
        def handle_whole(unit: tuple[str, tuple[int, ...], list[list[ChunkDimSel]]], data: bytes | None) -> list[Job]:
            key, coords, pieces = unit
            if data is None:
                return fill_all(key, pieces)
            try:
                entries, mv = shard.split_shard(data)
            except CorruptionError as e:
                raise CorruptionError(e.reason, path=f"{self._store.url.rstrip('/')}/{key}") from e
            jobs: list[Job] = []
            for combo in itertools.product(*pieces):
                i = _inner_index(cps, coords, combo)
                off, n = int(entries[i, 0]), int(entries[i, 1])
                if off == MISSING and n == MISSING:
                    self._missing(f"{key}[{i}]")
                    region = dest[tuple(p.out for p in combo) + (Ellipsis,)]
                    jobs.append(lambda region=region: _fill_region(region, fill))  # type: ignore[misc]
                else:
                    jobs.append(inner_job(mv[off : off + n], combo))
            return jobs

        if whole_units:
            fetch = LocalFetcher.for_store(self._store, _shard_fetch_bytes(meta.chain, shard))
            run_pipeline(self._store, whole_units, lambda u: (u[0], None), handle_whole, fetch_one=fetch)
        if not partial_units:
            return

        # 2. other shards: the index first, then only the inner chunks needed
        index_range = shard.index_byte_range()
        inner_units: list[tuple[str, tuple[int, int], tuple[ChunkDimSel, ...]]] = []
        fill_jobs: list[Job] = []

        def handle_index(unit: tuple[str, tuple[int, ...], list[list[ChunkDimSel]]], data: bytes | None) -> list[Job]:
            key, coords, pieces = unit
            if data is None:
                fill_jobs.extend(fill_all(key, pieces))
                return []
            try:
                entries = shard.decode_index(data)
            except CorruptionError as e:
                raise CorruptionError(e.reason, path=f"{self._store.url.rstrip('/')}/{key}") from e
            for combo in itertools.product(*pieces):
                i = _inner_index(cps, coords, combo)
                off, n = int(entries[i, 0]), int(entries[i, 1])
                if off == MISSING and n == MISSING:
                    self._missing(f"{key}[{i}]")
                    region = dest[tuple(p.out for p in combo) + (Ellipsis,)]
                    fill_jobs.append(lambda region=region: _fill_region(region, fill))  # type: ignore[misc]
                else:
                    inner_units.append((key, (off, off + n), combo))
            return []

        run_pipeline(self._store, partial_units, lambda u: (u[0], index_range), handle_index, batch=64)
        run_jobs(fill_jobs)

        def handle_inner(unit: tuple[str, tuple[int, int], tuple[ChunkDimSel, ...]], data: bytes | None) -> list[Job]:
            key, (start, stop), combo = unit
            if data is None or len(data) != stop - start:
                got = "nothing" if data is None else f"{len(data)} bytes"
                raise CorruptionError(
                    f"shard index points to bytes [{start}, {stop}) but the shard returned {got}",
                    path=f"{self._store.url.rstrip('/')}/{key}",
                )
            return [inner_job(data, combo)]

        fetch = LocalFetcher.for_store(self._store, _fetch_buffer_bytes(inner))
        run_pipeline(self._store, inner_units, lambda u: (u[0], u[1]), handle_inner, fetch_one=fetch)

    # -- writing ---------------------------------------------------------------------------
    def __setitem__(self, selection: Any, value: Any) -> None:
        self.write(value, selection)

    def _check_writable(self) -> None:
        if self._mode == "r":
            raise ReadOnlyError(f"{self._store.url} was opened read-only (mode='r')")

    def write(self, value: Any, selection: Any = Ellipsis) -> None:
        """Write ``value`` (broadcast to the selection's shape) into ``selection``."""
        self._check_writable()
        sel = normalize_selection(selection, self.shape)
        val = _as_elements(value, self.data_type)
        if val.dtype != self.dtype:
            if self.data_type.kind == "raw" or val.dtype.kind == "V" and val.dtype.itemsize != self.dtype.itemsize:
                raise TypeError(f"cannot write {val.dtype} data into a {self.data_type.name} array")
            with np.errstate(over="ignore", invalid="ignore"):
                val = val.astype(self.dtype)
        try:
            val = np.broadcast_to(val, sel.result_shape)
        except ValueError as e:
            raise ValueError(
                f"could not broadcast value of shape {np.shape(value)} into selection of shape {sel.result_shape}"
            ) from e
        val = val.reshape(sel.counts)[sel.flips]
        if val.size == 0:
            return
        if self._shard is not None:
            self._write_sharded(sel, val, self._shard)
        else:
            self._write_chunks(sel, val)

    def _skip_fill(self) -> bool:
        return not self.write_empty_chunks and self._meta.fill_value is not None

    def _write_chunks(self, sel: Selection, val: np.ndarray) -> None:
        meta = self._meta
        chain = self._chain
        fill = self._fill_for_missing()
        skip_fill = self._skip_fill()
        per_dim = [dim_chunks(d, c, n) for d, c, n in zip(sel.dims, meta.chunk_shape, meta.shape)]
        covered: list[tuple[str, tuple[ChunkDimSel, ...]]] = []
        partial: list[tuple[str, tuple[ChunkDimSel, ...]]] = []
        for combo in itertools.product(*per_dim):
            key = meta.chunk_key([p.chunk for p in combo])
            (covered if all(p.covers for p in combo) else partial).append((key, combo))

        scratch = _Scratch(chain.spec.nbytes)
        dtype = self.dtype
        fill_elem = np.zeros((), dtype) if fill is None else fill

        sink = IoSink()

        def encoded(chunk: np.ndarray) -> bytes | None:
            """The stored bytes of ``chunk`` (``None``: delete the key); a copy, as ``chunk``
            may be the worker's scratch buffer."""
            if skip_fill and equals_fill(chunk, fill):
                return None
            enc = chain.encode(chunk, write_empty_chunks=self.write_empty_chunks)
            return None if enc is None else bytes(enc)

        def finish(key: str, chunk: np.ndarray) -> None:
            self._store_batch(sink, [(key, encoded(chunk))])

        def covered_chunk(combo: tuple[ChunkDimSel, ...]) -> np.ndarray:
            part = val[tuple(p.out for p in combo)]
            chunk = scratch.array(meta.chunk_shape, dtype)
            if all(p.full for p in combo):
                np.copyto(chunk, part)
            else:  # edge chunk: pad with the fill value
                chunk[...] = fill_elem
                chunk[tuple(p.local for p in combo)] = part
            return chunk

        def covered_job(units: list[tuple[str, tuple[ChunkDimSel, ...]]]) -> Job:
            # small chunks come several to a job, stored by one queued write, so that the
            # per-job and per-write costs of the pools are paid once per batch, not per chunk
            return lambda: self._store_batch(sink, [(key, encoded(covered_chunk(combo))) for key, combo in units])

        def handle(unit: tuple[str, tuple[ChunkDimSel, ...]], data: bytes | None) -> list[Job]:
            key, combo = unit

            def job() -> None:
                if data is not None:
                    chain.check_decodable(data)
                chunk = scratch.array(meta.chunk_shape, dtype)
                if data is None:
                    chunk[...] = fill_elem
                else:
                    chain.decode_into(data, chunk)
                chunk[tuple(p.local for p in combo)] = val[tuple(p.out for p in combo)]
                finish(key, chunk)

            return [job]

        try:
            if partial:
                run_pipeline(self._store, partial, lambda u: (u[0], None), handle)
            if covered:
                run_jobs(covered_job(units) for units in batched(covered, _chunks_per_job(chain.spec.nbytes)))
        except BaseException:
            sink.wait(suppress=True)  # let queued writes finish; report the first error
            raise
        sink.wait()

    def _store_batch(self, sink: IoSink, items: list[tuple[str, bytes | None]]) -> None:
        """Store (``bytes``) or delete (``None``) each key, in order, as one queued write."""
        store = self._store

        def write() -> None:
            for key, data in items:
                if data is None:
                    store.delete(key)
                else:
                    store.set(key, data)

        sink.submit(write)

    def _write_sharded(self, sel: Selection, val: np.ndarray, shard: ShardingCodec) -> None:
        meta = self._meta
        inner = shard.inner
        assert inner is not None
        fill = self._fill_for_missing()
        skip_fill = self._skip_fill()
        cps = shard.chunks_per_shard
        inner_shape = shard.chunk_shape
        write_empty = self.write_empty_chunks
        scratch = _Scratch(inner.spec.nbytes)
        dtype = self.dtype
        fill_elem = np.zeros((), dtype) if fill is None else fill

        def encode_inner(arr: np.ndarray) -> Buffer | None:
            if skip_fill and equals_fill(arr, fill):
                return None
            return inner.encode(arr, write_empty_chunks=write_empty)

        def build(
            key: str,
            coords: tuple[int, ...],
            pieces: list[list[ChunkDimSel]],
            existing: bytes | None,
        ) -> None:
            entries: list[Buffer | None] = [None] * shard.num_entries
            old_index = None
            mv: memoryview | None = None
            if existing is not None:
                old_index, mv = shard.split_shard(existing)
                for i in range(shard.num_entries):
                    off, n = int(old_index[i, 0]), int(old_index[i, 1])
                    if not (off == MISSING and n == MISSING):
                        entries[i] = mv[off : off + n]
            for combo in itertools.product(*pieces):
                i = 0
                for d, p in enumerate(combo):
                    i = i * cps[d] + (p.chunk - coords[d] * cps[d])
                part = val[tuple(p.out for p in combo)]
                chunk = scratch.array(inner_shape, dtype)  # reused: no allocation per chunk
                if all(p.full for p in combo):
                    np.copyto(chunk, part)
                elif all(p.covers for p in combo):
                    chunk[...] = fill_elem
                    chunk[tuple(p.local for p in combo)] = part
                else:
                    old = entries[i]
                    if old is not None:
                        inner.decode_into(old, chunk)
                    else:
                        chunk[...] = fill_elem
                    chunk[tuple(p.local for p in combo)] = part
                encoded = encode_inner(chunk)
                if encoded is not None and not isinstance(encoded, bytes):
                    encoded = bytes(encoded)  # it may view the scratch buffer
                entries[i] = encoded
            parts = shard.assemble_parts(entries)
            store = self._store
            if parts is None:
                sink.submit(lambda: store.delete(key))
                return
            blobs = [b if isinstance(b, bytes) else bytes(b) for b in parts]
            sink.submit(lambda: store.set_parts(key, blobs))

        covered: list[tuple[str, tuple[int, ...], list[list[ChunkDimSel]]]] = []
        partial: list[tuple[str, tuple[int, ...], list[list[ChunkDimSel]]]] = []
        for coords, pieces, whole in self._shard_groups(sel, shard):
            key = meta.chunk_key(coords)
            all_cover = whole and all(p.covers for plist in pieces for p in plist)
            (covered if all_cover else partial).append((key, coords, pieces))

        sink = IoSink()
        try:
            if partial:
                run_pipeline(
                    self._store,
                    partial,
                    lambda u: (u[0], None),
                    lambda u, data: [lambda: build(u[0], u[1], u[2], data)],
                )
            if covered:
                run_jobs(
                    (lambda u=u: build(u[0], u[1], u[2], None))  # type: ignore[misc]
                    for u in covered
                )
        except BaseException:
            sink.wait(suppress=True)  # let queued writes finish; report the first error
            raise
        sink.wait()

    # -- attributes ------------------------------------------------------------------------
    def update_attributes(self, new: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``new`` into the attributes and rewrite the metadata; returns the result."""
        self._check_writable()
        attrs = self._meta.attrs
        attrs.update(new)
        self._meta.attributes = attrs
        if isinstance(self._meta, ArrayMetadataV2):
            data = self._meta.attrs_bytes()
            if data is None:
                self._store.delete(".zattrs")
            else:
                self._store.set(".zattrs", data)
        else:
            self._store.set("zarr.json", self._meta.to_bytes())
        return attrs


#: Chunks of less than this many bytes are encoded and stored in batches (one pool job and
#: one queued write per batch): 80,000 chunks of 16 bytes took 74 us per chunk one by one.
SMALL_CHUNK_BATCH_BYTES = 256 << 10
#: At most this many chunks per batch.
SMALL_CHUNK_BATCH = 256


def _chunks_per_job(chunk_nbytes: int) -> int:
    """Chunks per encode job: 1 for chunks of :data:`SMALL_CHUNK_BATCH_BYTES` or more."""
    if chunk_nbytes >= SMALL_CHUNK_BATCH_BYTES:
        return 1
    return max(1, min(SMALL_CHUNK_BATCH, SMALL_CHUNK_BATCH_BYTES // max(1, chunk_nbytes)))


# -- module-level API ----------------------------------------------------------------------
def open(  # noqa: A001 - mirrors zarr.open / ocdbt_py.open
    store: Any,
    path: str = "",
    *,
    mode: str = "r",
    zarr_format: int | None = None,
    storage_options: dict[str, Any] | None = None,
    fill_missing: bool = True,
    write_empty_chunks: bool = False,
) -> Array:
    """Open an existing Zarr v3 or v2 array.

    ``store`` is an ocdbt_py store (its ``as_kvstore()`` view is used), any
    :class:`~ocdbt_py.kvstore.KvStore`, or a local path / fsspec URL.  ``mode`` is ``"r"``
    (read-only) or ``"r+"`` / ``"a"`` (read-write).
    """
    if mode not in ("r", "r+", "a"):
        raise ValueError(f"open() mode must be 'r', 'r+' or 'a', not {mode!r}; use create() to make arrays")
    kv = resolve_store(store, path, mode=mode, storage_options=storage_options)
    meta = load_metadata(kv, zarr_format)
    if isinstance(meta, (GroupMetadataV3, GroupMetadataV2)):
        raise MetadataError("node_type", "group", f"{kv.url} is a group; use zarr3.open_group()")
    arr = Array(kv, meta, mode=mode, fill_missing=fill_missing, write_empty_chunks=write_empty_chunks)
    if isinstance(store, (str, os.PathLike)) and mode == "r":
        _remember_source(arr, os.fspath(store), storage_options, path, zarr_format)
    return arr


def _remember_source(arr: Array, location: str, storage_options: dict[str, Any] | None, path: str,
                     zarr_format: int | None) -> None:
    """Record how to reopen a read-only array by location (for :meth:`Array.to_dask`)."""
    try:
        if not location.startswith(("/",)) and "://" not in location:
            location = os.path.abspath(location)
        arr._source = dask_blocks.ArraySource.of(location, storage_options, path, zarr_format)
    except (TypeError, ValueError):  # options that are not JSON: ship the array object instead
        pass


@functools.lru_cache(maxsize=32)
def _open_source(src: dask_blocks.ArraySource) -> Array:
    """A read-only array opened by location, once per process (dask tasks)."""
    opts = json.loads(src.options_json) or None
    return open(src.location, src.path, storage_options=opts, zarr_format=src.zarr_format)


def read_source_block(src: dask_blocks.ArraySource, sel: tuple[slice, ...]) -> np.ndarray:
    """A dask task: read one block of the array a source names."""
    return np.asarray(_open_source(src)[sel])


_UNSET: Any = object()


def _as_codec(c: Any, field: str) -> Codec:
    return c if isinstance(c, Codec) else codec_from_dict(c, field)


def _compressor_v3(compressor: Any) -> list[Codec]:
    if compressor is None or compressor is _UNSET:
        return []
    if isinstance(compressor, str):
        return [codec_from_dict(compressor, "compressor")]
    if isinstance(compressor, Mapping) and "id" in compressor:
        codec = compressor_from_v2(compressor, 1)
        return [] if codec is None else [codec]
    return [_as_codec(compressor, "compressor")]


def _serializer_v3(dt: DataType) -> Codec:
    if dt.kind == "string":
        return VlenUtf8Codec()
    if dt.kind == "vbytes":
        return VlenBytesCodec()
    if dt.kind == "object":
        raise MetadataError("dtype", "object", "JSON object arrays exist only in zarr v2 (json2)")
    return BytesCodec()


def _filter_json(f: Any) -> Any:
    return f.to_v2() if isinstance(f, Filter) else f


def _filters_v3(filters: Sequence[Any] | None) -> list[Codec]:
    """v3 ``numcodecs.<id>`` array -> array codecs for numcodecs filter configurations."""
    out: list[Codec] = []
    for i, f in enumerate(filters or ()):
        entry = dict(_filter_json(f))
        cid = entry.pop("id", None)
        out.append(codec_from_dict({"name": f"numcodecs.{cid}", "configuration": entry}, f"filters[{i}]"))
    return out


def _requested_numpy_dtype(dtype: Any, dt: DataType) -> np.dtype[Any] | None:
    """The NumPy dtype the caller named (its byte order / fields matter for v2), if any."""
    if isinstance(dtype, DataType) or (isinstance(dtype, str) and dtype == dt.name):
        return None
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def _clear_for_create(kv: KvStore, overwrite: bool) -> None:
    """Refuse an existing node, or delete everything below it with ``overwrite``."""
    if any(k is not None for k in kv.get_many(["zarr.json", ".zarray", ".zgroup"])):
        if not overwrite:
            raise NodeExistsError(f"an array or group already exists at {kv.url}")
        kv.delete_prefix("")


def _v3_codecs(
    dt: DataType,
    shape_t: tuple[int, ...],
    chunk_t: tuple[int, ...],
    *,
    codecs: Sequence[Any] | None,
    compressor: Any,
    filters: Sequence[Any] | None,
    order: str,
    shards: Sequence[int] | None,
    index_location: str,
) -> tuple[list[Codec], tuple[int, ...]]:
    """The codec list and chunk grid :func:`create` writes for ``zarr_format=3``."""
    if codecs is not None:
        codec_list = [_as_codec(c, f"codecs[{i}]") for i, c in enumerate(codecs)]
        if compressor is not _UNSET:
            raise ValueError("pass either codecs or compressor, not both")
    else:
        codec_list = [_serializer_v3(dt), *_compressor_v3(compressor)]
        codec_list[:0] = _filters_v3(filters)
        if order == "F" and len(shape_t) > 1:
            codec_list.insert(0, TransposeCodec("F"))
    if shards is None:
        return codec_list, chunk_t
    shard_t = parse_shape(list(shards), "shards", minimum=1)
    if len(shard_t) != len(shape_t):
        raise MetadataError("shards", list(shard_t), f"expected {len(shape_t)} dimensions")
    return [ShardingCodec(chunk_t, codec_list, None, index_location)], shard_t


def _v2_metadata(
    shape_t: tuple[int, ...],
    chunk_t: tuple[int, ...],
    dt: DataType,
    nd: np.dtype[Any] | None,
    *,
    compressor: Any,
    fill_value: Any,
    order: str,
    dimension_separator: str | None,
    attributes: Mapping[str, Any] | None,
    filters: Sequence[Any] | None,
) -> ArrayMetadataV2:
    """The ``.zarray`` :func:`create` writes for ``zarr_format=2``."""
    filter_list = filters_from_v2([_filter_json(f) for f in filters]) if filters else None
    comp: BytesBytesCodec | None
    if compressor is _UNSET or compressor is None:
        comp = None
    elif isinstance(compressor, BytesBytesCodec):
        comp = compressor
    elif isinstance(compressor, str):
        comp = compressor_from_v2({"id": compressor}, dt.itemsize)
    else:
        comp = compressor_from_v2(compressor, dt.itemsize)
    stored = dt.dtype
    byteorder = "<"
    dtype_string: Any
    if dt.kind == "struct":
        assert nd is not None
        stored = nd
        dtype_string = struct_v2_json(nd)
    elif nd is not None and nd.byteorder == ">" and nd.itemsize > 1:
        stored = nd
        byteorder = ">"
        dtype_string = v2_dtype_string(dt, byteorder)
    else:
        dtype_string = v2_dtype_string(dt, byteorder)
    fill2 = None if fill_value is None else normalize_fill_value(fill_value, dt)
    return ArrayMetadataV2(
        shape=shape_t,
        data_type=dt,
        chunk_shape=chunk_t,
        fill_value=fill2,
        compressor=comp,
        order=order,
        dimension_separator=dimension_separator or ".",
        stored_dtype=stored,
        attributes=dict(attributes) if attributes else None,
        dtype_string=dtype_string,
        filters=filter_list,
    )


def create(
    store: Any,
    path: str = "",
    *,
    shape: Sequence[int] | int,
    dtype: Any,
    chunks: Sequence[int] | int | None = None,
    shards: Sequence[int] | None = None,
    codecs: Sequence[Any] | None = None,
    compressor: Any = _UNSET,
    zarr_format: int = 3,
    fill_value: Any = None,
    attributes: Mapping[str, Any] | None = None,
    dimension_names: Sequence[str | None] | None = None,
    chunk_key_encoding: Any = None,
    dimension_separator: str | None = None,
    order: str = "C",
    index_location: str = "end",
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    write_empty_chunks: bool = False,
    fill_missing: bool = True,
    filters: Sequence[Any] | None = None,
) -> Array:
    """Create an array (writing its metadata) and return it open for writing.

    v3: ``codecs`` is the full codec list (dicts, names or codec objects); without it the
    chain is ``bytes`` plus ``compressor`` (a codec, a name such as ``"zstd"``, or a v3 codec
    dict).  ``shards`` makes the chunk grid ``shards`` with a ``sharding_indexed`` codec whose
    inner chunks are ``chunks``.  v2: ``compressor`` is a v2 compressor dict (``{"id": "zstd",
    "level": 1}``) or codec; ``order`` and ``dimension_separator`` apply.  ``fill_value=None``
    means zero in v3 and ``null`` in v2, as TensorStore does.  ``overwrite=True`` deletes every
    key below the array's path first.

    ``dtype`` may also be ``str`` / NumPy ``StringDType`` (v3 ``string`` with ``vlen-utf8``, v2
    ``|O`` with the ``vlen-utf8`` object codec), ``object`` (variable-length bytes), ``S<n>``
    or ``U<n>``.  ``filters`` are numcodecs filter configurations (``{"id": "delta", "dtype":
    "<i4"}``...): the v2 ``filters`` member, or ``numcodecs.<id>`` array -> array codecs in v3.
    """
    if zarr_format not in (2, 3):
        raise ValueError(f"zarr_format must be 2 or 3, not {zarr_format!r}")
    kv = resolve_store(store, path, mode="w", storage_options=storage_options)
    if kv.read_only:
        raise ReadOnlyError(f"{kv.url} is read-only")
    shape_t = parse_shape([shape] if isinstance(shape, int) else list(shape), "shape")
    if chunks is None:
        chunk_t = tuple(max(1, s) for s in shape_t)
    else:
        chunk_t = parse_shape([chunks] if isinstance(chunks, int) else list(chunks), "chunks", minimum=1)
    if len(chunk_t) != len(shape_t):
        raise MetadataError("chunks", list(chunk_t), f"expected {len(shape_t)} dimensions like shape")
    dt = data_type_from_numpy(dtype)
    nd = _requested_numpy_dtype(dtype, dt)
    _clear_for_create(kv, overwrite)

    meta: ArrayMetadata
    if zarr_format == 3 and dt.kind == "struct":
        raise MetadataError("dtype", str(dtype), "structured dtypes need zarr_format=2")
    if zarr_format == 3:
        if dimension_separator is not None and chunk_key_encoding is None:
            chunk_key_encoding = {"name": "default", "configuration": {"separator": dimension_separator}}
        cke = (
            ChunkKeyEncoding()
            if chunk_key_encoding is None
            else chunk_key_encoding
            if isinstance(chunk_key_encoding, ChunkKeyEncoding)
            else ChunkKeyEncoding.from_json(chunk_key_encoding)
        )
        fill = default_fill_value(dt) if fill_value is None else normalize_fill_value(fill_value, dt)
        codec_list, grid = _v3_codecs(
            dt, shape_t, chunk_t, codecs=codecs, compressor=compressor, filters=filters, order=order,
            shards=shards, index_location=index_location,
        )
        meta = ArrayMetadataV3(
            shape=shape_t,
            data_type=dt,
            chunk_shape=grid,
            fill_value=fill,
            codecs=codec_list,
            chunk_key_encoding=cke,
            attributes=dict(attributes) if attributes else None,
            dimension_names=None if dimension_names is None else tuple(dimension_names),
        )
        kv.set("zarr.json", meta.to_bytes())
    else:
        if shards is not None or codecs is not None:
            raise ValueError("shards and codecs are zarr v3 features; use compressor for v2")
        if dimension_names is not None:
            raise ValueError("dimension_names is a zarr v3 feature")
        meta = _v2_metadata(
            shape_t, chunk_t, dt, nd, compressor=compressor, fill_value=fill_value, order=order,
            dimension_separator=dimension_separator, attributes=attributes, filters=filters,
        )
        kv.set(".zarray", meta.to_bytes())
        attrs = meta.attrs_bytes()
        if attrs is not None:
            kv.set(".zattrs", attrs)
    return Array(kv, meta, mode="a", fill_missing=fill_missing, write_empty_chunks=write_empty_chunks)
