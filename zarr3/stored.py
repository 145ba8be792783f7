"""Which chunks of an array are stored, so that work on a sparse array is proportional to
what is stored, not to its declared chunk grid.

A selection touching at most :data:`DENSE_MAX` chunks is read chunk by chunk (a missing
chunk costs one failed lookup).  A larger one first lists the keys stored below the array
(one listing: a directory walk, a B+tree range, an object listing), reads only the chunks it
finds, writes the fill value over the rest of the output once, and, where every chunk must be
stored, names the first missing one before reading anything.  No Python object is made per
declared chunk: the listing's size is bounded by what is stored.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from ocdbt_py.kvstore import KvStore

__all__ = ["DENSE_MAX", "grid_shape", "stored_chunks", "first_missing", "use_listing"]

#: Selections touching more chunks than this are read from a listing of the stored chunks.
DENSE_MAX = 4096
#: ... when they are at least this share of the grid (a listing costs the stored chunks of
#: the whole array), or touch more than :data:`SPARSE_MIN` chunks whatever the grid.
LISTING_SHARE = 64
SPARSE_MIN = 1 << 18


def use_listing(selected: int, grid: int) -> bool:
    """Whether a read touching ``selected`` of an array's ``grid`` chunks should list the
    stored chunks first (rather than look each one up): large selections, unless they are a
    small part of a very large array (whose listing could cost far more than the lookups)."""
    return selected > DENSE_MAX and (grid <= LISTING_SHARE * selected or selected > SPARSE_MIN)


def grid_shape(shape: Sequence[int], chunks: Sequence[int]) -> tuple[int, ...]:
    """Chunks along each dimension."""
    return tuple(-(-s // c) if c else 0 for s, c in zip(shape, chunks))


def stored_chunks(store: KvStore, meta: Any, prefix: str = "") -> list[tuple[int, ...]]:
    """The grid positions (sorted, C order) of the chunks of ``meta`` stored below ``prefix``
    (``""`` or ``"<array>/"``) in ``store``: keys that are not chunk keys of the array, or lie
    outside its grid, are ignored."""
    grid = grid_shape(meta.shape, meta.chunk_shape)
    n = len(prefix)
    out = []
    for key in store.list(prefix):
        c = meta.chunk_coords(key[n:])
        if c is not None and all(i < g for i, g in zip(c, grid)):
            out.append(c)
    out.sort()
    return out


def first_missing(axes: Sequence[Sequence[int]], present: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The first position (C order) of the box ``axes`` (ascending chunk indices per dimension)
    that ``present`` (sorted positions inside the box, each once) lacks; ``None`` if none.
    Walks at most ``len(present) + 1`` positions."""
    if len(present) >= math.prod(len(a) for a in axes):
        return None
    for i, c in enumerate(itertools.product(*axes)):
        if i >= len(present) or present[i] != c:
            return c
    return None  # pragma: no cover - the count said one is missing
