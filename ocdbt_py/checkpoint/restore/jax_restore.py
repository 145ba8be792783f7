"""Building ``jax.Array`` leaves, each device reading only its own index domain.

Imported only when a restore target contains JAX objects; importing it imports JAX.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ocdbt_py.checkpoint.restore import reader as reader_mod
from ocdbt_py.checkpoint.restore.item import ARRAY, EMPTY, INLINE, SCALAR, STRING, Leaf, PyTreeItem
from ocdbt_py.pools import map_concurrently

__all__ = ["restore_jax_leaves"]



def _index_key(index: tuple[slice, ...], shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
    out = []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"sharding index {index} uses a step; not supported")
        out.append((start, stop))
    return tuple(out)


def _target_spec(t: Any) -> tuple[tuple[int, ...], np.dtype, Any]:
    sharding = getattr(t, "sharding", None)
    return tuple(t.shape), np.dtype(t.dtype) if not _is_key_dtype(t.dtype) else t.dtype, sharding


def _is_key_dtype(dt: Any) -> bool:
    try:
        return bool(jax.dtypes.issubdtype(dt, jax.dtypes.prng_key))
    except TypeError:
        return False


def restore_jax_leaves(item: PyTreeItem, leaves: Sequence[tuple[Leaf, Any]]) -> list[Any]:
    """One ``jax.Array`` per ``(stored leaf, target leaf)`` pair.

    Small arrays (at most ``reader.SMALL_ARRAY_BYTES``) are fetched whole in batches and
    sliced per device in memory; larger ones are read region by region, each device's index
    domain straight from storage.
    """

    small: list[str] = []
    for leaf, t in leaves:
        if leaf.kind in (ARRAY, SCALAR) and not _is_key_dtype(t.dtype):
            param = item.data_param(leaf)
            meta = item.reader.metadata(param)
            if int(np.prod(meta.shape)) * meta.data_type.dtype.itemsize <= reader_mod.SMALL_ARRAY_BYTES:
                small.append(param)
    hosts = dict(item.reader.read_many(list(dict.fromkeys(small)))) if small else {}
    return [_restore_one(item, leaf, t, hosts) for leaf, t in leaves]


def _restore_one(item: PyTreeItem, leaf: Leaf, t: Any, hosts: dict[str, np.ndarray] | None = None) -> Any:
    shape, dtype, sharding = _target_spec(t)
    if leaf.kind in (EMPTY, STRING):
        return item.read_values([leaf])[0]
    if leaf.kind == INLINE:
        host = np.asarray(leaf.value)
        return _put_whole(leaf, host, shape, dtype, sharding)
    param = item.data_param(leaf)
    meta = item.reader.metadata(param)
    stored_shape = tuple(meta.shape)
    if leaf.kind == SCALAR and stored_shape != shape and int(np.prod(stored_shape)) == int(np.prod(shape)) == 1:
        host = item.reader.read(param).reshape(shape)
        return _put_whole(leaf, host, shape, dtype, sharding)
    if _is_key_dtype(dtype):
        return _restore_key(item, leaf, param, t)
    if stored_shape != shape:
        raise ValueError(
            f"leaf {leaf.param_name!r} is stored with shape {stored_shape} but the target asks for {shape}"
        )
    if sharding is None:
        whole = (hosts or {}).get(param)
        if whole is None:
            whole = item.reader.read(param)
        return jax.device_put(_cast(whole, dtype))
    assert leaf.kind in (ARRAY, SCALAR)
    idx_map = sharding.addressable_devices_indices_map(shape)
    groups: dict[tuple[tuple[int, int], ...], list[Any]] = {}
    index_of: dict[tuple[tuple[int, int], ...], tuple[slice, ...]] = {}
    for device, index in idx_map.items():
        index = tuple(index) if index is not None else ()
        index = index + (slice(None),) * (len(shape) - len(index))
        k = _index_key(index, shape)
        groups.setdefault(k, []).append(device)
        index_of[k] = tuple(slice(a, b) for a, b in k)

    cached = (hosts or {}).get(param)

    def read(k: tuple[tuple[int, int], ...]) -> np.ndarray:
        if cached is not None:
            return _cast(np.array(cached[index_of[k] + (Ellipsis,)]), dtype)  # a copy, 0-d stays 0-d
        return _cast(item.reader.read(param, index_of[k]), dtype)

    keys = list(groups)
    regions = map_concurrently(read, keys, purpose="read")
    shards = []
    for k, region in zip(keys, regions):
        for device in groups[k]:
            shards.append(jax.device_put(region, device))
    return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def _cast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return a if a.dtype == dtype else a.astype(dtype)


def _put_whole(leaf: Leaf, host: np.ndarray, shape: tuple[int, ...], dtype: Any, sharding: Any) -> Any:
    if host.shape != shape:
        raise ValueError(f"leaf {leaf.param_name!r} has shape {host.shape} but the target asks for {shape}")
    host = _cast(host, dtype)
    return jax.device_put(host, sharding) if sharding is not None else jax.device_put(host)


def _restore_key(item: PyTreeItem, leaf: Leaf, param: str, t: Any) -> Any:
    data = jax.numpy.asarray(item.reader.read(param))
    impl = item.array_metadatas().get(param, {}).get("ext_metadata") or {}
    name = impl.get("random_key_impl") if isinstance(impl, dict) else None
    try:
        key = jax.random.wrap_key_data(data, impl=name or jax.random.key_impl(t))
    except (TypeError, AttributeError):
        key = jax.random.wrap_key_data(data)
    sharding = getattr(t, "sharding", None)
    return jax.device_put(key, sharding) if sharding is not None else key
