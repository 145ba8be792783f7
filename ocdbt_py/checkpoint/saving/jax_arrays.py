"""What this process writes of a ``jax.Array``, and the sharding Orbax records for it.

Only imported when the tree holds JAX arrays.  Each process writes the addressable shards
with ``replica_id == 0``; with replica-parallel writing (Orbax's default unless
``JAX_PLATFORMS`` names a GPU) a replicated shard is split along its first axis divisible by
the replica count and replica ``r`` writes slice ``r``, so every replica shares the work.
Typed PRNG keys are stored by their key data with ``random_key_impl`` recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ocdbt_py.checkpoint.saving.arrays import storage_dtype
from ocdbt_py.checkpoint.saving.chunking import replica_parallel_axis

__all__ = ["Piece", "JaxArrayPlan", "plan_jax_array", "default_replica_parallel", "sharding_json"]


@dataclasses.dataclass
class Piece:
    """A region this process writes: its global origin and its host data.

    ``shared`` is true when ``data`` views the device buffer itself (CPU devices), so an
    asynchronous save must copy it; a transfer from an accelerator is already a private copy.
    """

    origin: tuple[int, ...]
    data: np.ndarray
    shared: bool = True


@dataclasses.dataclass
class JaxArrayPlan:
    """How one ``jax.Array`` is saved by this process."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    write_shape: tuple[int, ...]
    pieces: list[Piece]
    sharding: str | None
    ext_metadata: dict[str, Any] | None


def default_replica_parallel() -> bool:
    """Orbax's default: replica-parallel unless ``JAX_PLATFORMS`` mentions a GPU."""
    platform = os.environ.get("JAX_PLATFORMS", "").lower()
    return not ("gpu" in platform or "cuda" in platform)


@functools.lru_cache(maxsize=4096)
def _num_replicas(sharding: Any, shape: tuple[int, ...]) -> int:
    counts: dict[tuple[tuple[int, int], ...], int] = {}
    for index in sharding.devices_indices_map(shape).values():
        key = tuple(
            (s.start or 0, dim if s.stop is None else s.stop) if isinstance(s, slice) else (int(s), int(s) + 1)
            for s, dim in zip(index, shape)
        )
        counts[key] = counts.get(key, 0) + 1
    values = set(counts.values())
    if len(values) != 1:
        raise ValueError(f"sharding {sharding} replicates its shards unevenly ({sorted(values)} copies)")
    return values.pop()


def _start(index: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s, _dim in zip(index, shape):
        if isinstance(s, slice):
            if s.step not in (None, 1):
                raise ValueError(f"shard index {index} has a step")
            out.append(int(s.start or 0))
        else:
            out.append(int(s))
    return tuple(out)


def _json_spec_element(e: Any) -> Any:
    if e is None or isinstance(e, str):
        return e
    if isinstance(e, (tuple, list)):
        return [_json_spec_element(x) for x in e]
    raise TypeError(f"cannot record partition spec element {e!r}")


_V = TypeVar("_V")


def _memo(cache: dict[Any, _V], key: Any, make: Callable[[], _V]) -> _V:
    """``cache[key]``, made by ``make()`` on a miss; the cache is emptied past 4096 entries,
    and unhashable keys (e.g. an unhashable sharding) are simply not cached."""
    try:
        return cache[key]
    except (KeyError, TypeError):
        pass
    value = make()
    try:
        if len(cache) > 4096:
            cache.clear()
        cache[key] = value
    except TypeError:
        pass
    return value


_json_cache: dict[Any, str | None] = {}


def sharding_json(sharding: Any) -> str | None:
    """The serialized sharding Orbax writes into ``_sharding`` (``None`` for other types).

    Shardings are immutable and hashable: a training loop saving the same state repeatedly
    serializes each distinct sharding once.
    """
    return _memo(_json_cache, sharding, lambda: _sharding_json(sharding))


def _sharding_json(sharding: Any) -> str | None:
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = sharding.mesh
        doc: dict[str, Any] = {
            "sharding_type": "NamedSharding",
            "shape": [int(v) for v in mesh.shape.values()],
            "axis_names": list(mesh.axis_names),
        }
        axis_types = getattr(mesh, "axis_types", None)
        if axis_types is not None:
            doc["axis_types"] = [str(a) for a in axis_types]
        doc["partition_spec"] = [_json_spec_element(e) for e in tuple(sharding.spec)]
        devices = np.asarray(mesh.devices)
        doc["device_mesh"] = {"mesh": _device_ids(devices.tolist())}
        return json.dumps(doc)
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = tuple(sharding.device_set)
        return json.dumps({"sharding_type": "SingleDeviceSharding", "device_str": str(device)})
    return None


def _device_ids(nested: Any) -> Any:
    if isinstance(nested, list):
        return [_device_ids(x) for x in nested]
    return {"id": int(nested.id)}


def _owned_by(sharding: Any, shape: tuple[int, ...], devices: frozenset[int]) -> set[int]:
    """The devices writing ``shape``'s regions when only ``devices`` write: each distinct
    region once, by the lowest device id among ``devices`` holding it."""
    owner: dict[tuple[tuple[int, int], ...], int] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        if int(device.id) not in devices:
            continue
        key = tuple(s.indices(n)[:2] if isinstance(s, slice) else (int(s), int(s) + 1) for s, n in zip(index, shape))
        if key not in owner or int(device.id) < owner[key]:
            owner[key] = int(device.id)
    return set(owner.values())


@dataclasses.dataclass(frozen=True)
class _Layout:
    """What :func:`plan_jax_array` writes of every array with one sharding and shape: per
    region, the position of its shard among the addressable ones, its global origin and the
    slice of the shard (``None``: all of it).  Shardings are immutable, so a training loop
    saving the same state works this out once per distinct sharding."""

    write_shape: tuple[int, ...]
    parts: tuple[tuple[int, tuple[int, ...], tuple[slice, ...] | None], ...]
    shared: bool


_layout_cache: dict[Any, _Layout] = {}


def _layout(arr: Any, shape: tuple[int, ...], replica_parallel: bool, devices: frozenset[int] | None) -> _Layout:
    key = (arr.sharding, shape, replica_parallel, devices)
    return _memo(_layout_cache, key, lambda: _make_layout(arr, shape, replica_parallel, devices))


def _make_layout(arr: Any, shape: tuple[int, ...], replica_parallel: bool,
                 devices: frozenset[int] | None) -> _Layout:
    shards = list(arr.addressable_shards)
    shard_shape = tuple(int(d) for d in shards[0].data.shape)
    replicas = _num_replicas(arr.sharding, shape)
    axis = replica_parallel_axis(shard_shape, replicas) if replica_parallel else None
    shared = all(getattr(sh.device, "platform", "cpu") == "cpu" for sh in shards)
    parts: list[tuple[int, tuple[int, ...], tuple[slice, ...] | None]] = []
    if devices is not None:
        write_shape = shard_shape
        owners = _owned_by(arr.sharding, shape, devices)
        parts = [(i, _start(sh.index, shape), None) for i, sh in enumerate(shards) if int(sh.device.id) in owners]
    elif axis is not None:
        size = shard_shape[axis] // replicas
        write_shape = shard_shape[:axis] + (size,) + shard_shape[axis + 1:]
        for i, sh in enumerate(shards):
            rid = int(sh.replica_id)
            if rid >= replicas:
                continue
            origin = list(_start(sh.index, shape))
            origin[axis] += rid * size
            sl = [slice(None)] * len(shape)
            sl[axis] = slice(rid * size, (rid + 1) * size)
            parts.append((i, tuple(origin), tuple(sl)))
    else:
        write_shape = shard_shape
        parts = [(i, _start(sh.index, shape), None) for i, sh in enumerate(shards) if int(sh.replica_id) == 0]
    return _Layout(write_shape, tuple(parts), shared)


def plan_jax_array(arr: Any, *, replica_parallel: bool, name: str = "",
                   devices: frozenset[int] | None = None) -> JaxArrayPlan:
    """Shapes, sharding record and this process's regions of ``arr`` as host arrays.

    ``devices`` (device ids): write the regions of those devices instead of the shards with
    ``replica_id == 0`` -- each distinct region once, by the lowest id holding it, without
    replica-parallel splitting (process-local and single-replica saves).
    """
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    ext: dict[str, Any] | None = None
    if _is_key(arr.dtype):
        ext = {"random_key_impl": str(jax.random.key_impl(arr))}
        arr = jax.random.key_data(arr)  # Orbax stores (and records the sharding of) the key data
    shape = tuple(int(d) for d in arr.shape)
    if math.prod(shape) == 0:
        raise ValueError(f"Cannot save arrays with zero size: {name or 'jax.Array'} has shape {shape}")

    dtype = storage_dtype(arr.dtype)
    if not arr.sharding.addressable_devices:
        raise ValueError(f"{name or 'jax.Array'} has no addressable shard in this process")
    layout = _layout(arr, shape, replica_parallel, devices)
    pieces = []
    for i, origin, sl in layout.parts:
        # the i-th addressable shard's buffer (a fully replicated array gives its first shard
        # for every i: the same values, without building a Shard per device)
        host = np.asarray(arr.addressable_data(i))
        pieces.append(Piece(origin, host if sl is None else host[sl], layout.shared))
    return JaxArrayPlan(shape, dtype, layout.write_shape, pieces, sharding_json(arr.sharding), ext)


@functools.lru_cache(maxsize=256)
def _is_key(dtype: Any) -> bool:
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
