"""Nested trees from key paths, and key paths from user trees, without JAX.

A stored leaf is named by a key path of ``(name, key_type)`` pairs (``key_type`` 1: sequence
index, 2: dict key or attribute).  :func:`build_tree` turns ``(key path, value)`` pairs back
into nested dicts and lists the way Orbax does when it restores without a target: tuples and
NamedTuples come back as lists and dicts, dict keys as strings.  :func:`flatten_with_names`
goes the other way for a user-supplied target tree (dicts, lists, tuples, NamedTuples, and any
JAX pytree when JAX is already imported).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ocdbt_py.checkpoint.treemeta import KEY_SEQUENCE
from ocdbt_py.errors import CorruptionError

__all__ = ["build_tree", "flatten_with_names", "Names", "dotted"]

#: A key path as strings (sequence indices as decimal strings), as Orbax names leaves.
Names = tuple[str, ...]


def build_tree(items: Iterable[tuple[Sequence[tuple[str, int]], Any]]) -> Any:
    """Nest ``(key path, value)`` pairs into dicts (dict keys) and lists (sequence keys).

    Dict keys keep the order of first appearance; list elements are ordered by index, and a
    gap (an index never given) becomes ``None``.  A single pair with an empty key path is a
    bare leaf and is returned as is.  Contradictory paths raise :class:`CorruptionError`.
    """
    # Every container is built as a dict; ``kinds`` maps the id of each container we made to
    # whether it is a sequence (leaf values may be dicts themselves, so identity decides).
    root: dict[str, Any] | None = None
    kinds: dict[int, bool] = {}
    seqs: list[tuple[dict[str, Any], dict[str, Any] | None, str | None]] = []  # (node, parent, key)
    bare: list[Any] = []
    for keys, value in items:
        if not keys:
            bare.append(value)
            continue
        if root is None:
            root = {}
            first_seq = keys[0][1] == KEY_SEQUENCE
            kinds[id(root)] = first_seq
            if first_seq:
                seqs.append((root, None, None))
        node = root
        last = len(keys) - 1
        for depth, (name, kt) in enumerate(keys):
            if kinds[id(node)] != (kt == KEY_SEQUENCE):
                where = dotted(k for k, _ in keys[: depth + 1])
                raise CorruptionError(f"tree metadata mixes list and dict keys at {where!r}")
            child = node.get(name, _MISSING)
            if depth == last:
                if child is not _MISSING:
                    raise CorruptionError(f"tree metadata names {dotted(k for k, _ in keys)!r} twice")
                node[name] = value
            else:
                if child is _MISSING:
                    child = {}
                    is_seq = keys[depth + 1][1] == KEY_SEQUENCE
                    kinds[id(child)] = is_seq
                    if is_seq:
                        seqs.append((child, node, name))
                    node[name] = child
                elif type(child) is not dict or id(child) not in kinds:
                    where = dotted(k for k, _ in keys[: depth + 1])
                    raise CorruptionError(f"{where!r} is both a leaf and a subtree")
                node = child
    if bare:
        if root is not None or len(bare) > 1:
            raise CorruptionError("tree metadata has a bare leaf next to other leaves")
        return bare[0]
    if root is None:
        return {}
    # Sequences become lists, innermost first (children were created after their parents).
    result: Any = root
    for node, parent, key in reversed(seqs):
        lst = _as_list(node)
        if parent is None:
            result = lst
        else:
            parent[key] = lst  # type: ignore[index]
    return result


_MISSING = object()


def _as_list(node: dict[str, Any]) -> list[Any]:
    idx = {int(k): v for k, v in node.items()}
    n = max(idx) + 1 if idx else 0
    if n > 4 * len(idx) + 1024:
        raise CorruptionError(f"tree metadata has a list index {n - 1} far beyond its {len(idx)} elements")
    if n == len(idx):
        return [idx[i] for i in range(n)]
    return [idx.get(i) for i in range(n)]


def dotted(names: Iterable[Any]) -> str:
    """Orbax's param name for a key path: names joined with ``.`` (no escaping)."""
    return ".".join(str(n) for n in names)


# -- flattening user trees --------------------------------------------------------------------


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _jax_key_name(k: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def flatten_with_names(
    tree: Any, *, is_leaf: Callable[[Any], bool] | None = None
) -> tuple[list[tuple[Names, Any]], Callable[[list[Any]], Any]]:
    """Flatten a target tree into ``[(names, leaf)]`` and a function rebuilding it.

    ``None`` and empty containers are leaves here (Orbax stores them as empty-value leaves).
    When JAX is imported, JAX's own pytree flattening is used so that registered node types
    (dataclasses, flax structs, optax states) work; otherwise dicts, lists, tuples and
    NamedTuples are understood.
    """
    if "jax" in sys.modules:
        return _flatten_jax(tree, is_leaf)
    out: list[tuple[Names, Any]] = []

    def walk(x: Any, path: Names) -> Any:
        if is_leaf is not None and is_leaf(x):
            out.append((path, x))
            return None
        if isinstance(x, dict) and x:
            return ("d", type(x), [(k, walk(v, path + (str(k),))) for k, v in x.items()])
        if _is_namedtuple(x) and len(x):
            return ("n", type(x), [(f, walk(getattr(x, f), path + (f,))) for f in x._fields])
        if isinstance(x, (list, tuple)) and x:
            return ("l" if isinstance(x, list) else "t", type(x),
                    [(i, walk(v, path + (str(i),))) for i, v in enumerate(x)])
        out.append((path, x))
        return None

    shape = walk(tree, ())

    def rebuild(values: list[Any]) -> Any:
        it = iter(values)

        def build(s: Any) -> Any:
            if s is None:
                return next(it)
            kind, typ, children = s
            if kind == "d":
                d = {k: build(c) for k, c in children}
                return d if typ is dict else typ(d)
            vals = [build(c) for _, c in children]
            if kind == "n":
                return typ(*vals)
            if kind == "t":
                return tuple(vals) if typ is tuple else typ(vals)
            return vals

        return build(shape)

    return out, rebuild


def _flatten_jax(
    tree: Any, is_leaf: Callable[[Any], bool] | None
) -> tuple[list[tuple[Names, Any]], Callable[[list[Any]], Any]]:
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    def leaf(x: Any) -> bool:
        if is_leaf is not None and is_leaf(x):
            return True
        if x is None:
            return True
        return isinstance(x, (dict, list, tuple)) and not x

    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=leaf)
    out = [(tuple(_jax_key_name(k) for k in path), x) for path, x in flat]
    return out, lambda values: jax.tree_util.tree_unflatten(treedef, values)
