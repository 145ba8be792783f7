"""Where a PyTree item's arrays live, presented as one key space ``<param>/<zarr key>``.

Three layouts (``spec/orbax.md`` section 4):

* an OCDBT database at the item root (the merged root Orbax writes at finalize, or the single
  database of older writers); its values may point into ``ocdbt.process_<i>/d/`` files;
* per-process OCDBT databases ``ocdbt.process_<i>/`` without a root manifest; their key
  spaces are disjoint except for the Zarr metadata, which process 0 writes, so they are
  read as a union;
* one plain directory per parameter (``use_ocdbt=False``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any

from ocdbt_py.errors import CorruptionError, NotFoundError
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, normalize_request
from ocdbt_py.kvstore.prefixed import PrefixStore
from ocdbt_py.store import OcdbtStore

__all__ = ["ArrayStore", "UnionStore", "open_array_store"]


class UnionStore(KvStore):
    """Read-only union of several stores: a key is looked up in each store in turn."""

    read_only = True

    def __init__(self, stores: Sequence[KvStore]):
        self.stores = list(stores)

    @property
    def url(self) -> str:
        return "union(" + ", ".join(s.url for s in self.stores) + ")"

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        for s in self.stores:
            v = s.get(key, byte_range)
            if v is not None:
                return v
        return None

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        out: list[bytes | None] = [None] * len(reqs)
        todo = list(range(len(reqs)))
        for s in self.stores:
            if not todo:
                break
            got = s.get_many([reqs[i] for i in todo])
            missing = []
            for i, v in zip(todo, got):
                if v is None:
                    missing.append(i)
                else:
                    out[i] = v
            todo = missing
        return out

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        last = None
        merged = heapq.merge(*(s.list(prefix, start=start, stop=stop) for s in self.stores),
                             key=lambda k: k.encode("utf-8", "surrogateescape"))
        for k in merged:
            if k != last:
                yield k
                last = k

    def close(self) -> None:
        """Nothing to release: the member stores belong to the caller."""


class ArrayStore:
    """The array data of one PyTree item.

    ``kv`` holds keys ``<param>/<zarr key>``; ``layout`` is ``"ocdbt"``,
    ``"ocdbt-per-process"`` or ``"dirs"``; ``databases`` are the open OCDBT databases (used
    for stored sizes without reading values).
    """

    def __init__(self, kv: KvStore, layout: str, databases: Sequence[Any] = (), *,
                 item_kv: KvStore | None = None, db_prefixes: Sequence[str] = ()):
        self.kv = kv
        self.layout = layout
        self.databases = list(databases)
        #: the item directory's store, and where each database lives below it ("" = the item)
        self.item_kv = item_kv
        self.db_prefixes = list(db_prefixes)

    def value_sizes(self, prefix: str = "") -> dict[str, int] | None:
        """``{key: stored length}`` for every key under ``prefix`` without reading values.

        Available for OCDBT layouts (the B-tree leaves record each value's length); for
        directories it returns ``None`` (sizes need one request per file).
        """
        if not self.databases:
            return None
        out: dict[str, int] = {}
        pb = prefix.encode("utf-8", "surrogateescape")
        for db in self.databases:
            for e in db.entries(pb):
                out.setdefault(e.key.decode("utf-8", "surrogateescape"), e.size)
        return out

    def close(self) -> None:
        """Drop the databases (their node caches).  The underlying store belongs to the caller
        and stays open."""
        self.databases = []


def open_array_store(item_kv: KvStore, *, files: Sequence[str], dirs: Sequence[str],
                     use_ocdbt: bool | None) -> ArrayStore:
    """Open the array data of the item whose top-level listing is ``files``/``dirs``."""
    # where the OCDBT databases are below the item ("": the item itself); process 0 first,
    # as it holds the Zarr metadata
    where = [""] if "manifest.ocdbt" in files else sorted(d for d in dirs if d.startswith("ocdbt.process_"))
    if not where:
        if use_ocdbt:
            raise CorruptionError("_METADATA says use_ocdbt but there is no manifest.ocdbt", path=item_kv.url)
        return ArrayStore(item_kv, "dirs", item_kv=item_kv)
    dbs = []
    prefixes = []
    for d in where:
        try:
            db = OcdbtStore(PrefixStore(item_kv, d) if d else item_kv)
        except NotFoundError:
            if not d:
                raise
            continue  # an empty process dir (nothing written) is harmless
        db.read_ahead_root()  # on object stores: the root node is on its way while the caller goes on
        dbs.append(db)
        prefixes.append(d)
    if not dbs:
        raise CorruptionError("the item's ocdbt.process_* directories hold no database", path=item_kv.url)
    if where == [""]:
        return ArrayStore(dbs[0].as_kvstore(), "ocdbt", dbs, item_kv=item_kv, db_prefixes=prefixes)
    union = UnionStore([db.as_kvstore() for db in dbs])
    return ArrayStore(union, "ocdbt-per-process", dbs, item_kv=item_kv, db_prefixes=prefixes)
