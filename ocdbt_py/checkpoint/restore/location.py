"""Where a restore reads from, settled once at its start: :func:`locate` turns the path it was
given into a :class:`Location` (what the directory is, the step a manager root led to, and
each item to read with its kind, store, listing and handler) that the rest of the restore
consumes without going back to the path.

:func:`resolve` is the first half (open, classify, follow a manager root to one step), used
on its own by the tools that look at a checkpoint without restoring it (metadata, inspect).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ocdbt_py.checkpoint.layout import (
    STEP_METADATA,
    V1_INDICATOR,
    Kind,
    Listing,
    classify,
    json_item_file,
    list_items,
    select_step,
    step_metadata,
    store_dir_name,
)
from ocdbt_py.errors import NotFoundError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = ["PathLike", "Resolved", "resolve", "ItemLocation", "Location", "locate"]

PathLike = str | os.PathLike[str] | KvStore


@dataclasses.dataclass
class Resolved:
    """A checkpoint location after following a manager root to one step.

    ``kind`` is :class:`Kind`; ``kv`` is rooted at the item or step directory; ``step`` is the
    step number when a manager root was resolved.
    """

    kv: KvStore
    kind: Kind
    listing: Listing
    step: int | None = None
    #: each item's listing, once :meth:`items` has listed them
    item_listings: dict[str, Listing] = dataclasses.field(default_factory=dict)
    _meta: dict[str, Any] | None = dataclasses.field(default=None, repr=False)

    def step_metadata(self) -> dict[str, Any]:
        """The parsed ``_CHECKPOINT_METADATA`` of the directory (``{}`` if its listing has
        none; read once)."""
        if self._meta is None:
            self._meta = (step_metadata(self.kv) if STEP_METADATA in self.listing.files else None) or {}
        return self._meta

    def items(self) -> dict[str, Kind]:
        """The items of a step directory (``{}`` for an item directory)."""
        if self.kind != Kind.STEP:
            return {}
        return list_items(self.kv, listing=self.listing, listings=self.item_listings,
                          metadata=self.step_metadata())

    def handlers(self) -> dict[str, str]:
        """The item handler names recorded in the step's ``_CHECKPOINT_METADATA``."""
        h = self.step_metadata().get("item_handlers")
        return {k: v for k, v in h.items() if isinstance(v, str)} if isinstance(h, dict) else {}

    def single_item(self, items: dict[str, Kind]) -> str | None:
        """The item to return unwrapped: ``default`` of a single-item CheckpointManager, or the
        ``state`` of a v1 ``save_pytree`` checkpoint (as Orbax's own restore does)."""
        names = [n for n in items if n != "metrics"]
        if names == ["default"]:
            return "default"
        if list(items) == ["state"] and V1_INDICATOR in self.listing.files:
            return "state"
        return None

    def item_to_unwrap(self, items: dict[str, Kind], item: str | None) -> str | None:
        """The one item to return on its own: ``item`` if given (it must exist), else
        :meth:`single_item`; ``None`` means every item, as a dict by name."""
        if item is not None:
            if item not in items:
                raise NotFoundError(f"{self.kv.url} has no item {item!r} (items: {sorted(items)})")
            return item
        return self.single_item(items)


def resolve(path: PathLike, *, step: int | None = None, storage_options: dict[str, Any] | None = None) -> Resolved:
    """Open ``path`` and follow a manager root to ``step`` (default: the latest finalized)."""
    kv = open_kvstore(path, storage_options, read_only=True)
    # the first small files are fetched while the directory is listed (one round trip)
    lst = Listing.of(kv, read_ahead=True)
    kind = classify(kv, listing=lst)
    if kind != Kind.ROOT:
        if step is not None:
            raise ValueError(f"step={step} applies to a CheckpointManager root; {kv.url} is a {kind.value} directory")
        return Resolved(kv, kind, lst)
    entry = select_step(kv, step, listing=lst)
    skv = PrefixStore(kv, entry.name)
    slst = Listing.of(skv, read_ahead=True)
    skind = classify(skv, listing=slst)
    return Resolved(skv, skind, slst, entry.step)


@dataclasses.dataclass(frozen=True)
class ItemLocation:
    """One item to read: its ``name`` in the step (``None`` for an item directory given
    directly), what it holds, a ``store`` rooted at it, its ``listing``, the ``handler`` its
    step recorded for it, and for a JSON item the file holding the document."""

    name: str | None
    kind: Kind
    store: KvStore
    listing: Listing
    handler: str | None
    #: for a JSON item, the file holding its document (``None`` for other kinds)
    json_file: str | None = None


@dataclasses.dataclass(frozen=True)
class Location:
    """A restore's path, settled: the directory's ``kind`` (a step or an item kind), the
    ``step`` a manager root led to, the ``items`` to read by name (``""`` for an item
    directory) and ``unwrap``, the one item returned on its own (``None``: every item, as a
    dict by name)."""

    url: str
    kind: Kind
    step: int | None
    items: dict[str, ItemLocation]
    unwrap: str | None


def locate(path: PathLike, *, step: int | None = None, item: str | None = None,
           storage_options: dict[str, Any] | None = None) -> Location:
    """Settle where a restore of ``path`` reads from (see :class:`Location`): every listing,
    classification and metadata file the choice of items needs is read here, once.  A step
    without any readable item gives no items (the caller says whether that is an error)."""
    r = resolve(path, step=step, storage_options=storage_options)
    if r.kind != Kind.STEP:
        if item is not None:
            raise ValueError(f"item={item!r} applies to a step directory; {r.kv.url} is an item directory")
        h = r.step_metadata().get("item_handlers")
        doc = json_item_file(r.listing, store_dir_name(r.kv)) if r.kind == Kind.JSON else None
        only = ItemLocation(None, r.kind, r.kv, r.listing, h if isinstance(h, str) else None, doc)
        return Location(r.kv.url, r.kind, r.step, {"": only}, "")
    kinds = r.items()
    handlers = r.handlers()
    unwrap = r.item_to_unwrap(kinds, item)
    names = [unwrap] if unwrap is not None else list(kinds)
    items = {}
    for name in names:
        # the item's store, built here once; its listing was made when the items were listed
        store = PrefixStore(r.kv, name)
        lst = r.item_listings.get(name) or Listing.of(store)
        doc = json_item_file(lst, name) if kinds[name] == Kind.JSON else None
        items[name] = ItemLocation(name, kinds[name], store, lst, handlers.get(name), doc)
    return Location(r.kv.url, Kind.STEP, r.step, items, unwrap)
