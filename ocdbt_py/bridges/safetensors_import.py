"""safetensors -> Orbax checkpoint, streamed tensor by tensor.

The source is a ``.safetensors`` file, a sharded ``*.safetensors.index.json``, or a directory
holding either, at a local path or any fsspec URL.  Headers are parsed here with limits
(:mod:`ocdbt_py.bridges.safetensors_format`); each tensor is read (in ranged pieces, into
its own buffer) only when the writer is ready for it, and tensors are written in groups of
about :data:`GROUP_BYTES` (a larger tensor alone), so peak memory is about one tensor (plus
the encoder's buffers), whatever the model size.  Dotted names become nested dicts
(``model.layers.0.w`` -> ``{"model": {"layers": {"0": {"w": ...}}}}``), so Orbax stores each
tensor under its original name; bfloat16 and float8 are kept as they are.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ocdbt_py.bridges.safetensors_format import (
    MAX_INDEX_BYTES,
    Header,
    TensorInfo,
    parse_header,
    parse_index,
)
from ocdbt_py.checkpoint.layout import param_dir_problem
from ocdbt_py.checkpoint.saving import api as _save
from ocdbt_py.checkpoint.saving.atomic import open_destination
from ocdbt_py.checkpoint.saving.distributed import coordinator
from ocdbt_py.checkpoint.saving.process_writer import ChunkJob, ProcessWriter
from ocdbt_py.errors import CorruptionError, NotFoundError
from ocdbt_py.kvstore import KvStore, open_kvstore

__all__ = ["import_safetensors", "SourceTensor", "list_source", "read_header"]

#: First read of a file: most headers fit, so one request gets header and size checks going.
_FIRST_READ = 1 << 16


@dataclasses.dataclass(frozen=True, slots=True)
class SourceTensor:
    """A tensor of the source: which file of the source directory, and where in it."""

    file: str
    info: TensorInfo


def _split(src: str) -> tuple[str, str | None]:
    """``(directory URL, file name or None)``."""
    if src.endswith((".safetensors", ".json")):
        base, sep, name = src.rstrip("/").rpartition("/")
        if not sep:
            return ".", name
        return (base or "/"), name
    return src, None


def read_header(kv: KvStore, name: str) -> Header:
    """Parse the header of the safetensors file ``name`` in ``kv`` (at most two small reads)."""
    size = kv.size(name)
    if size is None:
        raise NotFoundError(f"{kv.url.rstrip('/')}/{name} does not exist")
    where = f"{kv.url.rstrip('/')}/{name}"
    head = kv.get(name, (0, min(size, _FIRST_READ))) or b""
    while True:
        got = parse_header(head, size, where)
        if isinstance(got, Header):
            return got
        head = kv.get(name, (0, got)) or b""
        if len(head) < got:
            raise CorruptionError(f"{where} changed while being read (got {len(head)} of {got} header bytes)")


def _from_files(kv: KvStore, files: list[str]) -> list[SourceTensor]:
    out: list[SourceTensor] = []
    seen: dict[str, str] = {}
    for f in files:
        for t in read_header(kv, f).tensors:
            if t.name in seen:
                raise CorruptionError(f"tensor {t.name!r} is in both {seen[t.name]} and {f} of {kv.url}")
            seen[t.name] = f
            out.append(SourceTensor(f, t))
    return out


def _from_index(kv: KvStore, index: str) -> list[SourceTensor]:
    raw = kv.get(index, (0, MAX_INDEX_BYTES + 1))
    if raw is None:
        raise NotFoundError(f"{kv.url.rstrip('/')}/{index} does not exist")
    weight_map = parse_index(raw, f"{kv.url.rstrip('/')}/{index}")
    files = sorted(set(weight_map.values()))
    by_name = {t.info.name: t for t in _from_files(kv, files)}
    out: list[SourceTensor] = []
    for name, f in weight_map.items():
        t = by_name.get(name)
        if t is None or t.file != f:
            raise CorruptionError(f"{index} of {kv.url} puts tensor {name!r} in {f}, which does not hold it")
        out.append(t)
    return out


def list_source(src: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
                ) -> tuple[KvStore, list[SourceTensor]]:
    """The store of the source directory and every tensor of the source, shard by shard."""
    base, name = _split(os.fspath(src))
    kv = open_kvstore(base, storage_options, read_only=True)
    if name is not None:
        return kv, (_from_index(kv, name) if name.endswith(".json") else _from_files(kv, [name]))
    _, files = kv.list_dir("")
    indexes = sorted(f for f in files if f.endswith(".safetensors.index.json"))
    if len(indexes) > 1:
        raise ValueError(f"{kv.url} holds several indexes ({', '.join(indexes)}); name one of them")
    if indexes:
        return kv, _from_index(kv, indexes[0])
    shards = sorted(f for f in files if f.endswith(".safetensors"))
    if not shards:
        raise NotFoundError(f"{kv.url} holds no .safetensors file and no *.safetensors.index.json")
    return kv, _from_files(kv, shards)


def _nest(names: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in names.items():
        parts = name.split(".")
        if any(p == "" for p in parts):
            raise ValueError(f"tensor name {name!r} has an empty part between dots; rename it (--map)")
        node = tree
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"tensor {name!r} would nest inside tensor {'.'.join(parts[:parts.index(p) + 1])!r}")
            node = nxt
        if parts[-1] in node:
            raise ValueError(f"tensor {name!r} collides with another tensor or a group of that name")
        node[parts[-1]] = value
    return tree


#: Tensors are written in groups of about this many bytes (a larger tensor alone), each group
#: finished before the next is read: memory stays near one tensor whatever the worker count.
GROUP_BYTES = 32 << 20
#: A tensor is read in ranged reads of this size, four at a time, into its own buffer (no
#: second full copy; at most four pieces are in memory besides it).
READ_PIECE = 4 << 20


def _loader(kv: KvStore, by_param: Mapping[str, SourceTensor],
            progress: Callable[[int, int], None] | None = None) -> Callable[[str], np.ndarray]:
    total = sum(t.info.nbytes for t in by_param.values())
    done = [0]

    def load(param: str) -> np.ndarray:
        out = _load(param)
        if progress is not None:
            done[0] += out.nbytes
            progress(done[0], total)
        return out

    def _load(param: str) -> np.ndarray:
        t = by_param[param]
        where = f"{kv.url.rstrip('/')}/{t.file}"
        out = np.empty(t.info.nbytes, dtype=np.uint8)
        spans = [(a, min(a + READ_PIECE, t.info.stop)) for a in range(t.info.start, t.info.stop, READ_PIECE)]
        for i in range(0, len(spans), 4):  # a few ranges at once, each copied in and dropped
            batch = spans[i:i + 4]
            for (a, b), data in zip(batch, kv.get_many([(t.file, r) for r in batch])):
                if data is None or len(data) != b - a:
                    raise CorruptionError(f"{where}: tensor {t.info.name!r} was cut short (file changed?)")
                out[a - t.info.start:b - t.info.start] = np.frombuffer(data, dtype=np.uint8)
        return out.view(t.info.dtype).reshape(t.info.shape)

    return load


def _write_streamed(item_kv: KvStore, plan: Any, opts: Any, load: Callable[[str], np.ndarray]) -> Any:
    """This item's chunks, tensor groups written one after the other (see :data:`GROUP_BYTES`)."""
    writer = ProcessWriter(item_kv, 0, target_data_file_size=opts.target_data_file_size, sync=opts.sync)

    def loaded(group: list[ChunkJob]) -> Iterator[ChunkJob]:
        for spec, origin, _ in group:
            yield spec, origin, load(spec.param)

    try:
        for spec in plan.metadata_specs:
            writer.put(spec.metadata_key, spec.metadata_bytes())
        group: list[ChunkJob] = []
        size = 0
        for job in plan.jobs:
            nbytes = math.prod(job[0].shape) * job[0].dtype.itemsize
            if group and size + nbytes > GROUP_BYTES:
                writer.run(writer.tasks(loaded(group)), opts.workers)
                group, size = [], 0
            group.append(job)
            size += nbytes
        if group:
            writer.run(writer.tasks(loaded(group)), opts.workers)
    except BaseException:
        writer.pool.abort()
        raise
    writer.finish()
    return writer.entries or None


def import_safetensors(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | KvStore,
    *,
    rename: Callable[[str], str | None] | Mapping[str, str | None] | None = None,
    use_zarr3: bool = False,
    chunk_byte_size: int | None = None,
    use_compression: bool = True,
    force: bool = False,
    storage_options: dict[str, Any] | None = None,
    dst_storage_options: dict[str, Any] | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Write the tensors of a safetensors source into a new Orbax checkpoint at ``dst``.

    ``src``: a ``.safetensors`` file, a ``*.safetensors.index.json``, or a directory holding
    either (local path or fsspec URL, with ``storage_options``).  ``dst``: the checkpoint
    (item) directory, local path or fsspec URL (``dst_storage_options``); OCDBT with Zarr v2
    chunks by default, ``use_zarr3=True`` for Zarr v3, ``chunk_byte_size`` as Orbax's
    ``SaveArgs``.  ``rename`` maps each name (dict, or a function returning the new name or
    ``None`` to skip the tensor; e.g. :class:`~ocdbt_py.bridges.namemap.NameMap`) before
    dotted names become nested dicts.  Zero-size tensors cannot be stored by Orbax: leave them
    out with ``rename``.  ``progress(done_bytes, total_bytes)`` is called as tensors are read.
    Returns the names written, in the order of the nested tree.
    """
    _save.async_save.wait_for_previous()
    kv, tensors = list_source(src, storage_options)
    named: dict[str, SourceTensor] = {}
    for t in tensors:
        new = t.info.name if rename is None else (rename(t.info.name) if callable(rename)
                                                   else rename.get(t.info.name, t.info.name))
        if new is None:
            continue
        problem = param_dir_problem(new)
        if problem is not None:  # it would import into OCDBT but could never be copied to directories
            shown = repr(t.info.name) + ("" if new == t.info.name else f" (renamed {new!r})")
            raise ValueError(f"tensor {shown}: the name {problem}; rename it (rename= / --map) or leave it out")
        if new in named:
            raise ValueError(f"two tensors would be named {new!r} ({named[new].info.name!r} and {t.info.name!r})")
        if 0 in t.info.shape:
            raise ValueError(f"tensor {t.info.name!r} has zero size {t.info.shape}, which Orbax cannot store; "
                             f"leave it out (rename= returning None / --map with null)")
        named[new] = t
    if not named:
        raise ValueError(f"{src} has no tensors to import (after renames)")
    # placeholders: right shape and dtype, no memory (zero strides); the data is read in _LazyJobs
    tree = _nest({n: np.broadcast_to(np.zeros((), t.info.dtype), t.info.shape) for n, t in named.items()})
    coord = coordinator(force_single=True)
    opts = _save.make_options(dst, use_zarr3=use_zarr3, use_compression=use_compression,
                               chunk_byte_size=chunk_byte_size, leaf_chunk_byte_sizes=None,
                               ocdbt_target_data_file_size=None, replica_parallel=False, copy=False,
                               workers=workers, sync=True)
    # save()'s own planning and commit steps, with the data written here, streamed
    plan = _save.plan_item(name=None, tree=tree, coord=coord, opts=opts, handler=None, custom_metadata=None)
    load = _loader(kv, {leaf.param_name: named[leaf.param_name] for leaf in plan.leaves}, progress)
    dest = open_destination(dst, dst_storage_options)
    init_ns = time.time_ns()
    dest.prepare(force)  # the steps of save()'s single-process path, with a streamed middle
    root = dest.write_kv
    own = _write_streamed(root, plan, opts, load)
    if opts.sync:
        dest.sync()
    _save.commit_items(dest=dest, root=root, plans={"": plan}, coord=coord, opts=opts, composite=False,
                  custom_metadata=None, init_ns=init_ns, own={"": own})
    return [leaf.param_name for leaf in plan.leaves]
