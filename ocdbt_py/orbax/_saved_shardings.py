"""Restoring ``jax.Array`` leaves with the shardings they were saved with (internal).

Orbax restores a leaf saved as a ``jax.Array`` without a target onto the sharding recorded
in the item's ``_sharding`` file.  When JAX is loaded, this module builds that target from
the native metadata: a ``jax.ShapeDtypeStruct`` per such leaf whose mesh devices all exist
here, ``None`` (as stored: NumPy) for every other leaf.  Without JAX nothing changes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.meta import LeafMetadata, metadata
from ocdbt_py.checkpoint.pytree import flatten_with_names
from ocdbt_py.kvstore.base import KvStore

__all__ = ["saved_sharding_target", "sharding_from_description"]


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


def saved_sharding_target(location: str | os.PathLike[str] | KvStore, item: str | None) -> Any:
    """The restore target giving saved ``jax.Array`` leaves their saved shardings, or
    ``None`` (restore as stored) when JAX is not loaded or no leaf qualifies."""
    if "jax" not in sys.modules:
        return None
    import jax  # loaded already (checked above)

    tree = metadata(location, item=item)
    flat, rebuild = flatten_with_names(tree, is_leaf=lambda x: isinstance(x, LeafMetadata))
    values: list[Any] = []
    found = False
    for _, leaf in flat:
        target = None
        if isinstance(leaf, LeafMetadata) and leaf.value_type == "jax.Array" and leaf.shape is not None:
            sharding = sharding_from_description(leaf.sharding)
            if sharding is not None:
                target = jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding)
                found = True
        values.append(target)
    return rebuild(values) if found else None
