"""Per-leaf save and restore arguments: ``SaveArgs``, ``RestoreArgs``, ``ArrayRestoreArgs``.

Orbax's fields and defaults.  ``SaveArgs.chunk_byte_size`` becomes the array's own chunk byte
limit (``leaf_chunk_byte_sizes`` of :func:`ocdbt_py.checkpoint.save`) and ``SaveArgs.dtype``
casts the leaf before it is written; ``aggregate=True`` (msgpack aggregation, removed from
Orbax's writer) is refused.  No JAX import: shardings are whatever object the caller passes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ocdbt_py.errors import UnsupportedError

__all__ = ["SaveArgs", "RestoreArgs", "ArrayRestoreArgs", "SingleReplicaArrayRestoreArgs", "SingleReplicaArrayHandler",
           "register_type_handler", "PLACEHOLDER"]

#: A restore-target leaf that is not restored (it stays ``...``).
PLACEHOLDER = ...


@dataclasses.dataclass
class SaveArgs:
    """How one leaf is saved: ``dtype`` to cast to, ``chunk_byte_size`` for its chunks."""

    aggregate: bool = False
    dtype: Any = None
    chunk_byte_size: int | None = None
    shard_axes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.aggregate:
            raise UnsupportedError("SaveArgs(aggregate=True) (msgpack aggregation) is not supported; "
                                   "Orbax itself no longer writes it")


@dataclasses.dataclass
class RestoreArgs:
    """How one leaf is restored: ``restore_type`` (``np.ndarray``, ``int``, ...) and ``dtype``."""

    restore_type: Any = None
    dtype: Any = None


@dataclasses.dataclass
class ArrayRestoreArgs(RestoreArgs):
    """A leaf restored as a ``jax.Array`` with ``sharding`` (or ``mesh`` + ``mesh_axes``) and
    ``global_shape``; ``strict=False`` allows a different shape (padded or truncated)."""

    restore_type: Any = "jax.Array"
    mesh: Any = None
    mesh_axes: Any = None
    sharding: Any = None
    global_shape: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None
    strict: bool = True
    single_replica_sharding: Any = None

    def __post_init__(self) -> None:
        if self.shape is not None and self.global_shape is None:
            self.global_shape = self.shape
        elif self.global_shape is not None and self.shape is None:
            self.shape = self.global_shape


@dataclasses.dataclass
class SingleReplicaArrayRestoreArgs(ArrayRestoreArgs):
    """Orbax's single-replica restore arguments (MaxText): restored as ``ArrayRestoreArgs``
    with ``sharding`` -- ocdbt_py already reads only the chunks each process's devices need, so
    there is no replica-0 read and broadcast to ask for."""

    replica_axis_index: int | None = 0
    primary_replica_id: int | None = 0
    broadcast_memory_limit_bytes: int | None = None
    broadcast_memory_scaling_factor: float | None = 0.75


class SingleReplicaArrayHandler:
    """Orbax's single-replica array type handler, accepted so that scripts registering it run
    (see :class:`SingleReplicaArrayRestoreArgs`)."""

    def __init__(self, replica_axis_index: int | None = 0, primary_replica_id: int | None = 0,
                 broadcast_memory_limit_bytes: int | None = None, broadcast_memory_scaling_factor: float | None = 0.75,
                 **ignored: Any):
        self.replica_axis_index = replica_axis_index
        self.primary_replica_id = primary_replica_id


def register_type_handler(ty: Any, handler: Any, func: Any = None, override: bool = False) -> None:
    """Accepted for Orbax's built-in handler kinds (``SingleReplicaArrayHandler``): ocdbt_py has
    one fixed set of leaf types, so there is nothing to register.  Any other handler is an
    ``UnsupportedError`` (its bytes would not be written)."""
    if not isinstance(handler, SingleReplicaArrayHandler):
        raise UnsupportedError(f"register_type_handler({ty!r}, {type(handler).__name__}): custom type handlers are "
                               "not supported (ocdbt_py writes one fixed set of leaf types)")
