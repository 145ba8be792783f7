"""``restore()``: any Orbax checkpoint directory to NumPy (or, with a target, JAX) trees."""

from __future__ import annotations

from typing import Any

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import Kind, Listing
from ocdbt_py.checkpoint.restore.gcpause import paused_gc
from ocdbt_py.checkpoint.restore.item import ARRAY, SCALAR, PyTreeItem
from ocdbt_py.checkpoint.restore.location import ItemLocation, PathLike, Resolved, locate, resolve
from ocdbt_py.checkpoint.restore.targets import restore_with_target
from ocdbt_py.errors import CorruptionError, NotFoundError
from ocdbt_py.kvstore.base import KvStore

__all__ = ["restore", "open_item_dir", "resolve", "Resolved", "PathLike", "bare_array_leaf", "read_item"]

_ARRAY_HANDLER = "ArrayCheckpointHandler"


def open_item_dir(kv: KvStore, listing: Listing | None = None) -> PyTreeItem:
    """Open a PyTree item directory."""
    return PyTreeItem(kv, listing=listing)


def read_item(loc: ItemLocation, target: Any = None, *, lazy: bool = False) -> Any:
    """The tree of the item at ``loc`` (JSON items parsed; see :func:`restore` for ``target``
    and ``lazy``)."""
    if loc.kind == Kind.JSON:
        assert loc.json_file is not None
        return read_json(loc.store, loc.json_file)
    if loc.kind == Kind.JSON_DIR:
        return {f: read_json(loc.store, f) for f in loc.listing.files if f.endswith(".json")}
    if loc.kind != Kind.PYTREE:
        raise NotFoundError(f"{loc.store.url} is not an item directory")
    with paused_gc():
        # a restore of everything starts on the data files as soon as the listing names them
        item = PyTreeItem(loc.store, listing=loc.listing, prefetch=target is None and not lazy)
    try:
        bare = bare_array_leaf(item, loc.handler)
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
    loc = locate(path, step=step, item=item, storage_options=storage_options)
    if loc.unwrap is not None:
        return read_item(loc.items[loc.unwrap], target, lazy=lazy)
    if not loc.items:
        raise CorruptionError(f"{loc.url} is a step directory without any readable item")
    if target is None:
        return {name: read_item(il, lazy=lazy) for name, il in loc.items.items()}
    if not isinstance(target, dict) or not set(target) <= set(loc.items):
        raise ValueError(f"for a step directory, target must be a dict keyed by item name ({sorted(loc.items)})")
    return {name: read_item(loc.items[name], sub, lazy=lazy) for name, sub in target.items()}
