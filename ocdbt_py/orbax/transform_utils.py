"""``ocp.transform_utils``: restore a checkpoint into a differently shaped tree.

``Transform(original_key=..., value_fn=..., multi_value_fn=..., use_fallback=...)`` says where
a leaf of the new tree comes from; :func:`apply_transformations` builds the new tree from the
original one (keys are ``/``-joined paths, and a transformation's key may be a regular
expression whose groups ``original_key`` refers to as ``\\1``).  ``PyTreeRestore(item,
transforms=...)`` uses it; ``transforms={}`` restores the item's keys from the checkpoint,
leaving out the others (what MaxText's ``load_params_from_path`` does).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from ocdbt_py.checkpoint.pytree import flatten_with_names

__all__ = ["Transform", "RestoreTransform", "apply_transformations"]


@dataclasses.dataclass
class Transform:
    """Where one key of the new tree comes from (see the module docstring)."""

    original_key: str | None = None
    use_fallback: bool = False
    value_fn: Callable[[Any], Any] | None = None
    multi_value_fn: Callable[..., Any] | None = None


@dataclasses.dataclass
class RestoreTransform(Transform):
    """A :class:`Transform` used at restore time (``restore_args`` may say how to restore the
    original value)."""

    restore_args: Any = None


def _flat(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> dict[str, Any]:
    return {"/".join(names): v for names, v in flatten_with_names(tree, is_leaf=is_leaf)[0]}


def apply_transformations(original_tree: Any, transformations: Any, new_tree: Any,
                          default_to_original: bool | None = True) -> Any:
    """``new_tree``'s structure with each leaf taken from ``original_tree`` as
    ``transformations`` say (a leaf no transformation names takes the original value of the
    same key when ``default_to_original``, else keeps its value in ``new_tree``)."""
    original = _flat(original_tree)
    rules = list(_flat(transformations, is_leaf=lambda x: isinstance(x, Transform)).items())
    flat_new, rebuild = flatten_with_names(new_tree)
    values = []
    for names, new_value in flat_new:
        key = "/".join(names)
        rule = next(((re.fullmatch(pattern, key), t) for pattern, t in rules
                     if isinstance(t, Transform) and re.fullmatch(pattern, key)), None)
        if rule is None:
            if not default_to_original:
                values.append(new_value)
                continue
            if key not in original:
                raise ValueError(f"Key {key!r} of the new tree is not in the original tree and no transformation "
                                 "names it.")
            values.append(original[key])
            continue
        match, t = rule
        if t.use_fallback:
            values.append(new_value if default_to_original else original.get(key, new_value))
        elif t.multi_value_fn is not None:
            try:
                values.append(t.multi_value_fn(key, original_tree))
            except TypeError:
                values.append(t.multi_value_fn(original_tree))
        else:
            source = match.expand(t.original_key) if t.original_key is not None and match else key
            if source not in original:
                raise ValueError(f"Transformation of {key!r}: original key {source!r} is not in the original tree.")
            value = original[source]
            values.append(t.value_fn(value) if t.value_fn is not None else value)
    return rebuild(values)
