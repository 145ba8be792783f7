"""``metadata()``: shapes, dtypes, chunking and stored sizes of a checkpoint without its data.

Reads ``_METADATA``, the Zarr metadata of every array (one batched lookup) and, for OCDBT,
the B-tree leaf entries (which record each value's length), never a chunk.  No JAX, no
devices.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from itertools import compress, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import Kind, StepEntry
from ocdbt_py.checkpoint.layout import list_steps as _list_steps
from ocdbt_py.checkpoint.pytree import build_tree
from ocdbt_py.checkpoint.restore.api import PathLike, bare_array_leaf
from ocdbt_py.checkpoint.restore.gcpause import paused_gc
from ocdbt_py.checkpoint.restore.item import ARRAY, EMPTY, INLINE, SCALAR, STRING, Leaf, PyTreeItem
from ocdbt_py.checkpoint.restore.location import ItemLocation, locate
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from zarr3.dtypes import parse_data_type_v3, parse_dtype_v2
from zarr3.engine.json_text import parse as parse_json_text

__all__ = ["LeafMetadata", "StepEntry", "metadata", "list_steps", "item_metadata", "describe"]


@dataclasses.dataclass(slots=True)
class LeafMetadata:
    """What is stored for one leaf.

    ``kind`` is ``"array"`` (restored as an ndarray), ``"scalar"`` (a Python scalar),
    ``"string"``, ``"empty"`` (``None`` or an empty container) or ``"inline"`` (a value kept
    in a legacy msgpack file).  For arrays and scalars: ``shape``, ``dtype``, ``chunks`` (the
    shape of one stored chunk, the unit a reader decodes), ``nbytes`` (in memory),
    ``stored_bytes`` (on storage, compressed; ``None`` when unknown without extra requests),
    ``chunks_stored`` (number of chunk values present), ``zarr_format``, ``codecs`` (names),
    ``write_shape`` (the per-replica shape Orbax wrote) and ``sharding`` (from ``_sharding``,
    as saved).  ``value`` holds the value of strings, empty and inline leaves.
    """

    name: str
    path: tuple[str | int, ...]
    kind: str
    value_type: str
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    chunks: tuple[int, ...] | None = None
    nbytes: int | None = None
    stored_bytes: int | None = None
    chunks_stored: int | None = None
    zarr_format: int | None = None
    codecs: tuple[str, ...] = ()
    write_shape: tuple[int, ...] | None = None
    sharding: Any = None
    random_key_impl: str | None = None
    value: Any = None

    @property
    def nchunks(self) -> int | None:
        """Number of chunks in the chunk grid."""
        if self.shape is None or self.chunks is None:
            return None
        return math.prod(-(-s // c) if c else 0 for s, c in zip(self.shape, self.chunks))

    def __repr__(self) -> str:
        if self.kind in (ARRAY, SCALAR):
            return f"LeafMetadata({self.name!r}, {self.dtype}{list(self.shape or ())}, chunks={self.chunks})"
        return f"LeafMetadata({self.name!r}, {self.kind}, {self.value!r})"


# -- Zarr metadata summaries --------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _dtype_v2(s: str) -> np.dtype:

    return parse_dtype_v2(s)[0].dtype


@functools.lru_cache(maxsize=256)
def _dtype_v3(s: str) -> np.dtype:

    return parse_data_type_v3(s).dtype


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise CorruptionError(f"zarr metadata {what} is not a list of non-negative integers: {v!r}")
    return tuple(v)


def summarize_zarr(raw: bytes, v3: bool) -> dict[str, Any]:
    """``shape``, ``dtype``, ``chunks``, ``grid``, ``codecs`` and ``zarr_format`` of a Zarr
    metadata document, without building codecs (fast for many arrays)."""
    try:
        doc = parse_json_text(raw.decode("utf-8"))  # bounded depth and integer literals
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptionError(f"zarr metadata is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise CorruptionError("zarr metadata is not a JSON object")
    try:
        if v3:
            shape = _ints(doc.get("shape"), "shape")
            dt = doc.get("data_type")
            dtype = _dtype_v3(dt) if isinstance(dt, str) else _dtype_v3(json.dumps(dt))
            grid = _ints(((doc.get("chunk_grid") or {}).get("configuration") or {}).get("chunk_shape"), "chunk_shape")
            codecs = doc.get("codecs") or []
            names = []
            chunks = grid
            for c in codecs if isinstance(codecs, list) else []:
                c = {"name": c} if isinstance(c, str) else c
                if not isinstance(c, dict):
                    continue
                names.append(str(c.get("name")))
                if c.get("name") == "sharding_indexed":
                    cfg = c.get("configuration") or {}
                    chunks = _ints(cfg.get("chunk_shape"), "sharding chunk_shape")
                    names.extend(str((x if isinstance(x, dict) else {"name": x}).get("name"))
                                 for x in cfg.get("codecs") or [])
            return {"shape": shape, "dtype": dtype, "chunks": chunks, "grid": grid, "codecs": tuple(names),
                    "zarr_format": 3, "nbytes": math.prod(shape) * dtype.itemsize}
        shape = _ints(doc.get("shape"), "shape")
        if not isinstance(doc.get("dtype"), str):
            raise CorruptionError(f"unsupported zarr v2 dtype {doc.get('dtype')!r}")
        dtype = _dtype_v2(doc["dtype"])
        grid = _ints(doc.get("chunks"), "chunks")
        comp = doc.get("compressor")
        names = [str(comp.get("id"))] if isinstance(comp, dict) else []
        return {"shape": shape, "dtype": dtype, "chunks": grid, "grid": grid, "codecs": tuple(names),
                "zarr_format": 2, "nbytes": math.prod(shape) * dtype.itemsize}
    except (TypeError, ValueError, KeyError) as e:
        if isinstance(e, CorruptionError):
            raise
        raise CorruptionError(f"malformed zarr metadata: {e}") from e


def _local_sizes(kv: KvStore) -> bool:
    return kv.local_path() is not None


def item_metadata(item: PyTreeItem, *, stored_sizes: bool | None = None) -> Any:
    """The :class:`LeafMetadata` tree of an opened PyTree item."""
    leaves = item.leaves
    arrays = [leaf for leaf in leaves if leaf.kind in (ARRAY, SCALAR)]
    params = list(dict.fromkeys(map(item.data_param, arrays)))
    rows = _Rows()
    if params:
        store = item.array_store
        if store.databases:
            raws, rows.sizes = _scan_ocdbt(item, params, want_sizes=stored_sizes is not False)
        else:
            raws = _fetch_metadata(item, params)
            if stored_sizes is True or (stored_sizes is None and _local_sizes(store.kv)):
                rows.sizes = _dir_sizes(item, params, raws)
        rows.shardings = item.shardings()
        rows.heads = _zarr_heads(params, raws, store.kv.url)
    ams = item.array_metadatas() if arrays else {}
    strings_needed = any(leaf.kind == STRING for leaf in leaves)
    if ams:
        values = [_leaf_metadata(item, leaf, rows, ams, strings_needed) for leaf in leaves]
    else:
        values = _leaf_metadatas(item, leaves, rows, strings_needed)
    return build_tree([(leaf.keys, v) for leaf, v in zip(leaves, values)])


class _Rows:
    """Per parameter: ``heads`` (shape, dtype, chunks, nbytes, zarr_format, codecs; one tuple
    shared by the parameters of the same Zarr metadata), ``sizes`` (stored bytes, chunks
    stored) and ``shardings``."""

    __slots__ = ("heads", "sizes", "shardings")

    def __init__(self) -> None:
        self.heads: dict[str, tuple[Any, ...]] = {}
        self.sizes: dict[str, tuple[int, int]] = {}
        self.shardings: dict[str, Any] = {}

    def row(self, p: str) -> tuple[Any, ...]:
        """The :class:`LeafMetadata` fields of parameter ``p`` from the shape to the codecs,
        then its sharding."""
        h = self.heads[p]
        stored, nstored = self.sizes.get(p, (None, None))
        return h[0], h[1], h[2], h[3], stored, nstored, h[4], h[5], self.shardings.get(p)


def _zarr_heads(params: Sequence[str], raws: dict[str, tuple[str, bytes]], url: str) -> dict[str, tuple[Any, ...]]:
    """Each parameter's summary of its Zarr metadata document, each distinct document parsed once."""
    docs = list(map(raws.get, params))
    if None in docs:
        p = params[docs.index(None)]
        raise CorruptionError(f"no Zarr metadata (.zarray or zarr.json) for array {p!r}", path=url)
    parsed: dict[Any, tuple[Any, ...]] = {}
    for doc in dict.fromkeys(docs):
        assert doc is not None
        try:
            d = summarize_zarr(doc[1], doc[0] == "zarr.json")
        except CorruptionError as e:
            p = params[docs.index(doc)]
            raise CorruptionError(f"array {p!r}: {e.reason}", path=url) from e
        parsed[doc] = (d["shape"], d["dtype"], d["chunks"], d["nbytes"], d["zarr_format"], d["codecs"])
    return dict(zip(params, map(parsed.__getitem__, docs)))


def _scan_ocdbt(item: PyTreeItem, params: Sequence[str], *, want_sizes: bool
                ) -> tuple[dict[str, tuple[str, bytes]], dict[str, tuple[int, int]]]:
    """One pass over the B+tree leaves: Zarr metadata (inline there) and chunk value sizes.

    Works on whole leaf nodes at a time (:meth:`OcdbtStore.entry_columns`): no Python object
    per stored value, the sizes summed per parameter with ``np.bincount``.
    """
    prefer = "zarr.json" if item.use_zarr3 else ".zarray"
    pbs = [p.encode("utf-8", "surrogateescape") for p in params]
    ids = {pb: j for j, pb in enumerate(pbs)}
    raws: dict[str, tuple[str, bytes]] = {}
    out_of_line: dict[str, str] = {}
    size_sum = np.zeros(len(pbs) + 1, np.int64)
    count = np.zeros(len(pbs) + 1, np.int64)
    for db in item.array_store.databases:
        for cols in db.entry_columns():
            keys = cols.keys
            metas = list(compress(range(len(keys)), map(bytes.endswith, keys, repeat((b"/.zarray", b"/zarr.json")))))
            if want_sizes:
                _add_sizes(keys, cols.sizes, metas, ids, size_sum, count)
            # the other document first, then the preferred one, which replaces it
            for name in (".zarray", "zarr.json") if prefer == "zarr.json" else ("zarr.json", ".zarray"):
                cut, v2 = (8, True) if name == ".zarray" else (10, False)
                idx = [i for i in metas if (keys[i][-1] == 0x79) is v2]  # 'y'
                found = zip(idx, map(ids.get, [keys[i][:-cut] for i in idx]))
                sel = [(i, params[j]) for i, j in found if j is not None and (name == prefer or params[j] not in raws)]
                got = cols.inline([i for i, _ in sel])
                if None not in got:  # all inline (the usual case): no Python loop
                    raws.update(zip([p for _, p in sel], zip(repeat(name), got)))
                    continue
                for (_, p), inline in zip(sel, got):
                    if inline is not None:
                        raws[p] = (name, inline)
                    else:
                        out_of_line[p] = name
    missing = [p for p in out_of_line if p not in raws]
    if missing:
        got = item.array_store.kv.get_many([f"{p}/{out_of_line[p]}" for p in missing])
        for p, raw in zip(missing, got):
            if raw is not None:
                raws[p] = (out_of_line[p], raw)
    sizes = dict(zip(params, zip(size_sum.tolist(), count.tolist()))) if want_sizes else {}
    return raws, sizes


def _add_sizes(keys: list[bytes], sizes: list[int], metas: list[int], ids: dict[bytes, int],
               size_sum: np.ndarray, count: np.ndarray) -> None:
    """Add each chunk value's size to its parameter's total (the metadata keys ``metas``
    and keys of no wanted parameter excluded)."""
    none = len(ids)
    parents = map(itemgetter(0), map(bytes.rpartition, keys, repeat(b"/")))
    owner = np.fromiter(map(ids.get, parents, repeat(none)), np.int64, len(keys))
    unowned = owner == none
    unowned[metas] = False
    owner[metas] = none
    for i in np.flatnonzero(unowned).tolist():  # v3 keys "<p>/c/0/1"; names may hold "/"
        pb = keys[i].rpartition(b"/")[0]
        while pb and pb not in ids:
            pb = pb.rpartition(b"/")[0]
        owner[i] = ids.get(pb, none)
    sz = np.asarray(sizes, np.int64)
    size_sum += np.bincount(owner, weights=sz, minlength=none + 1).astype(np.int64)
    count += np.bincount(owner, minlength=none + 1)


def _fetch_metadata(item: PyTreeItem, params: Sequence[str]) -> dict[str, tuple[str, bytes]]:
    kv = item.array_store.kv
    first, second = ("zarr.json", ".zarray") if item.use_zarr3 else (".zarray", "zarr.json")
    raws: dict[str, tuple[str, bytes]] = {}
    pending = list(params)
    for name in (first, second):
        if not pending:
            break
        got = kv.get_many([f"{p}/{name}" for p in pending])
        nxt = []
        for p, raw in zip(pending, got):
            if raw is None:
                nxt.append(p)
            else:
                raws[p] = (name, raw)
        pending = nxt
    return raws


def _dir_sizes(item: PyTreeItem, params: Sequence[str], raws: dict[str, tuple[str, bytes]]
               ) -> dict[str, tuple[int, int]]:
    """Chunk file sizes of per-parameter directories (one listing and one stat per file)."""
    kv = item.array_store.kv
    out: dict[str, tuple[int, int]] = {}
    for p in params:
        total = count = 0
        v3 = raws.get(p, ("", b""))[0] == "zarr.json"
        for key in kv.list(p + "/"):
            rest = key[len(p) + 1:]
            if rest in (".zarray", "zarr.json", ".zattrs"):
                continue
            if "/" in rest and not (v3 and (rest == "c" or rest.startswith("c/"))):
                continue  # another param nested below this one (names with "/")
            size = kv.size(key)
            if size is not None:
                total += size
                count += 1
        out[p] = (total, count)
    return out


def _leaf_metadatas(item: PyTreeItem, leaves: Sequence[Leaf], rows: _Rows, strings: bool) -> list[LeafMetadata]:
    """:func:`_leaf_metadata` of every leaf of an item without ``array_metadatas/``: one loop,
    no call per array leaf."""
    lm = LeafMetadata
    heads, sizes, shardings = rows.heads, rows.sizes, rows.shardings
    none2 = (None, None)
    out: list[LeafMetadata] = []
    add = out.append
    for leaf in leaves:
        kind = leaf.kind
        if kind in (ARRAY, SCALAR) and leaf.value is None:  # data under its own name
            p = leaf.param_name
            h = heads[p]
            stored, nstored = sizes.get(p, none2)
            add(lm(p, leaf.path, kind, leaf.value_type, h[0], h[1], h[2], h[3], stored, nstored, h[4], h[5],
                   leaf.write_shape, shardings.get(p) if shardings else None))
        else:
            add(_leaf_metadata(item, leaf, rows, {}, strings))
    return out


def _leaf_metadata(item: PyTreeItem, leaf: Leaf, rows: _Rows,
                   ams: dict[str, dict[str, Any]], strings: bool) -> LeafMetadata:
    kind = leaf.kind
    if kind in (ARRAY, SCALAR):
        p = item.data_param(leaf)
        shape, dtype, chunks, nbytes, stored, nstored, zarr_format, codecs, sharding = rows.row(p)
        md = LeafMetadata(leaf.param_name, leaf.path, kind, leaf.value_type, shape, dtype, chunks, nbytes, stored,
                          nstored, zarr_format, codecs, leaf.write_shape, sharding)
        am = ams.get(p) if ams else None
        if am is not None:
            if md.write_shape is None and isinstance(am.get("write_shape"), list):
                md.write_shape = tuple(am["write_shape"])
            ext = am.get("ext_metadata")
            if isinstance(ext, dict) and isinstance(ext.get("random_key_impl"), str):
                md.random_key_impl = ext["random_key_impl"]
        return md
    md = LeafMetadata(leaf.param_name, leaf.path, kind, leaf.value_type, write_shape=leaf.write_shape)
    if kind == STRING and strings:
        md.value = item.string_value(leaf)
    elif kind in (EMPTY, INLINE):
        md.value = leaf.value
        if isinstance(leaf.value, np.ndarray):
            md.shape, md.dtype, md.nbytes = leaf.value.shape, leaf.value.dtype, leaf.value.nbytes
    return md


def _item_meta(loc: ItemLocation, stored_sizes: bool | None) -> Any:
    if loc.kind == Kind.JSON:
        return read_json(loc.store, loc.json_file) if loc.json_file else None
    if loc.kind == Kind.JSON_DIR:
        return {f: read_json(loc.store, f) for f in loc.listing.files if f.endswith(".json")}
    item = PyTreeItem(loc.store, listing=loc.listing)
    try:
        tree = item_metadata(item, stored_sizes=stored_sizes)
        if bare_array_leaf(item, loc.handler) is not None and isinstance(tree, dict):
            return tree["checkpoint"]
        return tree
    finally:
        item.close()


def metadata(
    path: PathLike,
    *,
    item: str | None = None,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
    stored_sizes: bool | None = None,
) -> Any:
    """The stored tree with a :class:`LeafMetadata` per leaf, reading no array data.

    Accepts the same locations as :func:`~ocdbt_py.checkpoint.restore` (an item, a step with
    several items -> ``{item: tree}``, a manager root -> its latest step or ``step=``).  JSON
    items come back parsed.  ``stored_sizes`` (compressed bytes per array) is computed from
    the OCDBT B-tree for free; for per-parameter directories it needs one request per chunk
    file, so by default only local directories get it (``True`` forces, ``False`` skips).
    """
    # One pause of the cyclic collector for the whole burst of small objects, ended once the
    # temporaries (parsed JSON, leaves) are freed: the collection that follows then visits
    # only the result.
    with paused_gc():
        return _metadata(path, item, step, storage_options, stored_sizes)


def _metadata(path: PathLike, item: str | None, step: int | None, storage_options: dict[str, Any] | None,
              stored_sizes: bool | None) -> Any:
    loc = locate(path, step=step, item=item, storage_options=storage_options)
    if loc.unwrap is not None:
        return _item_meta(loc.items[loc.unwrap], stored_sizes)
    return {name: _item_meta(il, stored_sizes) for name, il in loc.items.items()}


def list_steps(path: PathLike, *, storage_options: dict[str, Any] | None = None) -> list[StepEntry]:
    """The finalized steps of a CheckpointManager root, oldest first (uncommitted ones are
    skipped with an :class:`~ocdbt_py.checkpoint.UncommittedStepWarning`)."""
    kv = open_kvstore(path, storage_options, read_only=True)
    return _list_steps(kv)


def describe(md: LeafMetadata) -> str:
    """A one-line human description: ``float32[8, 16] 512 B (chunks 2x8, zstd)``."""
    if md.kind in (ARRAY, SCALAR):
        shape = ", ".join(str(d) for d in md.shape or ())
        extra = []
        if md.chunks is not None and md.chunks != md.shape:
            extra.append("chunks " + "x".join(str(c) for c in md.chunks))
        if md.codecs:
            extra.append("/".join(c for c in md.codecs if c not in ("bytes", "crc32c", "sharding_indexed")) or "raw")
        tail = f" ({', '.join(extra)})" if extra else ""
        return f"{md.dtype}[{shape}]{tail}"
    if md.kind == STRING:
        return f"str {md.value!r}" if md.value is not None else "str"
    return repr(md.value)
