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

__all__ = ["SaveArgs", "RestoreArgs", "ArrayRestoreArgs", "PLACEHOLDER"]

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
