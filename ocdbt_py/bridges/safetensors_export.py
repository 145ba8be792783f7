"""Checkpoint -> safetensors: one file, or Hugging Face's sharded layout, streamed.

Each tensor is read in slabs (:data:`ocdbt_py.checkpoint.export.SLAB_BYTES`, whole chunk rows)
and appended to its shard, the write of one slab overlapping the read of the next, so peak
memory is about two slabs (one tensor when it is a single chunk), not the model.  With
``max_shard_size`` the output is a directory holding ``model.safetensors`` when everything
fits, else ``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json``
(``{"metadata": {"total_size": n}, "weight_map": {name: file}}``), as
``transformers``' ``save_pretrained`` writes them.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from ocdbt_py import pools
from ocdbt_py.bridges.namemap import glob_matcher
from ocdbt_py.bridges.safetensors_format import build_header
from ocdbt_py.checkpoint import export as _export
from ocdbt_py.checkpoint.export import ExportedTensor, Rename, _le_bytes, _slabs, _write_to, plan, ticker
from ocdbt_py.checkpoint.restore.api import PathLike
from ocdbt_py.checkpoint.restore.item import INLINE
from ocdbt_py.units import parse_size

__all__ = ["export_safetensors", "INDEX_NAME", "SINGLE_NAME", "shard_file_name"]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def shard_file_name(i: int, n: int) -> str:
    """Hugging Face's shard file name (1-based ``i`` of ``n``)."""
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def _transposed_slabs(t: ExportedTensor) -> Iterator[np.ndarray]:
    """The tensor with its axes reversed (``.T``), in C order, in slabs along the source's last
    axis (whole chunk columns), so a transposed export streams too."""
    if t.leaf.kind == INLINE:
        a = np.asarray(t.leaf.value).reshape(t.shape[::-1]).T
        yield np.ascontiguousarray(a.astype(t.dtype, copy=False))
        return
    reader = t.item.reader
    src = t.shape[::-1]  # t.shape is the output (transposed) shape
    col_bytes = max(1, math.prod(src[:-1]) * max(t.stored_dtype.itemsize, t.dtype.itemsize))
    step = max(1, _export.SLAB_BYTES // col_bytes)
    c = reader.metadata(t.param).chunk_shape[-1] or 1
    step = step - step % c if step >= c else c
    for j in range(0, src[-1], step):
        a = reader.read(t.param, (Ellipsis, slice(j, min(j + step, src[-1]))))
        yield np.ascontiguousarray(a.transpose().astype(t.dtype, copy=False))


def _tensor_slabs(t: ExportedTensor, transposed: bool) -> Iterator[np.ndarray]:
    if transposed and len(t.shape) >= 2:
        return _transposed_slabs(t)
    return _slabs(t)


def _write_file(out: str | os.PathLike[str] | BinaryIO, tensors: list[ExportedTensor], transposed: set[str],
                metadata: Mapping[str, str] | None, tick: Callable[[int], None] = lambda n: None) -> None:
    head = build_header([(t.name, t.dtype, t.shape) for t in tensors], metadata)

    def body(f: BinaryIO) -> None:
        f.write(head)
        pending: concurrent.futures.Future[Any] | None = None
        try:
            for t in tensors:
                written = 0
                for slab in _tensor_slabs(t, t.name in transposed):
                    buf = _le_bytes(slab)
                    del slab
                    if pending is not None:
                        pending.result()  # at most one slab being written while the next is read
                    pending = pools.shared("io").submit(f.write, buf.data)
                    written += buf.nbytes
                    tick(buf.nbytes)
                    del buf  # the write task holds it until written
                if written != t.nbytes:
                    raise RuntimeError(f"tensor {t.name!r}: wrote {written} bytes, expected {t.nbytes}")
        finally:
            if pending is not None:
                pending.result()

    _write_to(out, body, len(head) + sum(t.nbytes for t in tensors))


def _shards(tensors: list[ExportedTensor], limit: int) -> list[list[ExportedTensor]]:
    """Hugging Face's split: in order, a new shard when the next tensor would pass ``limit``
    (a tensor larger than ``limit`` gets a shard of its own)."""
    shards: list[list[ExportedTensor]] = []
    cur: list[ExportedTensor] = []
    size = 0
    for t in tensors:
        if cur and size + t.nbytes > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += t.nbytes
    if cur or not shards:
        shards.append(cur)
    return shards


def export_safetensors(
    ckpt: PathLike,
    out: str | os.PathLike[str] | BinaryIO,
    *,
    dtype: Any = None,
    rename: Rename | None = None,
    item: str | None = None,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
    metadata: Mapping[str, str] | None = None,
    max_shard_size: int | str | None = None,
    transpose: Iterable[str] | Callable[[str], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Write every array of a checkpoint as safetensors, streaming; returns the tensor names.

    Tensors are named by their dotted path (``params.layer0.kernel``; items of a step directory
    get their item name in front).  ``dtype`` casts floating-point tensors (e.g.
    ``"bfloat16"``); ``rename`` maps names (a dict, or a function returning the new name or
    ``None`` to leave a tensor out, e.g. a :class:`~ocdbt_py.bridges.namemap.NameMap`).
    ``transpose`` (globs or a predicate on the checkpoint's names) reverses the axes of the
    matching tensors (``.T``: a Flax ``(in, out)`` kernel becomes PyTorch's ``(out, in)``).
    String leaves go into the header's ``__metadata__``.

    Without ``max_shard_size`` ``out`` is one ``.safetensors`` file (a path or a binary file
    object).  With it (bytes, or ``"5GB"``/``"300KB"``/``"2GiB"`` as Hugging Face writes
    them) ``out`` is a directory: ``model.safetensors`` when everything fits, else numbered
    shards and ``model.safetensors.index.json``; ``{"format": "pt"}`` is added to the
    metadata, as ``transformers`` expects.  Peak memory is about one slab of one tensor.
    ``progress(done_bytes, total_bytes)`` is called as slabs are written.
    """
    strings: dict[str, str] = {}
    tensors = plan(ckpt, dtype=dtype, rename=rename, item=item, step=step, storage_options=storage_options,
                   strings=strings)
    want_t = glob_matcher(transpose)
    transposed = {t.name for t in tensors if len(t.shape) >= 2 and want_t(t.source)}
    for t in tensors:
        if t.name in transposed:
            t.shape = t.shape[::-1]
    meta = {**strings, **dict(metadata or {})}
    tick = ticker(progress, sum(t.nbytes for t in tensors))
    if max_shard_size is None:
        _write_file(out, tensors, transposed, meta, tick)
        return [t.name for t in tensors]
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError("max_shard_size= writes a directory; pass its path as out")
    limit = parse_size(max_shard_size)
    meta = {"format": "pt", **meta}
    outdir = os.fspath(out)
    os.makedirs(outdir, exist_ok=True)
    shards = _shards(tensors, limit)
    if len(shards) == 1:
        _write_file(os.path.join(outdir, SINGLE_NAME), tensors, transposed, meta, tick)
        return [t.name for t in tensors]
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        fname = shard_file_name(i, len(shards))
        _write_file(os.path.join(outdir, fname), shard, transposed, meta, tick)
        weight_map.update((t.name, fname) for t in shard)
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)}, "weight_map": weight_map}
    raw = json.dumps(index, indent=2, sort_keys=True).encode("utf-8") + b"\n"

    def write_index(f: BinaryIO) -> None:
        f.write(raw)

    _write_to(os.path.join(outdir, INDEX_NAME), write_index)
    return [t.name for t in tensors]
