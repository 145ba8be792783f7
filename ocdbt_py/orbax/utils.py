"""``ocp.utils``: the helpers scripts call (``to_shape_dtype_struct``, step listings,
process helpers, ``fully_replicated_host_local_array_to_global_array``)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ocdbt_py.orbax.path.step import (
    TMP_DIR_SUFFIX,
    all_temporary_paths,
    any_checkpoint_step,
    checkpoint_steps,
    checkpoint_steps_paths,
    get_save_directory,
    is_path_finalized,
    is_path_temporary,
    step_from_checkpoint_name,
)
from ocdbt_py.orbax.tree import from_flat_dict, to_flat_dict, to_shape_dtype_struct

__all__ = ["to_shape_dtype_struct", "to_flat_dict", "from_flat_dict", "checkpoint_steps", "checkpoint_steps_paths",
           "any_checkpoint_step", "step_from_checkpoint_name", "is_checkpoint_finalized", "is_tmp_checkpoint",
           "tmp_checkpoints", "get_save_directory", "is_primary_host", "reached_preemption", "sync_global_processes",
           "sync_global_devices", "is_pathways_backend", "is_scalar",
           "fully_replicated_host_local_array_to_global_array", "TMP_DIR_SUFFIX"]

is_checkpoint_finalized = is_path_finalized
is_tmp_checkpoint = is_path_temporary
tmp_checkpoints = all_temporary_paths


def is_primary_host(primary_host: int | None = 0) -> bool:
    """Whether this process is the primary host (always true without a JAX job)."""
    if primary_host is None:
        return True
    if "jax" not in sys.modules:
        return primary_host == 0
    import jax  # loaded already (checked above)

    return bool(jax.process_index() == primary_host)


def reached_preemption(step: int) -> bool:
    """Whether JAX's preemption sync point is reached (as Orbax asks it: ``False`` without
    ``jax.distributed`` or with JAX's preemption service disabled)."""
    if "jax" not in sys.modules:
        return False
    from jax.experimental import multihost_utils  # JAX's preemption sync point (JAX is loaded)

    try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError:  # the preemption service is disabled
        return False


def sync_global_processes(name: str, *args: Any, **kwargs: Any) -> None:
    """A barrier across the processes of a JAX job (nothing to do in one process)."""
    if "jax" not in sys.modules:
        return
    import jax  # loaded already (checked above)

    if jax.process_count() <= 1:
        return
    from jax.experimental import multihost_utils  # JAX's barrier

    multihost_utils.sync_global_devices(name)


sync_global_devices = sync_global_processes


def is_pathways_backend() -> bool:
    """Whether JAX runs on Pathways (native or proxy); ``False`` without JAX loaded."""
    if "jax" not in sys.modules:
        return False
    import jax  # loaded already (checked above)

    client = jax.devices()[0].client
    return hasattr(client, "pathways") or getattr(client, "runtime_type", "") in ("pathways", "proxy/pathways")


def is_scalar(x: Any) -> bool:
    """Whether ``x`` is a Python or NumPy number (as Orbax decides what is a scalar leaf)."""
    return isinstance(x, (int, float, np.number))


def fully_replicated_host_local_array_to_global_array(arr: Any) -> Any:
    """A global ``jax.Array`` from a fully replicated host-local one (e.g. from ``pmap``),
    replicated over all devices on a 1-D mesh; a leading per-device axis is dropped."""
    import jax  # the argument is a jax.Array: JAX is loaded

    global_shape = arr.addressable_data(0).shape
    mesh = jax.sharding.Mesh(np.array(jax.devices()), axis_names=("x",))
    spec = jax.sharding.PartitionSpec(None) if global_shape else jax.sharding.PartitionSpec()
    buffers = sorted((s.data for s in arr.addressable_shards), key=lambda d: next(iter(d.devices())).id)
    if global_shape != arr.shape:
        buffers = [b[0] for b in buffers]
        global_shape = global_shape[1:]
    return jax.make_array_from_single_device_arrays(global_shape, jax.sharding.NamedSharding(mesh, spec), buffers)
