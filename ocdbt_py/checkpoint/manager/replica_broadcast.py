"""Copying one replica's arrays to every replica with a JAX collective.

When one data-parallel replica restored a step from its local tiers, the other replicas get
the values over the devices' interconnect rather than from storage: each leaf becomes a
global array with an extra leading axis sharded over the replica axis of the mesh (the
source replica's devices hold the restored shards, every other device zeros), and one jitted
program selects the source's slice, which XLA lowers to a collective (gloo on CPU).

Selection is done on the values' bit patterns (floats are bit-cast to unsigned integers of
their width, complex numbers split into two), so the copy is exact: ``-0.0`` and NaN payloads
survive.  Every process of the job must call :func:`broadcast_from_replica` with the same
leaves, in the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ocdbt_py.checkpoint.manager.mesh_metadata import ReplicaLayout

__all__ = ["can_broadcast", "broadcast_from_replica"]

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _spec_axes(spec: PartitionSpec) -> set[str]:
    out: set[str] = set()
    for e in tuple(spec):
        if e is None:
            continue
        if isinstance(e, (tuple, list)):
            out.update(str(x) for x in e)
        else:
            out.add(str(e))
    return out


def can_broadcast(target: Any, mesh: Any, layout: ReplicaLayout) -> str | None:
    """Why ``target`` (a ``jax.ShapeDtypeStruct`` or ``jax.Array``) cannot be copied across
    replicas (``None``: it can): it must be a ``NamedSharding`` on the manager's mesh whose
    partition spec does not use the replica axis (every replica then holds the whole value)."""
    sharding = getattr(target, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return f"its sharding is {type(sharding).__name__}, not a NamedSharding"
    if tuple(int(d.id) for d in sharding.mesh.devices.flat) != tuple(int(d.id) for d in mesh.devices.flat) or \
            tuple(sharding.mesh.axis_names) != tuple(mesh.axis_names):
        return "its sharding is not on the manager's global mesh"
    if layout.axis_name in _spec_axes(sharding.spec):
        return f"it is sharded over the replica axis {layout.axis_name!r}"
    return None


def _to_bits(x: jax.Array) -> tuple[jax.Array, ...]:
    dt = x.dtype
    if jnp.issubdtype(dt, jnp.complexfloating):
        return _to_bits(jnp.real(x)) + _to_bits(jnp.imag(x))
    if jnp.issubdtype(dt, jnp.floating):
        return (jax.lax.bitcast_convert_type(x, _UINT[jnp.dtype(dt).itemsize]),)
    return (x,)  # integers (any width) and bools are selected exactly as they are


def _from_bits(parts: tuple[jax.Array, ...], dt: Any) -> jax.Array:
    if jnp.issubdtype(dt, jnp.complexfloating):
        half = jnp.finfo(dt).dtype
        return jax.lax.complex(_from_bits(parts[:1], half), _from_bits(parts[1:], half))
    if jnp.issubdtype(dt, jnp.floating):
        return jax.lax.bitcast_convert_type(parts[0], dt)
    return parts[0]


def _select(source: int, dtypes: tuple[Any, ...]) -> Any:
    def run(*leaves: jax.Array) -> tuple[jax.Array, ...]:
        out = []
        for x, dt in zip(leaves, dtypes):
            bits = tuple(b[source] for b in _to_bits(x))
            out.append(_from_bits(bits, dt))
        return tuple(out)

    return run


@functools.lru_cache(maxsize=16)
def _program(source: int, dtypes: tuple[Any, ...], shardings: tuple[NamedSharding, ...]) -> Any:
    """The jitted selection (cached: a restore of the same state compiles it once)."""
    return jax.jit(_select(source, dtypes), out_shardings=shardings)


def _zeros(shape: tuple[int, ...], dtype: Any, device: Any) -> jax.Array:
    return jax.device_put(np.zeros(shape, dtype=dtype), device)


def broadcast_from_replica(
    values: Sequence[jax.Array] | None,
    targets: Sequence[Any],
    mesh: Any,
    layout: ReplicaLayout,
    source: int,
) -> list[jax.Array]:
    """The source replica's ``values`` placed with the ``targets``' shardings everywhere.

    ``values`` (one ``jax.Array`` per target, sharded as the target) is given by the
    processes of replica ``source`` and ``None`` elsewhere; only the source's addressable
    shards are read.  ``targets`` must pass :func:`can_broadcast`.
    """
    count = layout.count
    axis = layout.axis_name
    globalized: list[jax.Array] = []
    shardings: list[NamedSharding] = []
    for i, t in enumerate(targets):
        sharding = t.sharding
        shape = tuple(int(d) for d in t.shape)
        spec = tuple(sharding.spec) + (None,) * (len(shape) - len(tuple(sharding.spec)))
        gsharding = NamedSharding(mesh, PartitionSpec(axis, *spec))
        gshape = (count, *shape)
        have: dict[int, Any] = {}
        if values is not None:
            for sh in values[i].addressable_shards:
                have[int(sh.device.id)] = sh.data
        bufs = []
        index_map: dict[Any, Any] = dict(gsharding.addressable_devices_indices_map(gshape))
        for device, index in index_map.items():
            index = tuple(index or ()) + (slice(None),) * (len(gshape) - len(tuple(index or ())))
            region = tuple(s.indices(n)[1] - s.indices(n)[0] for s, n in zip(index[1:], shape))
            data = have.get(int(device.id))
            if data is not None:
                bufs.append(jnp.expand_dims(data, 0))
            else:
                bufs.append(_zeros((1, *region), t.dtype, device))
        globalized.append(jax.make_array_from_single_device_arrays(gshape, gsharding, bufs))
        shardings.append(sharding)
    if not globalized:
        return []
    out = _program(source, tuple(jnp.dtype(t.dtype) for t in targets), tuple(shardings))(*globalized)
    jax.block_until_ready(out)
    return list(out)
