"""One PyTree item: its leaves, where their values are stored, and reading them.

The leaf list comes from ``_METADATA`` (current Orbax), from the legacy msgpack ``checkpoint``
file (Orbax up to 0.5; merged with ``_METADATA`` when both exist, as Orbax does), or, for the
oldest checkpoints, from the array names alone.  See ``spec/orbax.md`` section 3.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.jsonio import parse_json, read_bytes, read_json
from ocdbt_py.checkpoint.layout import Listing
from ocdbt_py.checkpoint.pytree import build_tree
from ocdbt_py.checkpoint.restore import msgpack_legacy
from ocdbt_py.checkpoint.restore.gcpause import paused_gc
from ocdbt_py.checkpoint.restore.reader import ArrayReader, LazyArray, start_prefetch
from ocdbt_py.checkpoint.restore.remoteread import Prefetch
from ocdbt_py.checkpoint.restore.storage import ArrayStore, open_array_store
from ocdbt_py.checkpoint.treemeta import (
    ARRAY,
    EMPTY,
    EMPTY_VALUE_TYPES,
    INLINE,
    KEY_DICT,
    KEY_SEQUENCE,
    SCALAR,
    STRING,
    Leaf,
    TreeMetadata,
    empty_value,
    parse_tree_metadata_bytes,
)
from ocdbt_py.errors import CorruptionError, NotFoundError, OcdbtError, UnsupportedError
from ocdbt_py.kvstore.base import KvStore

__all__ = ["Leaf", "PyTreeItem", "ARRAY", "SCALAR", "STRING", "EMPTY", "INLINE"]

#: Largest legacy msgpack file read (inline values of Orbax <= 0.5 were capped by the writer
#: at a few GiB; anything bigger is refused rather than loaded).
MAX_MSGPACK_BYTES = 4 << 30


class PyTreeItem:
    """A PyTree item directory, opened for reading.

    ``kv`` is a store rooted at the item directory.  Nothing but the small metadata files is
    read on construction; array data is read by :meth:`read_values` / :meth:`restore`.
    """

    def __init__(self, kv: KvStore, *, listing: Listing | None = None, prefetch: bool = False):
        self.kv = kv
        self.listing = listing or Listing.of(kv)
        self.tree_metadata: TreeMetadata | None = None
        self._store: ArrayStore | None = None
        self._prefetch: Prefetch | None = None
        if kv.supports_read_ahead and ("manifest.ocdbt" in self.listing.files
                                    or any(d.startswith("ocdbt.process_") for d in self.listing.dirs)):
            # open the database first: its B+tree root is then fetched while _METADATA is parsed;
            # and for a restore of everything (``prefetch``), the data files start arriving too
            try:
                self._store = open_array_store(kv, files=self.listing.files, dirs=self.listing.dirs, use_ocdbt=None)
            except OcdbtError:
                self._store = None  # reported when the arrays are read, as for other stores
            if prefetch and self._store is not None:
                self._prefetch = start_prefetch(self._store, self.listing.sizes)
        raw = read_bytes(kv, "_METADATA") if "_METADATA" in self.listing.files else None
        if raw is not None:
            try:
                self.tree_metadata = parse_tree_metadata_bytes(raw)
            except CorruptionError as e:  # the parser names the document, this reader the file
                raise CorruptionError(e.reason, path=f"{kv.url.rstrip('/')}/_METADATA") from e
        self._reader: ArrayReader | None = None
        self._strings: Any = None
        self._array_metadatas: dict[str, dict[str, Any]] | None = None
        self._msgpack: Any = None
        if "checkpoint" in self.listing.files:
            raw = read_bytes(kv, "checkpoint", MAX_MSGPACK_BYTES)
            if raw is not None:
                self._msgpack = msgpack_legacy.unpack(raw)
        self.leaves = self._build_leaves()

    # -- structure -----------------------------------------------------------------------------
    @property
    def use_zarr3(self) -> bool:
        """Whether arrays are Zarr v3 (from ``_METADATA``; detected per array otherwise)."""
        return bool(self.tree_metadata and self.tree_metadata.use_zarr3)

    @property
    def fill_missing(self) -> bool:
        """Whether a missing chunk reads as the fill value (False: it is an error)."""
        return not (self.tree_metadata and self.tree_metadata.store_array_data_equal_to_fill_value)

    @property
    def custom_metadata(self) -> Any:
        """``custom_metadata`` saved with the tree (or ``None``)."""
        return self.tree_metadata.custom_metadata if self.tree_metadata else None

    def _build_leaves(self) -> list[Leaf]:
        tm = self.tree_metadata
        mp = self._msgpack
        if tm is None:
            if mp is not None:
                return self._leaves_from_msgpack(mp)
            return self._leaves_from_names()
        leaves = tm.leaves
        if mp is None or _only_placeholders(mp):
            return leaves
        # Both files (Orbax <= 0.5 with aggregated values): the structure is _METADATA's; a
        # leaf whose msgpack value is not a placeholder takes that inline value.
        inline = {leaf.names: leaf for leaf in self._leaves_from_msgpack(mp)
                  if leaf.kind in (INLINE, EMPTY)}
        out = []
        for leaf in leaves:
            m = inline.get(leaf.names)
            out.append(m if m is not None else leaf)
        return out

    def _leaves_from_msgpack(self, doc: Any) -> list[Leaf]:
        """Leaves of a msgpack tree: placeholders are arrays (their type is unknown without
        ``_METADATA``), everything else an inline value."""
        stack: list[tuple[tuple[tuple[str, int], ...], Any]] = [((), doc)]
        out: list[Leaf] = []
        while stack:
            keys, x = stack.pop()
            if isinstance(x, dict) and x:
                for k, v in reversed(list(x.items())):
                    stack.append((keys + ((str(k), KEY_DICT),), v))
            elif isinstance(x, list) and x:
                for i in range(len(x) - 1, -1, -1):
                    stack.append((keys + ((str(i), KEY_SEQUENCE),), x[i]))
            elif isinstance(x, msgpack_legacy.Placeholder):
                value: Any = None
                if str(x) != ".".join(k for k, _ in keys):
                    value = str(x)  # the data is stored under another name
                out.append(Leaf(keys, ARRAY, "np.ndarray", None, value))
            elif isinstance(x, dict):
                out.append(Leaf(keys, EMPTY, "Dict", value={}))
            elif isinstance(x, list):
                out.append(Leaf(keys, EMPTY, "List", value=[]))
            elif x is None:
                out.append(Leaf(keys, EMPTY, "None"))
            elif isinstance(x, msgpack_legacy.ExtValue):
                raise UnsupportedError(f"legacy msgpack leaf {'.'.join(k for k, _ in keys)!r} has unknown "
                                       f"extension type {x.code}")
            else:
                out.append(Leaf(keys, INLINE, type(x).__name__, value=x))
        return out

    def _leaves_from_names(self) -> list[Leaf]:
        """The oldest layout: no metadata at all; param names split on ``.`` give the tree."""
        names = sorted(self._array_names())
        if not names:
            raise NotFoundError(
                f"{self.kv.url} is not an Orbax checkpoint: it has no _METADATA, no msgpack 'checkpoint' "
                f"file and no Zarr arrays (a plain OCDBT database? 'ocdbt ls' lists its keys)"
            )
        return [Leaf(tuple((part, KEY_DICT) for part in n.split(".")), ARRAY, "np.ndarray") for n in names]

    def _array_names(self) -> set[str]:
        names: set[str] = set()
        for key in self.array_store.kv.list():
            for suffix in ("/.zarray", "/zarr.json"):
                if key.endswith(suffix):
                    names.add(key[: -len(suffix)])
        return names

    # -- storage -------------------------------------------------------------------------------
    @property
    def array_store(self) -> ArrayStore:
        """Where the arrays live (opened on first use)."""
        if self._store is None:
            tm = self.tree_metadata
            self._store = open_array_store(
                self.kv, files=self.listing.files, dirs=self.listing.dirs,
                use_ocdbt=tm.use_ocdbt if tm else None,
            )
        return self._store

    @property
    def reader(self) -> ArrayReader:
        """The array reader (opened on first use)."""
        if self._reader is None:
            self._reader = ArrayReader(self.array_store, fill_missing=self.fill_missing, zarr3=self.use_zarr3)
            self._reader._prefetch, self._prefetch = self._prefetch, None
        return self._reader

    @property
    def layout(self) -> str:
        """``"ocdbt"``, ``"ocdbt-per-process"`` or ``"dirs"``."""
        return self.array_store.layout

    def data_param(self, leaf: Leaf) -> str:
        """The name under which a leaf's data is stored."""
        v = leaf.value
        if v is not None and type(v) is str and (leaf.kind == ARRAY or leaf.kind == SCALAR):
            return v  # legacy placeholder naming another param
        return leaf.param_name

    def strings(self) -> Any:
        """The parsed ``_strings.json`` (``{}`` if absent)."""
        if self._strings is None:
            doc = read_json(self.kv, "_strings.json")
            self._strings = doc if doc is not None else {}
        return self._strings

    def string_value(self, leaf: Leaf) -> str:
        """A string leaf's value, found at JSON pointer ``/<param name>``."""
        node = self.strings()
        for part in leaf.param_name.split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise CorruptionError(f"_strings.json has no value for {leaf.param_name!r}", path=self.kv.url)
            node = node[part]
        if not isinstance(node, str):
            raise CorruptionError(f"_strings.json value for {leaf.param_name!r} is not a string", path=self.kv.url)
        return node

    def array_metadatas(self) -> dict[str, dict[str, Any]]:
        """``{param: {write_shape, chunk_shape, ext_metadata}}`` from ``array_metadatas/``."""
        if self._array_metadatas is None:
            out: dict[str, dict[str, Any]] = {}
            if "array_metadatas" in self.listing.dirs:
                _, files = self.kv.list_dir("array_metadatas/")
                for f in sorted(files):
                    doc = read_json(self.kv, f"array_metadatas/{f}")
                    entries = doc.get("array_metadatas") if isinstance(doc, dict) else None
                    for e in entries if isinstance(entries, list) else []:
                        am = e.get("array_metadata") if isinstance(e, dict) else None
                        if isinstance(am, dict) and isinstance(am.get("param_name"), str):
                            out.setdefault(am["param_name"], am)
            self._array_metadatas = out
        return self._array_metadatas

    def shardings(self) -> dict[str, Any]:
        """``{param: sharding description}`` from ``_sharding`` (empty if absent)."""

        if "_sharding" not in self.listing.files:
            return {}
        doc = read_json(self.kv, "_sharding")
        out: dict[str, Any] = {}
        for k, v in (doc.items() if isinstance(doc, dict) else ()):
            try:
                name = base64.urlsafe_b64decode(k.encode("ascii")).decode("utf-8")
                out[name] = parse_json(v.encode("utf-8"), what="_sharding entry") if isinstance(v, str) else v
            except (ValueError, UnicodeError, CorruptionError):
                continue
        return out

    # -- values --------------------------------------------------------------------------------
    def read_values(self, leaves: Sequence[Leaf], *, lazy: bool = False) -> list[Any]:
        """The restored value of each leaf (arrays read in batches)."""
        out: list[Any] = [None] * len(leaves)
        arrays: list[int] = []
        for i, leaf in enumerate(leaves):
            if leaf.kind == EMPTY:
                out[i] = empty_value(leaf.value_type) if leaf.value_type in EMPTY_VALUE_TYPES else None
            elif leaf.kind == INLINE:
                out[i] = leaf.value
            elif leaf.kind == STRING:
                out[i] = self.string_value(leaf)
            elif lazy and leaf.kind == ARRAY:
                out[i] = LazyArray(self.reader, self.data_param(leaf))
            else:
                arrays.append(i)
        if arrays:
            params = [self.data_param(leaves[i]) for i in arrays]
            by_param: dict[str, list[int]] = {}
            for i, p in zip(arrays, params):
                by_param.setdefault(p, []).append(i)
            for p, value in self.reader.read_many(list(by_param)):
                for i in by_param[p]:
                    out[i] = _finish_value(leaves[i], value, p)
        return out

    def restore(self, *, lazy: bool = False) -> Any:
        """The whole tree, as Orbax restores it without a target (arrays as NumPy)."""
        if not lazy and self.listing.sizes and any(leaf.kind in (ARRAY, SCALAR) for leaf in self.leaves):
            # every array will be read: on a remote store, start on the data files now, while
            # the B+tree and the Zarr metadata are read and parsed
            self.reader.prefetch_all(self.listing.sizes)
        values = self.read_values(self.leaves, lazy=lazy)
        with paused_gc():
            return build_tree([(leaf.keys, v) for leaf, v in zip(self.leaves, values)])

    def close(self) -> None:
        """Release the array store."""
        if self._store is not None:
            self._store.close()


def _finish_value(leaf: Leaf, value: np.ndarray, param: str) -> Any:
    if leaf.kind == SCALAR:
        if value.shape != ():
            if value.size != 1:
                raise CorruptionError(f"scalar leaf {param!r} is stored with shape {value.shape}")
            value = value.reshape(())
        return value.item()
    return value


def _only_placeholders(doc: Any) -> bool:
    """Whether every leaf is a placeholder (``None`` and empty containers are not leaves)."""
    stack = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif x is not None and not isinstance(x, msgpack_legacy.Placeholder):
            return False
    return True
