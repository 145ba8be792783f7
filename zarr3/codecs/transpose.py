"""The ``transpose`` array -> array codec.

``order`` is a permutation: encoded dimension ``i`` is decoded dimension ``order[i]``.
``"C"`` (identity) and ``"F"`` (reversed) are accepted on input and written as lists, as
TensorStore does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zarr3.codecs.base import ArrayArrayCodec, ChunkSpec, check_config
from zarr3.errors import MetadataError

__all__ = ["TransposeCodec"]


class TransposeCodec(ArrayArrayCodec):
    """Permute the dimensions of a chunk."""

    name = "transpose"

    def __init__(self, order: Sequence[int] | str):
        self.order: tuple[int, ...] | str = order if isinstance(order, str) else tuple(order)

    @classmethod
    def from_config(cls, config: Any, field: str) -> TransposeCodec:
        cfg = check_config(config, ("order",), field, required=("order",))
        order = cfg["order"]
        if isinstance(order, str):
            if order not in ("C", "F"):
                raise MetadataError(f"{field}.order", order, 'expected "C", "F" or a permutation')
            return cls(order)
        if not isinstance(order, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
            raise MetadataError(f"{field}.order", order, "expected a list of dimension indices")
        if sorted(order) != list(range(len(order))):
            raise MetadataError(f"{field}.order", order, "not a permutation")
        return cls(order)

    def configuration(self) -> dict[str, Any]:
        return {"order": list(self.order) if not isinstance(self.order, str) else self.order}

    def resolve(self, spec: ChunkSpec, field: str) -> TransposeCodec:
        n = len(spec.shape)
        if self.order == "C":
            return TransposeCodec(range(n))
        if self.order == "F":
            return TransposeCodec(range(n - 1, -1, -1))
        if len(self.order) != n:
            raise MetadataError(
                f"{field}.configuration.order", list(self.order), f"expected a permutation of {n} dimensions"
            )
        return self

    @property
    def perm(self) -> tuple[int, ...]:
        """The resolved permutation."""
        assert not isinstance(self.order, str), "resolve() first"
        return self.order

    @property
    def inverse(self) -> tuple[int, ...]:
        """The inverse permutation."""
        inv = [0] * len(self.perm)
        for i, p in enumerate(self.perm):
            inv[p] = i
        return tuple(inv)

    def encoded_spec(self, spec: ChunkSpec) -> ChunkSpec:
        return spec.with_shape([spec.shape[p] for p in self.perm])

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> np.ndarray:
        return arr.transpose(self.perm)

    def decode(self, arr: np.ndarray, spec: ChunkSpec) -> np.ndarray:
        return arr.transpose(self.inverse)
