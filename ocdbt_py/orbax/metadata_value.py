"""``ocp.metadata.value``: what Orbax's ``metadata()`` gives per leaf.

``ArrayMetadata`` (arrays: shape, dtype, sharding, how they are stored), ``ScalarMetadata``
(scalars saved as scalars), ``StringMetadata`` (strings) and their base ``Metadata``, with
the fields, equality and printed form of Orbax's classes.  Equality is what restore code
compares: two ``ArrayMetadata`` are equal when shape, sharding, dtype and storage are (name
and directory do not count); two ``ScalarMetadata`` when their dtypes are; any two
``StringMetadata`` are equal.  No JAX import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Metadata", "StorageMetadata", "ArrayMetadata", "ScalarMetadata", "StringMetadata"]


@dataclasses.dataclass
class Metadata:
    """A stored leaf: its ``name`` (the dotted key path) and the ``directory`` of its item."""

    name: str
    directory: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Metadata)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value, as Orbax's

    def __repr__(self) -> str:
        return f"{type(self).__name__} :  name={self.name},  directory={self.directory},"


@dataclasses.dataclass(frozen=True)
class StorageMetadata:
    """How an array is stored: ``chunk_shape`` (one stored chunk) and ``write_shape`` (the
    shape each replica wrote, when recorded)."""

    chunk_shape: tuple[int, ...] | None
    write_shape: tuple[int, ...] | None = None
    zarr_metadata: Any = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass
class ArrayMetadata(Metadata):
    """An array leaf: ``shape``, ``sharding`` (a ``ShardingMetadata`` of the saved sharding,
    ``None`` for arrays saved from NumPy), ``dtype`` and ``storage``."""

    shape: tuple[int, ...]
    sharding: Any
    dtype: Any
    storage: StorageMetadata | None = None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ArrayMetadata) and self.shape == other.shape and self.sharding == other.sharding
                and self.dtype == other.dtype and self.storage == other.storage)

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def from_shape_dtype_struct(cls, s: Any, name: str | None = None, directory: Any = None) -> ArrayMetadata:
        """The metadata a ``jax.ShapeDtypeStruct`` (or anything with ``shape``, ``dtype`` and
        ``sharding``) describes."""
        return cls(name=name or "", directory=directory, shape=tuple(s.shape), sharding=getattr(s, "sharding", None),
                   dtype=s.dtype)

    def __repr__(self) -> str:
        return (super().__repr__() + f"  shape={self.shape},  sharding={self.sharding},  dtype={self.dtype},"
                f"  storage={self.storage},")


@dataclasses.dataclass(eq=False)
class ScalarMetadata(ArrayMetadata):
    """A scalar saved as a scalar (Python ``int``/``float``, NumPy scalars in PyTree saves)."""

    shape: tuple[int, ...] = ()
    sharding: Any = None
    dtype: Any = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScalarMetadata) and self.dtype == other.dtype

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass(eq=False)
class StringMetadata(Metadata):
    """A string leaf."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StringMetadata)

    __hash__ = None  # type: ignore[assignment]
