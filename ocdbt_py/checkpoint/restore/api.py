"""``restore()``: any Orbax checkpoint directory to NumPy (or, with a target, JAX) trees."""

from __future__ import annotations

import os
from typing import Any

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import (
    Kind,
    Listing,
    classify,
    is_v1_checkpoint,
    json_item_file,
    list_items,
    listing_of,
    select_step,
    step_metadata,
    store_dir_name,
)
from ocdbt_py.checkpoint.restore.gcpause import paused_gc
from ocdbt_py.checkpoint.restore.item import ARRAY, SCALAR, PyTreeItem
from ocdbt_py.checkpoint.restore.targets import restore_with_target
from ocdbt_py.errors import CorruptionError, NotFoundError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = ["restore", "open_item_dir", "resolve", "Resolved", "bare_array_leaf", "handler_of"]

PathLike = str | os.PathLike[str] | KvStore

_ARRAY_HANDLER = "ArrayCheckpointHandler"


class Resolved:
    """A checkpoint location after following a manager root to one step.

    ``kind`` is :class:`Kind`; ``kv`` is rooted at the item or step directory; ``step`` is the
    step number when a manager root was resolved.
    """

    def __init__(self, kv: KvStore, kind: Kind, listing: Listing, step: int | None = None):
        self.kv = kv
        self.kind = kind
        self.listing = listing
        self.step = step
        #: each item's listing, once :meth:`items` has listed them
        self.item_listings: dict[str, Listing] = {}
        self._meta: dict[str, Any] | None = None

    def step_metadata(self) -> dict[str, Any]:
        """The parsed ``_CHECKPOINT_METADATA`` of the directory (``{}`` if absent; read once)."""
        if self._meta is None:
            self._meta = step_metadata(self.kv) or {}
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
        if list(items) == ["state"] and is_v1_checkpoint(self.kv):
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
    lst = listing_of(kv)
    kind = classify(kv, listing=lst)
    if kind != Kind.ROOT:
        if step is not None:
            raise ValueError(f"step={step} applies to a CheckpointManager root; {kv.url} is a {kind.value} directory")
        return Resolved(kv, kind, lst)
    entry = select_step(kv, step, listing=lst)
    skv = PrefixStore(kv, entry.name)
    slst = listing_of(skv)
    skind = classify(skv, listing=slst)
    return Resolved(skv, skind, slst, entry.step)


def open_item_dir(kv: KvStore, listing: Listing | None = None) -> PyTreeItem:
    """Open a PyTree item directory."""
    return PyTreeItem(kv, listing=listing)


def handler_of(kv: KvStore) -> str | None:
    """The handler named by an item directory's own ``_CHECKPOINT_METADATA`` (bare saves)."""
    meta = step_metadata(kv) or {}
    h = meta.get("item_handlers")
    return h if isinstance(h, str) else None


def _restore_item(kv: KvStore, kind: Kind, target: Any, lazy: bool, handler: str | None,
                  listing: Listing | None = None) -> Any:
    if kind == Kind.JSON:
        lst = listing or Listing.of(kv)
        fname = json_item_file(lst, store_dir_name(kv))
        assert fname is not None
        return read_json(kv, fname)
    if kind == Kind.JSON_DIR:
        lst = listing or Listing.of(kv)
        return {f: read_json(kv, f) for f in lst.files if f.endswith(".json")}
    if kind != Kind.PYTREE:
        raise NotFoundError(f"{kv.url} is not an item directory")
    with paused_gc():
        # a restore of everything starts on the data files as soon as the listing names them
        item = PyTreeItem(kv, listing=listing, prefetch=target is None and not lazy)
    try:
        bare = bare_array_leaf(item, handler)
        if bare is not None and target is not None:
            target = {"checkpoint": target}
        if target is None:
            tree = item.restore(lazy=lazy)
        else:
            tree = restore_with_target(item, target, lazy=lazy)
        if bare is not None and isinstance(tree, dict):
            return tree["checkpoint"]
        return tree
    finally:
        if not lazy:
            item.close()


def bare_array_leaf(item: PyTreeItem, handler: str | None) -> str | None:
    """``ArrayCheckpointHandler`` saves one array under the name ``checkpoint``; restore it bare."""
    if len(item.leaves) != 1:
        return None
    leaf = item.leaves[0]
    if leaf.names != ("checkpoint",) or leaf.kind not in (ARRAY, SCALAR):
        return None
    if handler is not None:
        return "checkpoint" if handler.endswith(_ARRAY_HANDLER) else None
    return "checkpoint" if "checkpoint" in item.listing.dirs else None


def restore(
    path: PathLike,
    target: Any = None,
    *,
    item: str | None = None,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
    lazy: bool = False,
) -> Any:
    """Restore an Orbax checkpoint as NumPy arrays, or as JAX arrays when ``target`` asks.

    ``path`` is a local path, any fsspec URL (``gs://``, ``s3://``, ``memory://``, ...) or a
    :class:`~ocdbt_py.kvstore.KvStore`, pointing at

    * an **item** directory: returns the tree as Orbax's own restore does (dicts and lists;
      ``jax.Array`` and ``np.ndarray`` leaves as ``np.ndarray``, bfloat16/float8/int4 as
      ml_dtypes arrays; scalars as Python scalars; strings; ``None`` and empty containers);
    * a **step** directory: returns ``{item_name: tree}`` (JSON items parsed), or the one item
      of a single-item CheckpointManager (``default``) / v1 ``save_pytree`` (``state``);
      ``item=`` picks one item;
    * a **CheckpointManager root**: the latest finalized step, or ``step=``.

    ``target`` restores only the leaves it names (a subtree is fine): ``jax.ShapeDtypeStruct``
    leaves with a sharding (or ``jax.Array`` leaves) give ``jax.Array``s placed with that
    sharding, each device reading only its own region of storage; NumPy leaves give arrays of
    their dtype; ``...`` skips a leaf; ``None`` in place of a stored subtree restores that
    subtree as NumPy (``restore(path, {"params": None})``).  ``lazy=True`` returns :class:`LazyArray` leaves that
    read on ``np.asarray`` or slicing.

    Small arrays restored from local files (under 4 MiB, stored as one chunk) are writeable
    views of shared 2 MiB slabs (their ``base``), so that thousands of them decode a run at a
    time; an array kept after the others are dropped keeps its slab alive.
    """
    r = resolve(path, step=step, storage_options=storage_options)
    if r.kind == Kind.STEP:
        items = r.items()
        handlers = r.handlers()
        name = r.item_to_unwrap(items, item)
        if name is not None:
            return _restore_item(PrefixStore(r.kv, name), items[name], target, lazy, handlers.get(name),
                                 r.item_listings.get(name))
        if not items:
            raise CorruptionError(f"{r.kv.url} is a step directory without any readable item")
        if target is not None:
            if not isinstance(target, dict) or not set(target) <= set(items):
                raise ValueError(
                    f"for a step directory, target must be a dict keyed by item name ({sorted(items)})"
                )
            return {
                name: _restore_item(PrefixStore(r.kv, name), items[name], sub, lazy, handlers.get(name),
                                    r.item_listings.get(name))
                for name, sub in target.items()
            }
        return {
            name: _restore_item(PrefixStore(r.kv, name), kind, None, lazy, handlers.get(name),
                                r.item_listings.get(name))
            for name, kind in items.items()
        }
    if item is not None:
        raise ValueError(f"item={item!r} applies to a step directory; {r.kv.url} is an item directory")
    return _restore_item(r.kv, r.kind, target, lazy, handler_of(r.kv), r.listing)
