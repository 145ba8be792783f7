"""``bridges.to_dask``: a checkpoint's tree with every array a lazy ``dask.array.Array``.

Blocks follow the stored chunks (merged up to a target size, whole chunks only), and each
task carries the checkpoint's URL, storage options, item, step and the leaf's path, never an
open handle: a worker process opens the checkpoint once (cached) and reads only the chunks of
its block.  So a graph over a 400B-parameter checkpoint runs on ``dask.distributed`` workers,
reading only what is computed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.restore.api import PathLike, resolve, restore
from ocdbt_py.checkpoint.restore.reader import LazyArray
from ocdbt_py.errors import MissingDependencyError
from ocdbt_py.kvstore import KvStore
from zarr3.engine.dask_blocks import DEFAULT_BLOCK_BYTES, block_array, merged_chunks

__all__ = ["to_dask", "CheckpointSource"]


@dataclasses.dataclass(frozen=True)
class CheckpointSource:
    """What a task needs to reopen a checkpoint: URL, JSON of the options, item, step."""

    url: str
    options_json: str
    item: str | None
    step: int | None


@functools.lru_cache(maxsize=16)
def _open(src: CheckpointSource) -> Any:
    """The lazily restored tree of a checkpoint, once per worker process."""
    opts = json.loads(src.options_json) or None
    return restore(src.url, item=src.item, step=src.step, storage_options=opts, lazy=True)


def _leaf(tree: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def read_block(where: tuple[CheckpointSource, tuple[Any, ...]], sel: tuple[slice, ...]) -> np.ndarray:
    """A task: read one block of one array of a checkpoint."""
    src, path = where
    return np.asarray(_leaf(_open(src), path)[sel])


def _replace(tree: Any, fn: Any, path: tuple[Any, ...] = ()) -> Any:
    if isinstance(tree, dict):
        return {k: _replace(v, fn, path + (k,)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_replace(v, fn, path + (i,)) for i, v in enumerate(tree)]
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return tuple(_replace(v, fn, path + (i,)) for i, v in enumerate(tree))
    return fn(path, tree)


def _url(path: PathLike) -> str:
    if isinstance(path, KvStore):
        raise TypeError("to_dask needs a path or URL that worker processes can open, not a KvStore object")
    p = os.fspath(path)
    if "://" not in p and "::" not in p:
        p = os.path.abspath(p)
    return p


def to_dask(
    path: PathLike,
    item: str | None = None,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Any:
    """The checkpoint's tree (as :func:`~ocdbt_py.checkpoint.restore` returns it) with every
    array a ``dask.array.Array``; scalars and strings stay as they are.

    ``path``/``item``/``step``/``storage_options`` are as for ``restore`` (a manager root's
    latest step is fixed now, so every worker reads the same step).  Blocks are whole stored
    chunks merged up to ``block_bytes`` (default 128 MiB).  Needs ``dask``
    (``pip install 'ocdbt-py[dask]'``; without it :class:`~ocdbt_py.errors.MissingDependencyError`);
    the options must be JSON-serialisable (they travel with the tasks).
    """
    MissingDependencyError.require("dask.array", "dask", "to_dask()")
    import dask.base  # optional: only dask users pay for it

    url = _url(path)
    if step is None:
        step = resolve(url, storage_options=storage_options).step  # pin "latest" for every worker
    src = CheckpointSource(url, json.dumps(storage_options or {}, sort_keys=True), item, step)
    tree = _open(src)

    def convert(p: tuple[Any, ...], leaf: Any) -> Any:
        if not isinstance(leaf, LazyArray):
            return leaf
        chunks = merged_chunks(leaf.shape, leaf.chunks, leaf.dtype.itemsize, block_bytes)
        name = f"ocdbt-{dask.base.tokenize(src, p, chunks)}"
        return block_array(name, leaf.shape, leaf.dtype, chunks, read_block, (src, p))

    return _replace(tree, convert)
