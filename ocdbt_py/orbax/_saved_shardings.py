"""Restore targets as Orbax settles them: saved shardings, and the tree checked (internal).

Orbax restores a leaf saved as a ``jax.Array`` onto the sharding recorded in the item's
``_sharding`` file when the target says no sharding: without a target, and for a target leaf
without one (a ``jax.ShapeDtypeStruct`` from ``jax.eval_shape``).  When the recorded devices
do not all exist in this process it refuses (``TopologyMismatchError``, a ``ValueError`` as
Orbax's).  A leaf saved from NumPy comes back as NumPy.  A target must name exactly the
stored leaves (``TreeMismatchError``, a ``ValueError``), unless ``partial_restore`` allows it
to name fewer.  Without JAX only the tree is checked.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.meta import LeafMetadata, metadata
from ocdbt_py.checkpoint.pytree import flatten_with_names
from ocdbt_py.errors import TopologyMismatchError, TreeMismatchError
from ocdbt_py.kvstore.base import KvStore

__all__ = ["saved_sharding_target", "sharding_from_description", "settled_target"]


_TOPOLOGY = ("Topology mismatch detected. The checkpoint was saved with shardings over devices this process does "
             "not have ({what}); give a target tree with the shardings to restore onto.")


def _devices_missing(desc: Any) -> bool:
    """Whether a ``_sharding`` entry names devices that do not exist here."""
    import jax  # only called when JAX is loaded

    if not isinstance(desc, dict):
        return False
    kind = desc.get("sharding_type")
    if kind == "NamedSharding":
        ids = {d.id for d in jax.devices()}
        try:
            wanted = [int(d["id"]) for d in np.array(desc["device_mesh"]["mesh"], dtype=object).ravel()]
        except (KeyError, TypeError, ValueError):
            return False
        return any(i not in ids for i in wanted)
    if kind == "SingleDeviceSharding":
        return desc.get("device_str") not in {str(d) for d in jax.devices()}
    return False


def _spec_element(e: Any) -> Any:
    if isinstance(e, list):
        return tuple(str(x) for x in e)
    return e if e is None else str(e)


def sharding_from_description(desc: Any) -> Any:
    """A JAX sharding from a ``_sharding`` entry (``None`` when it names devices this process
    does not have, or is of a kind not understood)."""
    import jax  # only called when JAX is loaded

    if not isinstance(desc, dict):
        return None
    devices = {d.id: d for d in jax.devices()}
    kind = desc.get("sharding_type")
    if kind == "NamedSharding":
        try:
            ids = np.vectorize(lambda d: d["id"], otypes=[int])(np.array(desc["device_mesh"]["mesh"], dtype=object))
            mesh_devices = np.vectorize(lambda i: devices[int(i)], otypes=[object])(ids)
            mesh = jax.sharding.Mesh(mesh_devices.reshape(tuple(desc["shape"])), tuple(desc["axis_names"]))
            spec = jax.sharding.PartitionSpec(*(_spec_element(e) for e in desc.get("partition_spec", [])))
            return jax.sharding.NamedSharding(mesh, spec)
        except (KeyError, TypeError, ValueError):
            return None
    if kind == "SingleDeviceSharding":
        wanted = desc.get("device_str")
        for d in devices.values():
            if str(d) == wanted:
                return jax.sharding.SingleDeviceSharding(d)
    return None


def saved_sharding_target(location: str | os.PathLike[str] | KvStore, item: str | None, *,
                          fallback: Any = None) -> Any:
    """The restore target giving saved ``jax.Array`` leaves their saved shardings, or
    ``None`` (restore as stored) when JAX is not loaded or no leaf qualifies.  A leaf whose
    saved devices do not exist here takes ``fallback`` (``StandardRestore(fallback_sharding=)``),
    else it is a :class:`TopologyMismatchError`."""
    if "jax" not in sys.modules:
        return None
    import jax  # loaded already (checked above)

    tree = metadata(location, item=item)
    flat, rebuild = flatten_with_names(tree, is_leaf=lambda x: isinstance(x, LeafMetadata))
    values: list[Any] = []
    found = False
    for names, leaf in flat:
        target = None
        if isinstance(leaf, LeafMetadata) and leaf.value_type == "jax.Array" and leaf.shape is not None:
            if _devices_missing(leaf.sharding):
                if fallback is None:
                    raise TopologyMismatchError(_TOPOLOGY.format(what="/".join(names)))
                sharding = fallback
            else:
                sharding = sharding_from_description(leaf.sharding)
            if sharding is not None:
                target = jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding)
                found = True
        values.append(target)
    return rebuild(values) if found else None


def _stored_leaves(location: str | os.PathLike[str] | KvStore, item: str | None) -> dict[tuple[str, ...], Any]:
    tree = metadata(location, item=item)
    flat, _ = flatten_with_names(tree, is_leaf=lambda x: isinstance(x, LeafMetadata))
    return dict(flat)


#: The start of Orbax's error text for a restore target that does not match the stored tree
_MISMATCH = "User-provided restore item and on-disk value metadata tree structures do not match:"


def settled_target(location: str | os.PathLike[str] | KvStore, item: str | None, target: Any, *,
                   partial: bool = False, present: Any = None, fallback: Any = None) -> Any:
    """``target`` checked against the stored tree, its sharding-less ``jax.ShapeDtypeStruct``
    leaves given the saved shardings (or ``None``, restore as stored, for leaves saved from
    NumPy).  ``present(leaf)`` says which other target leaves stand for a stored leaf without
    being restored (Orbax's ``PLACEHOLDER``).  ``fallback``: the sharding of leaves whose
    saved devices do not exist here (else :class:`TopologyMismatchError`)."""
    stored = _stored_leaves(location, item)
    flat, rebuild = flatten_with_names(target, is_leaf=present)
    names = {n for n, leaf in flat if present is None or not present(leaf)}
    held = {n for n, leaf in flat if present is not None and present(leaf)}  # stand for a whole subtree

    def under(n: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
        return n[:len(prefix)] == prefix

    extra = [n for n in names if n not in stored]
    extra += [h for h in held if not any(under(n, h) for n in stored)]
    if extra:
        raise TreeMismatchError(f"{_MISMATCH} the restore target names leaves the checkpoint does not have: "
                                f"{sorted('/'.join(n) for n in extra)}")
    missing = [n for n in stored if n not in names and not any(under(n, h) for h in held)]
    # as Orbax: a PLACEHOLDER stands for one stored leaf; over a whole subtree it is a mismatch
    # unless partial_restore
    subtrees = [h for h in held if h not in stored]
    if (missing or subtrees) and not partial:
        what = (f"the restore target lacks leaves the checkpoint has: {sorted('/'.join(n) for n in missing)}"
                if missing else
                f"PLACEHOLDER stands for subtrees, not leaves: {sorted('/'.join(n) for n in subtrees)}")
        raise TreeMismatchError(f"{_MISMATCH} {what}. If this mismatch is intentional, pass "
                                "`partial_restore=True` to only restore parameters found in `item`.")
    if "jax" not in sys.modules:
        return target
    import jax  # loaded already (checked above)

    values: list[Any] = []
    changed = False
    for n, leaf in flat:
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None and n in stored:
            leaf = _with_saved_sharding(leaf, stored[n], n, fallback)
            changed = True
        values.append(leaf)
    return rebuild(values) if changed else target


def _with_saved_sharding(leaf: Any, meta: Any, names: tuple[str, ...], fallback: Any = None) -> Any:
    """A sharding-less abstract leaf as Orbax restores it: on the saved sharding, or as stored."""
    import jax  # only called when JAX is loaded

    if not isinstance(meta, LeafMetadata) or meta.value_type != "jax.Array" or meta.sharding is None:
        # saved from NumPy (or no sharding recorded): restored as NumPy, as Orbax does
        return np.broadcast_to(np.zeros((), dtype=np.dtype(leaf.dtype)), tuple(leaf.shape))
    if _devices_missing(meta.sharding):
        if fallback is None:
            raise TopologyMismatchError(_TOPOLOGY.format(what="/".join(names)))
        return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=fallback)
    sharding = sharding_from_description(meta.sharding)
    if sharding is None:
        return np.broadcast_to(np.zeros((), dtype=np.dtype(leaf.dtype)), tuple(leaf.shape))
    return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding)
