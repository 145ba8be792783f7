"""``ocp.utils``: the helpers scripts call (``to_shape_dtype_struct``, step listings,
process helpers)."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from ocdbt_py.checkpoint.layout import COMMIT_MARKER
from ocdbt_py.checkpoint.meta import list_steps
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.orbax.tree import from_flat_dict, to_flat_dict, to_shape_dtype_struct

__all__ = ["to_shape_dtype_struct", "to_flat_dict", "from_flat_dict", "checkpoint_steps", "checkpoint_steps_paths",
           "any_checkpoint_step", "step_from_checkpoint_name", "is_checkpoint_finalized", "is_tmp_checkpoint",
           "is_primary_host", "reached_preemption", "sync_global_processes", "TMP_DIR_SUFFIX"]

TMP_DIR_SUFFIX = ".orbax-checkpoint-tmp"


def checkpoint_steps(checkpoint_dir: str | os.PathLike[str], single_host_load_and_broadcast: bool = False) -> list[int]:
    """The finalized steps under a manager root, oldest first."""
    return [s.step for s in list_steps(checkpoint_dir)]


def checkpoint_steps_paths(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """The finalized step directories under a manager root."""
    root = os.fspath(checkpoint_dir).rstrip("/")
    return [f"{root}/{s.name}" for s in list_steps(checkpoint_dir)]


def any_checkpoint_step(checkpoint_dir: str | os.PathLike[str]) -> int | None:
    """Some finalized step, or ``None``."""
    steps = checkpoint_steps(checkpoint_dir)
    return steps[-1] if steps else None


def step_from_checkpoint_name(name: str) -> int:
    """The step of a step directory name (``42``, ``ckpt_42``, ``000042``)."""
    if name.isdigit():
        return int(name)
    m = re.fullmatch(r"(.+)_(\d+)", name)
    if m is None:
        raise ValueError(f"Unrecognized name format: {name}.")
    return int(m.group(2))


def is_tmp_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a temporary (unfinished) checkpoint directory."""
    return TMP_DIR_SUFFIX in os.path.basename(os.fspath(path).rstrip("/"))


def is_checkpoint_finalized(path: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint at ``path`` is committed."""
    if is_tmp_checkpoint(path):
        return False
    kv = open_kvstore(path, read_only=True)
    return kv.exists(COMMIT_MARKER) or kv.exists("_CHECKPOINT_METADATA")


def is_primary_host(primary_host: int | None = 0) -> bool:
    """Whether this process is the primary host (always true without a JAX job)."""
    if primary_host is None:
        return True
    if "jax" not in sys.modules:
        return primary_host == 0
    import jax  # loaded already (checked above)

    return bool(jax.process_index() == primary_host)


def reached_preemption(step: int) -> bool:
    """Whether JAX's preemption sync point is reached (``False`` outside multi-process jobs)."""
    if "jax" not in sys.modules:
        return False
    import jax  # loaded already (checked above)

    if jax.process_count() <= 1:
        return False
    from jax.experimental import multihost_utils  # JAX's preemption sync point

    return bool(multihost_utils.reached_preemption_sync_point(step))


def sync_global_processes(name: str, *args: Any, **kwargs: Any) -> None:
    """A barrier across the processes of a JAX job (nothing to do in one process)."""
    if "jax" not in sys.modules:
        return
    import jax  # loaded already (checked above)

    if jax.process_count() <= 1:
        return
    from jax.experimental import multihost_utils  # JAX's barrier

    multihost_utils.sync_global_devices(name)
