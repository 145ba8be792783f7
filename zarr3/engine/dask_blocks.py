"""dask arrays over stored arrays: one task per block of whole stored chunks.

A block reads through a *source*: a small picklable, hashable description (a URL and
options, never an open handle) that each worker process turns into an array once and
caches (``zarr3.array.read_source_block``), so the graph runs on ``dask.distributed``
workers.  dask is imported only here, and only when a graph is built.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ocdbt_py.errors import MissingDependencyError

__all__ = ["merged_chunks", "block_array", "ArraySource", "DEFAULT_BLOCK_BYTES"]

#: Target bytes of one dask block (dask's own default ``array.chunk-size``).
DEFAULT_BLOCK_BYTES = 128 << 20


def merged_chunks(shape: Sequence[int], stored: Sequence[int], itemsize: int,
                  target_bytes: int = DEFAULT_BLOCK_BYTES) -> tuple[tuple[int, ...], ...]:
    """dask ``chunks``: the stored chunk grid with whole chunks merged up to ``target_bytes``
    per block (trailing axes first, so a block is as contiguous as the layout allows)."""
    block = [max(1, min(int(c) or int(s) or 1, int(s) or 1)) for c, s in zip(stored, shape)]
    for ax in reversed(range(len(shape))):
        have = math.prod(block) * max(1, itemsize)
        factor = max(1, target_bytes // max(1, have))
        if factor <= 1:
            break
        block[ax] = min(int(shape[ax]), block[ax] * factor)
    out = []
    for s, b in zip(shape, block):
        s = int(s)
        n, rem = divmod(s, b)
        out.append((b,) * n + ((rem,) if rem else ()) if s else (0,))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class ArraySource:
    """How a worker opens a zarr3 array: location, JSON of the storage options, path, format."""

    location: str
    options_json: str
    path: str
    zarr_format: int | None = None

    @classmethod
    def of(cls, location: str, storage_options: dict[str, Any] | None, path: str,
           zarr_format: int | None = None) -> ArraySource:
        """From plain arguments (the options must be JSON-serialisable)."""
        return cls(location, json.dumps(storage_options or {}, sort_keys=True), path, zarr_format)


def read_object_block(arr: Any, sel: tuple[slice, ...]) -> np.ndarray:
    """A task: read one block of an array object shipped with the graph."""
    return np.asarray(arr[sel])


def block_array(name: str, shape: Sequence[int], dtype: np.dtype, chunks: tuple[tuple[int, ...], ...],
                read: Callable[..., np.ndarray], source: Any) -> Any:
    """A ``dask.array.Array`` whose block ``i`` is ``read(source, slices_of_block_i)``."""
    MissingDependencyError.require("dask.array", "dask", "a dask array")
    import dask.array as da  # optional: only dask users pay for it
    from dask.highlevelgraph import HighLevelGraph

    starts = [np.cumsum((0,) + c[:-1]).tolist() for c in chunks]
    dsk: dict[Any, Any] = {}
    for idx in itertools.product(*(range(len(c)) for c in chunks)):
        sel = tuple(slice(starts[ax][i], starts[ax][i] + chunks[ax][i]) for ax, i in enumerate(idx))
        dsk[(name,) + tuple(idx)] = (read, source, sel)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, chunks, dtype=dtype, meta=np.empty((0,) * len(shape), dtype=dtype))
