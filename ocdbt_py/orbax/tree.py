"""``ocp.tree``: flat-dict helpers and ``to_shape_dtype_struct`` (no JAX needed for NumPy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.pytree import build_tree, dotted, flatten_with_names

__all__ = ["to_flat_dict", "from_flat_dict", "is_flat_dict", "get_param_names", "to_shape_dtype_struct"]


def to_flat_dict(tree: Any, sep: str | None = None, keep_empty_nodes: bool = False) -> dict[Any, Any]:
    """``{key path tuple: leaf}`` (``sep``: key names joined with it instead)."""
    flat, _ = flatten_with_names(tree)
    out: dict[Any, Any] = {}
    for names, leaf in flat:
        if not keep_empty_nodes and (leaf is None or (isinstance(leaf, (dict, list, tuple)) and not leaf)):
            continue
        out[sep.join(names) if sep is not None else tuple(names)] = leaf
    return out


def is_flat_dict(x: Any) -> bool:
    """Whether ``x`` is a dict keyed by tuples of strings."""
    return isinstance(x, Mapping) and all(isinstance(k, tuple) for k in x)


def from_flat_dict(flat_dict: Mapping[Any, Any], target: Any = None, sep: str | None = None) -> Any:
    """Rebuild a nested dict (or ``target``'s structure) from :func:`to_flat_dict` output."""
    def path(k: Any) -> tuple[str, ...]:
        return tuple(k.split(sep)) if sep is not None and isinstance(k, str) else tuple(k)

    if target is None:
        return build_tree([([(n, 2) for n in path(k)], v) for k, v in flat_dict.items()])
    flat, rebuild = flatten_with_names(target)
    by_path = {path(k): v for k, v in flat_dict.items()}
    return rebuild([by_path.get(names, leaf) for names, leaf in flat])


def get_param_names(tree: Any) -> Any:
    """The tree with each leaf replaced by its param name (key names joined with ``.``)."""
    flat, rebuild = flatten_with_names(tree)
    return rebuild([dotted(names) for names, _ in flat])


def to_shape_dtype_struct(x: Any, dtype: Any = None, scalar_dtype: Any = None) -> Any:
    """A ``jax.ShapeDtypeStruct`` (with the sharding) for an array or array metadata leaf;
    scalars are kept (cast to ``scalar_dtype`` when given)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return scalar_dtype(x) if scalar_dtype is not None else x
    import jax  # ShapeDtypeStruct is JAX's type

    sharding = getattr(x, "sharding", None)
    if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
        sharding = None  # stored sharding descriptions are not shardings
    shape = tuple(getattr(x, "shape", np.shape(x)))
    return jax.ShapeDtypeStruct(shape, dtype or x.dtype, sharding=sharding)
