"""Orbax arguments to the native API's trees, targets and save options (internal).

Save: a ``StandardSave``/``PyTreeSave`` item becomes the tree :func:`ocdbt_py.checkpoint.save`
writes (leaves cast to ``SaveArgs.dtype``) plus per-leaf chunk byte sizes; restore: a
``restore_args`` tree becomes a native restore target (``jax.ShapeDtypeStruct`` leaves with
shardings for ``ArrayRestoreArgs``, typed NumPy stand-ins for ``RestoreArgs``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.pytree import dotted, flatten_with_names
from ocdbt_py.orbax.metadata_sharding import ShardingMetadata
from ocdbt_py.orbax.type_handlers import ArrayRestoreArgs, RestoreArgs, SaveArgs

__all__ = ["apply_save_args", "restore_target", "jax_sharding", "apply_reshapes", "strip_placeholders",
           "put_placeholders", "PLACEHOLDER"]

#: Orbax's ``PLACEHOLDER``: a leaf of a restore target that is not restored (kept as ``...``).
PLACEHOLDER = ...


def _cast(value: Any, dtype: Any) -> Any:
    if hasattr(value, "astype") and not isinstance(value, np.generic):
        return value.astype(dtype)  # np.ndarray and jax.Array (keeps its sharding)
    return np.asarray(value).astype(dtype)


def apply_save_args(item: Any, save_args: Any) -> tuple[Any, dict[str, int]]:
    """``item`` with leaves cast to their ``SaveArgs.dtype``, and ``{param name:
    chunk_byte_size}`` for leaves whose ``SaveArgs`` set one."""
    if save_args is None:
        return item, {}
    flat_args: list[tuple[tuple[str, ...], Any]]
    if isinstance(save_args, SaveArgs):  # one SaveArgs for a single-leaf item
        flat_args = [((), save_args)]
    else:
        flat_args, _ = flatten_with_names(save_args, is_leaf=lambda x: isinstance(x, SaveArgs))
    by_name = {names: a for names, a in flat_args if isinstance(a, SaveArgs)}
    sizes = {dotted(n): a.chunk_byte_size for n, a in by_name.items() if a.chunk_byte_size is not None}
    if not any(a.dtype is not None for a in by_name.values()):
        return item, sizes
    flat, rebuild = flatten_with_names(item)
    values = []
    for names, value in flat:
        a = by_name.get(names)
        values.append(_cast(value, a.dtype) if a is not None and a.dtype is not None and value is not None
                      else value)
    return rebuild(values), sizes


def jax_sharding(s: Any) -> Any:
    """``s``, or the JAX sharding a saved ``ShardingMetadata`` describes (as Orbax's restore
    accepts either in ``ArrayRestoreArgs.sharding``)."""
    return s.to_jax_sharding() if isinstance(s, ShardingMetadata) else s


def _stand_in(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zero-memory ndarray of ``shape`` and ``dtype``: tells the native restore the type."""
    return np.broadcast_to(np.zeros((), dtype=np.dtype(dtype)), tuple(shape))


def _array_target(args: ArrayRestoreArgs, like: Any, stored: Callable[[tuple[str, ...]], Any],
                  names: tuple[str, ...], reshapes: dict[tuple[str, ...], Any] | None = None) -> Any:
    import jax  # ArrayRestoreArgs name JAX shardings: JAX is loaded already

    sharding = jax_sharding(args.sharding)
    if sharding is None and args.mesh is not None:
        sharding = jax.sharding.NamedSharding(args.mesh, args.mesh_axes)
    if sharding is None:
        sharding = jax_sharding(getattr(like, "sharding", None))
    shape = args.global_shape
    dtype = args.dtype
    if shape is None and like is not None and hasattr(like, "shape"):
        shape = tuple(like.shape)
    if dtype is None and like is not None and hasattr(like, "dtype"):
        dtype = like.dtype
    if shape is None or dtype is None:
        meta = stored(names)
        shape = tuple(meta.shape) if shape is None else shape
        dtype = meta.dtype if dtype is None else dtype
    if sharding is None:
        raise ValueError(f"ArrayRestoreArgs for {dotted(names)!r} gives no sharding (or mesh and mesh_axes)")
    try:
        saved = tuple(stored(names).shape)
    except (KeyError, IndexError, TypeError, AttributeError):
        saved = tuple(shape)  # not stored: the native restore names the missing leaf
    if saved != tuple(shape):
        if args.strict:
            raise ValueError(f"Requested shape {tuple(shape)} for {dotted(names)!r} is not compatible with the "
                             f"stored shape {saved} (ArrayRestoreArgs(strict=False) pads or truncates)")
        if reshapes is not None:  # restored on the host at the stored shape, then padded or truncated
            reshapes[names] = (tuple(shape), sharding)
            return _stand_in(saved, dtype)
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _plain_target(args: RestoreArgs, like: Any, stored: Callable[[tuple[str, ...]], Any],
                  names: tuple[str, ...]) -> Any:
    rt = args.restore_type
    if rt in (int, float, bool, complex):
        return rt(0)
    if args.dtype is None:
        return like if like is not None and not _is_jax(like) else None
    shape = getattr(like, "shape", None)
    if shape is None:
        shape = stored(names).shape
    return _stand_in(tuple(shape), args.dtype)


def _is_jax(x: Any) -> bool:
    if "jax" not in sys.modules:
        return False
    import jax  # loaded already (checked above)

    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


def restore_target(item: Any, restore_args: Any, stored: Callable[[tuple[str, ...]], Any],
                   reshapes: dict[tuple[str, ...], Any] | None = None) -> Any:
    """The native restore target for ``PyTreeRestore(item, restore_args)``.

    With both, ``item`` gives the structure (``restore_args`` may cover more leaves, as after
    ``construct_restore_args`` on the full tree) and each of its leaves takes the restore
    argument of the same path.  ``stored(names)`` gives the stored
    :class:`~ocdbt_py.checkpoint.LeafMetadata` of a leaf (asked only when neither argument says
    its shape or dtype).  ``PLACEHOLDER`` (``...``) leaves stay ``...``.  A requested shape
    other than the stored one is a ``ValueError``, or with ``ArrayRestoreArgs(strict=False)``
    an entry of ``reshapes`` (see :func:`apply_reshapes`).
    """
    if restore_args is None:
        return item
    is_args = lambda x: isinstance(x, RestoreArgs)  # noqa: E731
    flat_args, rebuild = flatten_with_names(restore_args, is_leaf=is_args)
    likes: dict[tuple[str, ...], Any] = {}
    if item is not None:
        flat_item, rebuild_item = flatten_with_names(item)
        likes = dict(flat_item)
        by_name = dict(flat_args)
        if len(flat_item) != len(flat_args) or set(likes) != set(by_name):
            # the item's structure wins: its leaves with the argument of the same path
            flat_args, rebuild = [(n, by_name.get(n)) for n, _ in flat_item], rebuild_item
    values = []
    for names, a in flat_args:
        like = likes.get(names)
        if like is PLACEHOLDER:
            values.append(PLACEHOLDER)
        elif isinstance(a, ArrayRestoreArgs):
            values.append(_array_target(a, like, stored, names, reshapes))
        elif isinstance(a, RestoreArgs):
            values.append(_plain_target(a, like, stored, names))
        else:
            values.append(a if a is not None else like)
    return rebuild(values)


def strip_placeholders(tree: Any) -> tuple[Any, list[tuple[Any, ...]]]:
    """``tree`` without its ``PLACEHOLDER`` leaves (dict entries only) and their paths."""
    paths: list[tuple[Any, ...]] = []

    def walk(x: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(x, dict):
            out = {}
            for k, v in x.items():
                if v is PLACEHOLDER:
                    paths.append(path + (k,))
                else:
                    out[k] = walk(v, path + (k,))
            return type(x)(out) if type(x) is not dict else out
        return x

    return walk(tree, ()), paths


def put_placeholders(tree: Any, paths: list[tuple[Any, ...]]) -> Any:
    """``tree`` with ``PLACEHOLDER`` put back at ``paths`` (from :func:`strip_placeholders`)."""
    for path in paths:
        node = tree
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = PLACEHOLDER
    return tree


def apply_reshapes(tree: Any, reshapes: dict[tuple[str, ...], Any]) -> Any:
    """``tree`` with each leaf of ``reshapes`` (restored at its stored shape) zero-padded or
    truncated to the requested shape and placed on its sharding (``strict=False``)."""
    if not reshapes:
        return tree
    import jax  # reshapes come from ArrayRestoreArgs: JAX is loaded already

    flat, rebuild = flatten_with_names(tree)
    out = []
    for names, value in flat:
        if names in reshapes:
            shape, sharding = reshapes[names]
            host = np.asarray(value)
            cut = host[tuple(slice(0, min(a, b)) for a, b in zip(host.shape, shape))]
            padded = np.zeros(shape, dtype=host.dtype)
            padded[tuple(slice(0, n) for n in cut.shape)] = cut
            value = jax.device_put(padded, sharding)
        out.append(value)
    return rebuild(out)
