"""``ocp.checkpoint_utils.construct_restore_args``: restore arguments from a target tree."""

from __future__ import annotations

from typing import Any

import numpy as np

from ocdbt_py.checkpoint.pytree import flatten_with_names
from ocdbt_py.orbax.type_handlers import ArrayRestoreArgs, RestoreArgs

__all__ = ["construct_restore_args"]


def _restore_args(x: Any, sharding: Any, set_global_shape: bool) -> RestoreArgs:
    import sys

    if "jax" in sys.modules:
        import jax

        if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
            s = sharding if sharding is not None else getattr(x, "sharding", None)
            return ArrayRestoreArgs(sharding=s, global_shape=tuple(x.shape) if set_global_shape else None,
                                    dtype=x.dtype)
    if isinstance(x, (np.ndarray, np.generic)):
        return RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return RestoreArgs(restore_type=type(x))
    return RestoreArgs(restore_type=type(x) if x is not None else None)


def construct_restore_args(target: Any, sharding_tree: Any = None, set_global_shape: bool = True,
                           support_layout: bool = False) -> Any:
    """A tree of :class:`ArrayRestoreArgs` (JAX leaves: their sharding, shape and dtype) and
    :class:`RestoreArgs` (NumPy and Python leaves) shaped like ``target``."""
    flat, rebuild = flatten_with_names(target)
    shardings: dict[Any, Any] = {}
    if sharding_tree is not None:
        shardings = dict(flatten_with_names(sharding_tree)[0])
    return rebuild([_restore_args(x, shardings.get(names), set_global_shape) for names, x in flat])
