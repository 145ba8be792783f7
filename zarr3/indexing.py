"""NumPy basic indexing over a chunk grid.

A selection (ints, slices with any non-zero step, ``...``, ``None``) is normalised to one
arithmetic progression per dimension.  Negative steps are read in ascending order into a
reversed view of the output, so chunks are always visited forwards.  :func:`dim_chunks`
splits one dimension's progression into the chunks it touches, visiting only those chunks.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DimSelection", "Selection", "normalize_selection", "dim_chunks", "ChunkDimSel"]


@dataclass(frozen=True)
class DimSelection:
    """Indices ``start + i*step`` for ``i < count`` (``step > 0``) along one dimension."""

    start: int
    step: int
    count: int
    reversed: bool = False  # the user asked for descending order
    squeeze: bool = False  # selected by an integer: the dimension is dropped


@dataclass(frozen=True)
class Selection:
    """A normalised basic-indexing selection."""

    dims: tuple[DimSelection, ...]
    result_shape: tuple[int, ...]  # shape NumPy would return

    @property
    def counts(self) -> tuple[int, ...]:
        """Number of selected indices per array dimension."""
        return tuple(d.count for d in self.dims)

    @property
    def flips(self) -> tuple[slice, ...]:
        """Slices turning an ascending-order buffer into the requested order."""
        return tuple(slice(None, None, -1) if d.reversed else slice(None) for d in self.dims)

    @property
    def is_full(self) -> bool:
        """Whether no dimension is reversed (ascending order is the result order)."""
        return not any(d.reversed for d in self.dims)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def normalize_selection(sel: Any, shape: Sequence[int]) -> Selection:
    """Normalise ``sel`` for an array of ``shape`` (NumPy basic indexing rules)."""
    if not isinstance(sel, tuple):
        sel = (sel,)
    n_ellipsis = sum(1 for s in sel if s is Ellipsis)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consuming = sum(1 for s in sel if s is not None and s is not Ellipsis)
    if consuming > len(shape):
        raise IndexError(f"too many indices for array: array is {len(shape)}-dimensional, but {consuming} were indexed")
    expanded: list[Any] = []
    for s in sel:
        if s is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - consuming))
        else:
            expanded.append(s)
    if n_ellipsis == 0:
        expanded.extend([slice(None)] * (len(shape) - consuming))
    dims: list[DimSelection] = []
    result: list[int] = []
    axis = 0
    for s in expanded:
        if s is None:
            result.append(1)
            continue
        n = shape[axis]
        if _is_int(s):
            i = operator.index(s)
            if i < -n or i >= n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            if i < 0:
                i += n
            dims.append(DimSelection(i, 1, 1, squeeze=True))
        elif isinstance(s, slice):
            for part in (s.start, s.stop, s.step):
                if part is not None and not _is_int(part):
                    raise IndexError(f"slice indices must be integers or None, got {s!r}")
            start, stop, step = s.indices(n)
            if step == 0:  # pragma: no cover - slice.indices raises already
                raise ValueError("slice step cannot be zero")
            count = len(range(start, stop, step))
            if step > 0:
                dims.append(DimSelection(start if count else 0, step, count))
            else:
                first = start + (count - 1) * step if count else 0
                dims.append(DimSelection(first, -step, count, reversed=count > 1))
            result.append(count)
        else:
            raise IndexError(
                "only integers, slices (`:`), ellipsis (`...`) and numpy.newaxis (`None`) are "
                f"valid indices; got {type(s).__name__}"
            )
        axis += 1
    return Selection(tuple(dims), tuple(result))


@dataclass(frozen=True)
class ChunkDimSel:
    """The part of one dimension's selection inside one chunk."""

    chunk: int  # chunk grid index
    local: slice  # positions inside the chunk
    out: slice  # positions in the (ascending) output
    covers: bool  # selects every in-bounds element of the chunk
    full: bool  # ... and the chunk lies entirely inside the array


def dim_chunks(ds: DimSelection, chunk: int, extent: int) -> list[ChunkDimSel]:
    """Split a dimension selection into per-chunk pieces, visiting only touched chunks."""
    out: list[ChunkDimSel] = []
    if ds.count == 0:
        return out
    s, k, n = ds.start, ds.step, ds.count
    last = s + (n - 1) * k
    first_chunk, last_chunk = s // chunk, last // chunk
    if last_chunk - first_chunk + 1 <= n:
        chunks: Any = range(first_chunk, last_chunk + 1)
    else:  # big steps: only the chunks that hold a selected index
        chunks = sorted({(s + i * k) // chunk for i in range(n)})
    for c in chunks:
        lo = c * chunk
        hi = lo + chunk
        i0 = max(0, -(-(lo - s) // k))
        i1 = min(n, -(-(hi - s) // k))
        if i0 >= i1:
            continue
        local_start = s + i0 * k - lo
        cnt = i1 - i0
        local_stop = local_start + (cnt - 1) * k + 1
        inb = min(chunk, extent - lo)
        covers = local_start == 0 and cnt == inb and (k == 1 or cnt == 1)
        out.append(ChunkDimSel(c, slice(local_start, local_stop, k), slice(i0, i1), covers, covers and inb == chunk))
    return out
