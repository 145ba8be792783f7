"""The user-facing OCDBT database object and :func:`open`."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

from ocdbt_py.errors import (
    ConditionFailedError,
    CorruptionError,
    NotFoundError,
    ReadOnlyError,
    UnsupportedError,
)
from ocdbt_py.format.config import MANIFEST_KIND_NUMBERED, Config
from ocdbt_py.format.data_file_table import IndirectDataReference
from ocdbt_py.format.manifest import Manifest
from ocdbt_py.format.version_tree import BtreeGenerationReference
from ocdbt_py.kvstore import KvStore, open_kvstore
from ocdbt_py.kvstore.base import ByteRange, ReadRequest, check_range, normalize_request, slice_range
from ocdbt_py.read.btree_read import iterate, iterate_keys, lookup, lookup_many
from ocdbt_py.read.cache import LruCache
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.read.snapshot import KeyLike, Snapshot, key_bounds, to_key
from ocdbt_py.read.version_read import all_versions, find_generation, find_time, read_manifest
from ocdbt_py.timeutil import format_nanoseconds, to_nanoseconds
from ocdbt_py.write import open_writer
from ocdbt_py.write.mutations import ANY as _ANY
from ocdbt_py.write.transaction import Transaction

__all__ = ["open", "OcdbtStore", "VersionInfo", "Entry", "Version"]

#: Serialises view updates of writable stores shared between threads.
_VIEW_LOCK = threading.Lock()

if TYPE_CHECKING:
    from ocdbt_py.write.commit import Writer


#: A version selector: a generation number, an ISO-8601 time string, or a ``datetime``.
Version = Union[int, str, _dt.datetime]


@dataclasses.dataclass(frozen=True)
class VersionInfo:
    """One committed generation of the database."""

    generation: int
    commit_time_ns: int
    num_keys: int
    num_tree_bytes: int
    num_indirect_value_bytes: int
    root_height: int
    root: IndirectDataReference | None

    @property
    def commit_time(self) -> _dt.datetime:
        """Commit time as an aware UTC ``datetime`` (microsecond precision)."""
        return _dt.datetime.fromtimestamp(self.commit_time_ns / 1e9, tz=_dt.timezone.utc)

    @property
    def commit_time_iso(self) -> str:
        """Commit time as ISO-8601 with nanoseconds."""
        return format_nanoseconds(self.commit_time_ns)

    @classmethod
    def _from(cls, v: BtreeGenerationReference) -> VersionInfo:
        s = v.statistics
        return cls(v.generation_number, v.commit_time, s.num_keys, s.num_tree_bytes,
                   s.num_indirect_value_bytes, v.root_height, v.root)


@dataclasses.dataclass(frozen=True)
class Entry:
    """A key with where its value lives: ``location`` is ``None`` for inline values, whose
    bytes are then in ``inline`` (free: they are stored in the B+tree leaf)."""

    key: bytes
    size: int
    location: IndirectDataReference | None
    inline: bytes | None = None


class OcdbtStore:
    """An OCDBT database opened at one version (the latest unless ``version`` was given).

    Keys are ``bytes`` (``str`` is accepted and encoded as UTF-8).  The manifest is read on
    open; call :meth:`refresh` to see commits made since.
    """

    _manifest: Manifest
    _manifest_key: str
    _reader: NodeReader
    _selected: BtreeGenerationReference | None

    def __init__(
        self,
        kv: KvStore,
        *,
        version: Version | None = None,
        cache_bytes: int = 64 << 20,
        writer: Writer | None = None,
        view_of: OcdbtStore | None = None,
    ):
        self.kvstore = kv
        self._version_spec = version
        if view_of is not None:  # at(): a read-only view sharing the cache, reader and manifest
            self._cache: LruCache[object] = view_of._cache
            self._writer: Writer | None = None
            self._owns_resources = False  # it must not close what it shares
            self._manifest = view_of._manifest
            self._manifest_key = view_of._manifest_key
            self._reader = view_of._reader
            self._selected = self._select(version)
            return
        self._cache = LruCache(cache_bytes)
        self._writer = writer
        self._owns_resources = True
        self._load()

    def _load(self) -> None:
        if self._writer is not None:
            manifest, key = self._writer.load()
        else:
            manifest, key = read_manifest(self.kvstore)
        self._set_manifest(manifest, key)

    def _set_manifest(self, manifest: Manifest, key: str) -> None:
        reader: NodeReader | None = getattr(self, "_reader", None)
        if reader is None or reader.config != manifest.config:
            reader = NodeReader(self.kvstore, manifest.config, self._cache)
        selected = self._select_in(manifest, reader, self._version_spec)
        with _VIEW_LOCK:
            old: Manifest | None = getattr(self, "_manifest", None)
            if (
                getattr(self, "_writer", None) is not None and old is not None and old.versions
                and manifest.versions and old.config.uuid == manifest.config.uuid
                and manifest.latest.generation_number < old.latest.generation_number
            ):
                return  # threads sharing a writable store: never move the view backwards
            self._manifest = manifest
            self._manifest_key = key
            self._reader = reader
            self._selected = selected

    def _select(self, version: Version | None) -> BtreeGenerationReference | None:
        return self._select_in(self._manifest, self._reader, version)

    @staticmethod
    def _select_in(
        m: Manifest, reader: NodeReader, version: Version | None
    ) -> BtreeGenerationReference | None:
        if version is None:
            return m.versions[-1] if m.versions else None
        if isinstance(version, bool) or not isinstance(version, (int, str, _dt.datetime)):
            raise TypeError(f"version must be an int, ISO-8601 str or datetime, not {type(version).__name__}")
        if isinstance(version, int):
            return find_generation(reader, m, version)
        return find_time(reader, m, to_nanoseconds(version))

    def read_ahead_root(self) -> bool:
        """Start fetching the root node of the B+tree this store reads, where the underlying
        store can read ahead (object stores: see :meth:`ObjectStore.read_ahead`), and return
        at once; the first lookup or listing then finds it arriving or arrived.  ``False``
        when nothing was started."""
        if not self.kvstore.supports_read_ahead:
            return False
        sel = self._selected
        if sel is None or sel.root is None or sel.root.length == 0 or self._cache.get(("b", sel.root)) is not None:
            return False
        ref = sel.root
        try:
            key = self._reader.file_key(ref.file)
        except CorruptionError:
            return False  # reported by the first read
        return self.kvstore.read_ahead([(key, (ref.offset, ref.offset + ref.length))])

    # -- metadata ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Where the database lives."""
        return self.kvstore.url

    @property
    def config(self) -> Config:
        """The database configuration from the manifest."""
        return self._manifest.config

    @property
    def manifest(self) -> Manifest:
        """The decoded manifest as last read."""
        return self._manifest

    @property
    def generation(self) -> int:
        """The generation this store reads (0 for a database with no commit)."""
        return 0 if self._selected is None else self._selected.generation_number

    @property
    def read_only(self) -> bool:
        """Whether this store was opened without write access (``mode="r"`` or at a version)."""
        return self._writer is None

    def refresh(self) -> None:
        """Re-read the manifest (only meaningful when opened at the latest version)."""
        self._load()

    def at(self, version: Version) -> OcdbtStore:
        """A read-only view of another version, sharing this store's node cache."""
        return OcdbtStore(self.kvstore, version=version, view_of=self)

    def versions(self) -> list[VersionInfo]:
        """Every generation still reachable, oldest first."""
        return [VersionInfo._from(v) for v in all_versions(self._reader, self._manifest)]

    def info(self) -> dict[str, Any]:
        """Config, manifest kind and statistics of the selected version, as plain JSON data."""
        m = self._manifest
        sel = self._selected
        return {
            "url": self.url,
            "config": m.config.to_json(),
            "manifest_kind": "numbered" if m.config.manifest_kind == MANIFEST_KIND_NUMBERED else "single",
            "manifest_key": self._manifest_key,
            "generation": self.generation,
            "latest_generation": m.versions[-1].generation_number if m.versions else 0,
            "commit_time": None if sel is None else format_nanoseconds(sel.commit_time),
            "num_keys": 0 if sel is None else sel.statistics.num_keys,
            "num_tree_bytes": 0 if sel is None else sel.statistics.num_tree_bytes,
            "num_indirect_value_bytes": 0 if sel is None else sel.statistics.num_indirect_value_bytes,
            "root_height": 0 if sel is None else sel.root_height,
            "inline_versions": len(m.versions),
            "version_node_refs": len(m.version_nodes),
        }

    # -- reading ------------------------------------------------------------------------------
    def _root(self) -> tuple[IndirectDataReference | None, int]:
        sel = self._selected
        if sel is None:
            return (None, 0)
        return (sel.root, sel.root_height)

    def _resolve(self, v: bytes | IndirectDataReference | None, rng: ByteRange | None) -> bytes | None:
        if v is None:
            return None
        if isinstance(v, bytes):
            return slice_range(v, rng)
        if rng is None:
            return self._reader.read(v)
        start, stop = rng
        if start < 0:
            start = max(v.length + start, 0)
            stop = v.length
        stop = v.length if stop is None else min(stop, v.length)
        start = min(start, v.length)
        return self._reader.read_range(v, start, stop)

    def get(self, key: KeyLike, byte_range: ByteRange | None = None) -> bytes | None:
        """The value of ``key`` (or bytes ``byte_range`` of it), or ``None`` if absent."""
        check_range(byte_range)
        return self._resolve(lookup(self._reader, self._root(), to_key(key)), byte_range)

    def __getitem__(self, key: KeyLike) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, (bytes, bytearray, memoryview, str)):
            return False
        return lookup(self._reader, self._root(), to_key(key)) is not None

    def get_many(
        self, keys: Iterable[KeyLike | tuple[KeyLike, ByteRange | None]]
    ) -> list[bytes | None]:
        """Values of many keys (or ``(key, byte_range)`` pairs): one traversal, concurrent reads."""
        ks: list[bytes] = []
        rngs: list[ByteRange | None] = []
        for item in keys:
            if isinstance(item, tuple):
                k, r = item
                check_range(r)
                ks.append(to_key(k))
                rngs.append(r)
            else:
                ks.append(to_key(item))
                rngs.append(None)
        found = lookup_many(self._reader, self._root(), ks)
        out: list[bytes | None] = [None] * len(ks)
        whole: list[int] = []
        for i, v in enumerate(found):
            if v is None:
                continue
            if isinstance(v, bytes):
                out[i] = slice_range(v, rngs[i])
            elif rngs[i] is None:
                whole.append(i)
            else:
                out[i] = self._resolve(v, rngs[i])
        if whole:
            datas = self._reader.read_many([found[i] for i in whole])  # type: ignore[misc]
            for i, d in zip(whole, datas):
                out[i] = d
        return out

    def list(
        self, prefix: KeyLike = b"", start: KeyLike | None = None, stop: KeyLike | None = None
    ) -> Iterator[bytes]:
        """Keys starting with ``prefix`` within ``[start, stop)``, in byte order."""
        lo, hi = key_bounds(prefix, start, stop)
        return iterate_keys(self._reader, self._root(), lo, hi)

    def entries(
        self, prefix: KeyLike = b"", start: KeyLike | None = None, stop: KeyLike | None = None
    ) -> Iterator[Entry]:
        """Like :meth:`list`, with each value's size and location (no value is read)."""
        lo, hi = key_bounds(prefix, start, stop)
        for k, v in iterate(self._reader, self._root(), lo, hi):
            if isinstance(v, bytes):
                yield Entry(k, len(v), None, v)
            else:
                yield Entry(k, v.length, v)

    def items(
        self, prefix: KeyLike = b"", start: KeyLike | None = None, stop: KeyLike | None = None,
        *, batch: int = 256,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order; out-of-line values are fetched concurrently."""
        lo, hi = key_bounds(prefix, start, stop)
        pending: list[tuple[bytes, bytes | IndirectDataReference]] = []
        for kv in iterate(self._reader, self._root(), lo, hi):
            pending.append(kv)
            if len(pending) >= batch:
                yield from self._flush(pending)
                pending = []
        yield from self._flush(pending)

    def _flush(self, pending: Sequence[tuple[bytes, bytes | IndirectDataReference]]) -> Iterator[tuple[bytes, bytes]]:
        refs = [v for _, v in pending if isinstance(v, IndirectDataReference)]
        datas = iter(self._reader.read_many(refs)) if refs else iter(())
        for k, v in pending:
            yield k, v if isinstance(v, bytes) else next(datas)

    def __iter__(self) -> Iterator[bytes]:
        return self.list()

    def __len__(self) -> int:
        sel = self._selected
        return 0 if sel is None else sel.statistics.num_keys

    def as_kvstore(self) -> KvStore:
        """This database as a read-only :class:`KvStore` with ``str`` keys (for zarr3 etc.)."""
        return OcdbtKvStore(self)

    # -- writing ------------------------------------------------------------------------------
    def _require_writer(self) -> Writer:
        if self._writer is None:
            why = "at a fixed version" if self._version_spec is not None else "read-only (mode='r')"
            raise ReadOnlyError(f"{self.url} is opened {why}; open it with mode='a' to write")
        return self._writer

    def transaction(self) -> Transaction:
        """Start an atomic transaction (use it as a context manager); see :mod:`ocdbt_py.write`."""
        self._require_writer()
        return Transaction(self)

    def put(self, key: KeyLike, value: Any, *, if_equal: Any = _ANY) -> int:
        """Set ``key`` to ``value`` in one commit; returns the new generation.

        ``value`` is bytes-like or a binary file object (read to its end).  ``if_equal``
        makes the commit conditional on the current value (``None``: on the key being absent).
        """
        t = self.transaction()
        t.put(key, value, if_equal=if_equal)
        return t.commit()

    def __setitem__(self, key: KeyLike, value: Any) -> None:
        self.put(key, value)

    def delete(self, key: KeyLike, *, if_equal: Any = _ANY) -> int:
        """Delete ``key`` in one commit (an absent key still makes a generation)."""
        t = self.transaction()
        t.delete(key, if_equal=if_equal)
        return t.commit()

    def __delitem__(self, key: KeyLike) -> None:
        self.delete(key)

    def delete_range(self, start: KeyLike = b"", stop: KeyLike | None = None) -> int:
        """Delete every key in ``[start, stop)`` in one commit (``stop=None``: to the end)."""
        t = self.transaction()
        t.delete_range(start, stop)
        return t.commit()

    def commit(self, mutations: Any = None) -> int:
        """Commit pending changes; returns the latest generation.

        With no argument this only returns the current generation (every write method on the
        store commits by itself); a :class:`~ocdbt_py.write.transaction.Transaction` commits
        with ``t.commit()``.
        """
        writer = self._require_writer()
        if mutations is None:
            return self.generation
        try:
            result = writer.commit(mutations)
        except ConditionFailedError:
            self.refresh()  # show the version the condition was checked against
            raise
        self._set_manifest(result.manifest, result.manifest_key)
        return result.generation

    def snapshot(self) -> Snapshot:
        """The version this store reads (fixed: later commits do not change it)."""
        root, height = self._root()
        return Snapshot(root, height, self._reader)

    def close(self) -> None:
        """Release the node cache and the underlying store (a view from :meth:`at` releases
        nothing: it shares them with the store it came from)."""
        if not self._owns_resources:
            return
        self._cache.clear()
        self.kvstore.close()

    def __enter__(self) -> OcdbtStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<OcdbtStore {self.url} generation={self.generation}>"


class OcdbtKvStore(KvStore):
    """:class:`KvStore` view of an :class:`OcdbtStore` (keys as UTF-8 ``str``).

    Writable when the store is (each ``set``/``delete`` is then one commit; for many writes use
    a transaction's ``as_kvstore()``).
    """

    def __init__(self, db: OcdbtStore):
        self.db = db

    @property
    def read_only(self) -> bool:  # type: ignore[override]
        return self.db.read_only

    @property
    def is_remote(self) -> bool:
        """Values come from the database's own store: remote where it is."""
        return self.db.kvstore.is_remote

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        if self.db.read_only:
            raise ReadOnlyError(f"{self.url} is read-only")
        self.db.put(key.encode("utf-8", "surrogateescape"), value)

    def delete(self, key: str) -> None:
        if self.db.read_only:
            raise ReadOnlyError(f"{self.url} is read-only")
        self.db.delete(key.encode("utf-8", "surrogateescape"))

    @property
    def url(self) -> str:
        return f"{self.db.url}|ocdbt:@{self.db.generation}"

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self.db.get(key.encode("utf-8", "surrogateescape"), byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        return self.db.get_many([(k.encode("utf-8", "surrogateescape"), r) for k, r in reqs])

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        enc = lambda s: None if s is None else s.encode("utf-8", "surrogateescape")  # noqa: E731
        for k in self.db.list(prefix.encode("utf-8", "surrogateescape"), enc(start), enc(stop)):
            yield k.decode("utf-8", "surrogateescape")


def open(
    location: str | os.PathLike[str] | KvStore,
    *,
    version: Version | None = None,
    storage_options: dict[str, Any] | None = None,
    mode: str = "r",
    config: dict[str, Any] | None = None,
    cache_bytes: int = 64 << 20,
) -> OcdbtStore:
    """Open the OCDBT database at a local path, any fsspec URL, or a :class:`KvStore`.

    ``version`` selects a generation (int), or the latest commit at or before a time (ISO-8601
    string or ``datetime``).  Raises :class:`NotFoundError` when there is no database there.

    ``mode``: ``"r"`` read-only; ``"r+"`` read-write on an existing database; ``"a"``
    read-write, creating the database on the first commit if there is none (opening never
    creates files).  Writing needs a backend with atomic conditional writes (local
    directories, :class:`~ocdbt_py.kvstore.MemoryStore`).  ``config`` takes TensorStore's
    config names (``max_inline_value_bytes``, ``max_decoded_node_bytes``,
    ``version_tree_arity_log2``, ``compression``, ``manifest_kind``, ``uuid``): choices for a
    new database, constraints that must match an existing one.  It also takes the writer
    options ``target_data_file_size``, ``value_data_prefix``, ``btree_node_data_prefix``,
    ``version_tree_node_data_prefix`` and ``assume_config``.  See :mod:`ocdbt_py.write`.
    """
    if mode not in ("r", "r+", "a"):
        raise ValueError(f"mode must be 'r', 'r+' or 'a', not {mode!r}")
    if mode != "r":
        if version is not None:
            raise UnsupportedError("writing is not supported with version= specified")

        kv = open_kvstore(location, storage_options)
        writer = open_writer(kv, config, cache_bytes=cache_bytes)
        store = OcdbtStore(kv, cache_bytes=cache_bytes, writer=writer)
        writer.cache = store._cache  # nodes the writer creates are served to reads
        if mode == "r+" and store.generation == 0 and not store.manifest.versions:
            raise NotFoundError(f"no OCDBT database at {kv.url} (mode 'r+' does not create one)")
        return store
    if config is not None:
        raise UnsupportedError("config= applies when creating a database, which needs mode='a'")
    kv = open_kvstore(location, storage_options, read_only=True)
    try:
        return OcdbtStore(kv, version=version, cache_bytes=cache_bytes)
    except NotFoundError:
        raise
