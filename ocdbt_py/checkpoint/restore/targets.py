"""Restoring into a target tree: JAX arrays placed with given shardings, or typed NumPy leaves.

JAX is imported only here, and only when a target leaf is a JAX object.  For a sharded target
every addressable device's index domain is read directly from storage (only the chunks it
touches; identical domains are read once), so restoring onto a different mesh or topology
needs no gather or resharding step.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.pytree import Names, build_tree, dotted, flatten_with_names
from ocdbt_py.checkpoint.restore.item import ARRAY, EMPTY, INLINE, SCALAR, Leaf, PyTreeItem
from ocdbt_py.checkpoint.restore.reader import LazyArray
from ocdbt_py.errors import NotFoundError

__all__ = ["restore_with_target"]


def _is_jax_leaf(x: Any) -> bool:
    if "jax" not in sys.modules:
        return False
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    return isinstance(x, (jax.ShapeDtypeStruct, jax.Array))


def _target_leaf(x: Any) -> bool:
    return x is Ellipsis or _is_jax_leaf(x) or isinstance(x, (np.ndarray, np.generic, LazyArray))


def restore_with_target(item: PyTreeItem, target: Any, *, lazy: bool = False) -> Any:
    """Restore the leaves named by ``target`` (a subset of the stored tree is fine).

    Each target leaf decides the result type: ``jax.ShapeDtypeStruct`` (with a sharding) or
    ``jax.Array`` give a ``jax.Array`` with that sharding and dtype; an ``np.ndarray`` gives
    an ndarray of its dtype; a Python or NumPy scalar gives that scalar type; ``...`` skips
    the leaf; ``None`` where the checkpoint has a subtree gives that whole subtree as NumPy;
    anything else gives the stored value as is.
    """
    flat, rebuild = flatten_with_names(target, is_leaf=_target_leaf)
    by_names: dict[Names, Leaf] = {leaf.names: leaf for leaf in item.leaves}
    wanted: list[tuple[int, Leaf, Any]] = []
    values: list[Any] = [None] * len(flat)
    missing: list[str] = []
    subtrees: list[tuple[int, int, list[Leaf]]] = []
    for i, (names, t) in enumerate(flat):
        if t is Ellipsis:
            values[i] = Ellipsis
            continue
        leaf = by_names.get(names)
        if leaf is None:
            below = [lf for lf in item.leaves if lf.names[: len(names)] == names] if t is None else []
            if below:  # ``None`` at a subtree: that whole subtree, as NumPy
                subtrees.append((i, len(names), below))
                continue
            missing.append(dotted(names))
            continue
        wanted.append((i, leaf, t))
    if missing:
        raise NotFoundError(
            f"the checkpoint has no leaf named {', '.join(repr(m) for m in missing[:5])}"
            + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        )
    for i, depth, below in subtrees:
        got = item.read_values(below, lazy=lazy)
        values[i] = build_tree([(lf.keys[depth:], v) for lf, v in zip(below, got)])
    jax_leaves = [(i, leaf, t) for i, leaf, t in wanted if _is_jax_leaf(t)]
    plain = [(i, leaf, t) for i, leaf, t in wanted if not _is_jax_leaf(t)]
    if plain:
        got = item.read_values([leaf for _, leaf, _ in plain], lazy=lazy)
        for (i, leaf, t), v in zip(plain, got):
            values[i] = _convert_plain(leaf, v, t)
    if jax_leaves:
        # optional: that module imports JAX
        from ocdbt_py.checkpoint.restore.jax_restore import restore_jax_leaves

        got = restore_jax_leaves(item, [(leaf, t) for _, leaf, t in jax_leaves])
        for (i, _, _), v in zip(jax_leaves, got):
            values[i] = v
    return rebuild(values)


def _convert_plain(leaf: Leaf, value: Any, t: Any) -> Any:
    """A stored value converted to the type of a non-JAX target leaf (an empty container of the
    target stands for an empty stored value)."""
    if isinstance(t, (np.ndarray, LazyArray)) and leaf.kind in (ARRAY, SCALAR, INLINE):
        dtype = np.dtype(t.dtype)
        if isinstance(value, LazyArray):
            _check_shape(leaf, value.shape, t.shape)
            return value if value.dtype == dtype else LazyArray(value._reader, value.param, cast=dtype)
        arr = np.asarray(value)
        _check_shape(leaf, arr.shape, t.shape)
        return arr.astype(dtype, copy=False)
    if isinstance(t, np.generic) and leaf.kind in (ARRAY, SCALAR, INLINE):
        return t.dtype.type(np.asarray(value).item())
    if isinstance(t, (bool, int, float, complex)) and leaf.kind in (ARRAY, SCALAR, INLINE):
        return type(t)(np.asarray(value).item())
    if leaf.kind == EMPTY and isinstance(t, (dict, list, tuple)) and not t:
        return t  # the target's own empty container (an optax ``EmptyState`` stays one), as Orbax
    return value  # strings, empty values, and anything else: as stored


def _check_shape(leaf: Leaf, stored: Sequence[int], wanted: Sequence[int]) -> None:
    if tuple(stored) != tuple(wanted):
        raise ValueError(
            f"leaf {leaf.param_name!r} is stored with shape {tuple(stored)} but the target asks for "
            f"{tuple(wanted)}"
        )
