"""``TreeMetadata``: what Orbax's PyTree handlers' ``metadata()`` returns.

The stored tree (dicts and lists as saved, one ``ocp.metadata.value`` object per leaf, empty
nodes as themselves) plus ``custom_metadata`` and ``use_zarr3``.  It reads like the tree
(``m["params"]``, ``in``, ``len``, ``keys``/``values``/``items``, iteration) and, once JAX is
loaded, is a JAX pytree whose children are the tree's top-level entries, so
``jax.tree.map(f, m)`` maps the leaves and returns a ``TreeMetadata`` again, as Orbax's does.
:func:`from_leaf_metadata` builds it from the native :class:`~ocdbt_py.checkpoint.LeafMetadata`
tree.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

from ocdbt_py.checkpoint.layout import Kind
from ocdbt_py.checkpoint.meta import LeafMetadata, item_metadata
from ocdbt_py.checkpoint.restore.api import bare_array_leaf
from ocdbt_py.checkpoint.restore.item import ARRAY, SCALAR, STRING, PyTreeItem
from ocdbt_py.checkpoint.restore.location import ItemLocation, locate
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.orbax.metadata_sharding import from_description
from ocdbt_py.orbax.metadata_value import ArrayMetadata, ScalarMetadata, StorageMetadata, StringMetadata

__all__ = ["TreeMetadata", "build_default_tree_metadata", "from_leaf_metadata", "orbax_leaf", "read_tree_metadata",
           "item_tree_metadata"]


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


class TreeMetadata:
    """A checkpoint's tree of leaf metadata, with ``custom_metadata`` and ``use_zarr3``."""

    def __init__(self, *, tree: Any, custom_metadata: Any = None, use_zarr3: bool = False):
        if tree is None or (not isinstance(tree, (dict, list, tuple)) and _is_container(tree)):
            raise ValueError(f"Unsupported tree type: {type(tree)}")
        self._tree = tree
        self._custom_metadata = custom_metadata
        self._use_zarr3 = use_zarr3
        register_pytree()

    @classmethod
    def build(cls, tree: Any, *, custom_metadata: Any = None, use_zarr3: bool = False) -> TreeMetadata:
        """A ``TreeMetadata`` of ``tree``."""
        return cls(tree=tree, custom_metadata=custom_metadata, use_zarr3=use_zarr3)

    @property
    def tree(self) -> Any:
        """The stored tree (``jax.tree.map`` over it together with a target of that shape)."""
        return self._tree

    @property
    def custom_metadata(self) -> Any:
        """The ``custom_metadata`` given at save (``None`` when none was)."""
        return self._custom_metadata

    @property
    def use_zarr3(self) -> bool:
        """Whether the arrays are Zarr v3."""
        return self._use_zarr3

    def __getitem__(self, key: Any) -> Any:
        return self._tree[key]

    def __contains__(self, key: Any) -> bool:
        return key in self._tree

    def __len__(self) -> int:
        return len(self._tree)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._tree)

    def get(self, key: Any, default: Any = None) -> Any:
        """``self[key]``, or ``default`` when there is no such key or index."""
        try:
            return self._tree[key]
        except (KeyError, IndexError, TypeError):
            return default

    def keys(self) -> Any:
        """The top-level keys (dict trees)."""
        return self._tree.keys()

    def values(self) -> Any:
        """The top-level values (dict trees)."""
        return self._tree.values()

    def items(self) -> Any:
        """The top-level ``(key, value)`` pairs (dict trees)."""
        return self._tree.items()

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TreeMetadata) and self._tree == other._tree
                and self._custom_metadata == other._custom_metadata and self._use_zarr3 == other._use_zarr3)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"TreeMetadata(\n  custom_metadata={self._custom_metadata}\n  tree={self._tree}\n"
                f"  use_zarr3={self._use_zarr3}\n)")

    # -- JAX pytree protocol (registered once JAX is loaded) --------------------------------------

    def tree_flatten_with_keys(self) -> tuple[list[tuple[Any, Any]], dict[str, Any]]:
        """The top-level entries with their JAX keys, and what rebuilds the object."""
        import jax  # only called by JAX's tree functions

        t = self._tree
        if isinstance(t, dict):
            keys: list[Any] = [jax.tree_util.DictKey(k) for k in t]
            values: list[Any] = list(t.values())
        elif _is_namedtuple(t):
            keys = [jax.tree_util.DictKey(k) for k in t._fields]
            values = [getattr(t, k) for k in t._fields]
        elif isinstance(t, (list, tuple)):
            keys = [jax.tree_util.SequenceKey(i) for i in range(len(t))]
            values = list(t)
        else:  # a bare leaf
            keys = [jax.tree_util.GetAttrKey("tree")]
            values = [t]
        aux = {"tree_type": type(t), "tree_keys": keys, "custom_metadata": self._custom_metadata,
               "use_zarr3": self._use_zarr3}
        return list(zip(keys, values)), aux

    def tree_flatten(self) -> tuple[list[Any], dict[str, Any]]:
        """The top-level entries and what rebuilds the object."""
        pairs, aux = self.tree_flatten_with_keys()
        return [v for _, v in pairs], aux

    @classmethod
    def tree_unflatten(cls, aux: dict[str, Any], children: Any) -> TreeMetadata:
        """Rebuild from :meth:`tree_flatten`'s output."""
        tree_type = aux["tree_type"]
        children = list(children)
        names = [_key_name(k) for k in aux["tree_keys"]]
        if issubclass(tree_type, dict):
            tree: Any = tree_type(zip(names, children)) if tree_type is not dict else dict(zip(names, children))
        elif issubclass(tree_type, tuple) and hasattr(tree_type, "_fields"):
            tree = tree_type(**dict(zip(names, children)))
        elif issubclass(tree_type, (list, tuple)):
            tree = tree_type(children)
        else:
            tree = children[0]
        return cls(tree=tree, custom_metadata=aux["custom_metadata"], use_zarr3=aux["use_zarr3"])


def _key_name(k: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return k


def _is_container(x: Any) -> bool:
    """Whether ``x`` is a JAX container node (not a leaf), when JAX is loaded."""
    if "jax" not in sys.modules:
        return False
    import jax  # loaded already (checked above)

    return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))


_registered = False


def register_pytree() -> None:
    """Make :class:`TreeMetadata` a JAX pytree (once, when JAX is loaded)."""
    global _registered
    if _registered or "jax" not in sys.modules:
        return
    import jax  # loaded already (checked above)

    jax.tree_util.register_pytree_with_keys_class(TreeMetadata)
    _registered = True


register_pytree()


def build_default_tree_metadata(tree: Any, *, custom_metadata: Any = None, use_zarr3: bool = False) -> TreeMetadata:
    """A :class:`TreeMetadata` of ``tree``."""
    return TreeMetadata.build(tree, custom_metadata=custom_metadata, use_zarr3=use_zarr3)


def orbax_leaf(leaf: Any, directory: Any) -> Any:
    """The ``ocp.metadata.value`` object of one native leaf (empty nodes as themselves)."""
    if not isinstance(leaf, LeafMetadata):
        return leaf
    if leaf.kind == SCALAR:
        return ScalarMetadata(name=leaf.name, directory=directory, dtype=leaf.dtype)
    if leaf.kind == ARRAY:
        return ArrayMetadata(name=leaf.name, directory=directory, shape=tuple(leaf.shape or ()),
                             sharding=from_description(leaf.sharding), dtype=leaf.dtype,
                             storage=StorageMetadata(chunk_shape=leaf.chunks, write_shape=leaf.write_shape))
    if leaf.kind == STRING:
        return StringMetadata(name=leaf.name, directory=directory)
    return leaf.value  # None, {} and [] (and values of legacy msgpack files) stand as themselves


def _map(tree: Any, fn: Any) -> Any:
    if isinstance(tree, LeafMetadata):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _map(v, fn) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_map(v, fn) for v in tree]
    return tree


def from_leaf_metadata(tree: Any, directory: Any, *, custom_metadata: Any = None,
                       use_zarr3: bool = False) -> TreeMetadata:
    """The :class:`TreeMetadata` of a native metadata tree read from ``directory``."""
    return TreeMetadata(tree=_map(tree, lambda leaf: orbax_leaf(leaf, directory)), custom_metadata=custom_metadata,
                        use_zarr3=use_zarr3)


def _directory(store: KvStore) -> Any:
    """What Orbax's metadata names as a leaf's ``directory``: a ``pathlib.Path`` on local
    disks, the URL elsewhere."""
    local = store.local_path("")
    return pathlib.Path(local) if local is not None else store.url.rstrip("/")


def item_tree_metadata(loc: ItemLocation) -> TreeMetadata | None:
    """The :class:`TreeMetadata` of one located item (``None`` for JSON items, whose
    handler keeps no metadata, as Orbax's)."""
    if loc.kind in (Kind.JSON, Kind.JSON_DIR):
        return None
    item = PyTreeItem(loc.store, listing=loc.listing)
    try:
        tree = item_metadata(item, stored_sizes=False)
        if bare_array_leaf(item, loc.handler) is not None and isinstance(tree, dict):
            tree = tree["checkpoint"]
        custom, zarr3 = item.custom_metadata, item.use_zarr3
    finally:
        item.close()
    if tree is None:  # nothing stored: an empty tree
        tree = {}
    return from_leaf_metadata(tree, _directory(loc.store), custom_metadata=custom, use_zarr3=zarr3)


def read_tree_metadata(location: str | os.PathLike[str] | KvStore, item: str | None = None) -> TreeMetadata | None:
    """The :class:`TreeMetadata` of the PyTree item at ``location`` (or of its item ``item``),
    reading no array data."""
    loc = locate(location, item=item)
    if loc.unwrap is None:
        raise ValueError(f"{loc.url} holds several items ({sorted(loc.items)}); name one")
    return item_tree_metadata(loc.items[loc.unwrap])
