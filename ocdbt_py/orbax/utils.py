"""``ocp.utils``: the helpers scripts call (``to_shape_dtype_struct``, step listings)."""

from __future__ import annotations

import os

from ocdbt_py.orbax.tree import from_flat_dict, to_flat_dict, to_shape_dtype_struct

__all__ = ["to_shape_dtype_struct", "to_flat_dict", "from_flat_dict", "checkpoint_steps", "is_primary_host"]


def checkpoint_steps(checkpoint_dir: str | os.PathLike[str], single_host_load_and_broadcast: bool = False) -> list[int]:
    """The committed steps under a manager root."""
    from ocdbt_py.checkpoint.meta import list_steps

    return [s.step for s in list_steps(checkpoint_dir)]


def is_primary_host(primary_host: int | None = 0) -> bool:
    """Whether this process is the primary host (always true without a JAX job)."""
    import sys

    if primary_host is None:
        return True
    if "jax" not in sys.modules:
        return primary_host == 0
    import jax

    return bool(jax.process_index() == primary_host)


