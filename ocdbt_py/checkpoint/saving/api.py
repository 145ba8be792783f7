"""``save()``: NumPy or JAX trees to Orbax checkpoints on any filesystem.

The work of one save, in order (``spec/orbax.md``, "Writing checkpoints"):

1. walk the tree(s) and plan every array: chunk shape, which regions this process writes
   (replica 0 of every addressable shard, replica-parallel slices of replicated shards),
   host copies when the save continues in the background;
2. the primary process prepares the destination (temporary directory or in place); barrier;
3. every process writes its chunks into ``<item>/ocdbt.process_<i>/`` (a one-generation
   OCDBT database) and its ``array_metadatas/process_<i>``; barrier;
4. the primary merges the per-process databases into the item root by reference, checks that
   every chunk is there, writes ``_sharding``, ``_strings.json``, ``_METADATA``, the commit
   markers and ``_CHECKPOINT_METADATA``, and commits (rename or commit file); barrier.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.saving import async_save, layout_writer
from ocdbt_py.checkpoint.saving.arrays import ArraySpec, storage_dtype
from ocdbt_py.checkpoint.saving.atomic import Destination, open_destination
from ocdbt_py.checkpoint.saving.chunking import (
    DEFAULT_TARGET_DATA_FILE_SIZE,
    GCS_TARGET_DATA_FILE_SIZE,
    choose_chunk_shape,
    chunk_byte_limit,
)
from ocdbt_py.checkpoint.saving.dir_writer import DirWriter, check_files_complete
from ocdbt_py.checkpoint.saving.distributed import Coordinator, coordinator
from ocdbt_py.checkpoint.saving.host_copy import copy_arrays, keep_arena
from ocdbt_py.checkpoint.saving.jax_arrays import default_replica_parallel, plan_jax_array
from ocdbt_py.checkpoint.saving.merge import check_complete, collect_children, write_root
from ocdbt_py.checkpoint.saving.params import (
    JAX_ARRAY,
    NP_ARRAY,
    SCALAR,
    STRING,
    Leaf,
    UnsupportedLeafError,
    flatten,
)
from ocdbt_py.checkpoint.saving.process_writer import ChunkJob, ProcessWriter, background_workers, default_workers
from ocdbt_py.errors import StorageError, UnsupportedError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = ["save", "JsonItem", "FilesItem", "SaveHandle", "SaveOptions", "ItemPlan", "make_options", "plan_item",
           "commit_items"]

SaveHandle = async_save.SaveHandle
_RESERVED_ITEM_NAMES = frozenset({"descriptor"})
#: How much lower (Linux nice) a background save's encoder threads run: see :func:`background_nice`.
BACKGROUND_NICE = 10


def background_nice() -> int:
    """How much lower the encoder threads of a background (``blocking=False``) save run than
    the caller (Linux nice; ``OCDBT_PY_SAVE_NICE`` overrides, 0 turns it off): the training
    loop's threads get the cores first, the save takes what they leave."""
    env = os.environ.get("OCDBT_PY_SAVE_NICE")
    if env:
        try:
            return max(0, min(19, int(env)))
        except ValueError:
            pass
    return BACKGROUND_NICE


def _writes_local_files(path: Any) -> bool:
    """Whether a save to ``path`` (a path, URL or :class:`KvStore`) writes local files."""
    if isinstance(path, KvStore):
        return path.local_path() is not None
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    return isinstance(text, str) and ("://" not in text or text.startswith("file://"))


_HANDLERS = {"standard": layout_writer.STANDARD_HANDLER, "pytree": layout_writer.PYTREE_HANDLER,
             "array": layout_writer.ARRAY_HANDLER}


@dataclasses.dataclass(frozen=True)
class JsonItem:
    """A composite item saved as JSON (Orbax's ``JsonSave``): ``<item>/metadata``.

    ``filename`` names the file instead (Orbax's CheckpointManager keeps a step's metrics in
    ``metrics/metrics``).
    """

    value: Any
    filename: str = "metadata"

    def __post_init__(self) -> None:
        f = self.filename
        if not isinstance(f, str) or not f or "/" in f or f.startswith(".") or f in (
                layout_writer.COMMIT_MARKER, layout_writer.CHECKPOINT_METADATA):
            raise ValueError(f"invalid JSON item file name {f!r}")


@dataclasses.dataclass(frozen=True)
class FilesItem:
    """A composite item whose files a caller's function writes: ``write(directory)`` is called
    on every process with the item's local directory (created, inside the uncommitted step),
    before the step is committed; ``handler`` is the type name recorded for it in
    ``_CHECKPOINT_METADATA``.  Local destinations only (``UnsupportedError`` elsewhere): this is
    how Orbax-style custom ``CheckpointHandler.save(directory, args)`` items are written.
    """

    write: Callable[[str], None]
    handler: str


@dataclasses.dataclass(frozen=True)
class SaveOptions:
    use_zarr3: bool
    use_ocdbt: bool
    use_compression: bool
    chunk_byte_size: int | None
    leaf_chunk_byte_sizes: Mapping[str, int]  # param name -> chunk_byte_size for that array
    target_data_file_size: int
    replica_parallel: bool
    copy: bool
    workers: int
    sync: bool
    checksum: bool = False
    nice: int = 0  # encoder threads' priority drop (background saves: BACKGROUND_NICE)


@dataclasses.dataclass
class ItemPlan:
    """One pytree item: what this process writes and what the primary records."""

    name: str | None
    leaves: list[Leaf]
    handler: str
    specs: list[ArraySpec]  # every array of the item (for metadata and the final check)
    jobs: list[ChunkJob]  # regions this process writes
    shared: list[bool]  # per job: the data is the caller's memory (copied for async saves)
    metadata_specs: list[ArraySpec]  # arrays whose Zarr metadata this process writes
    strings: dict[str, str]
    write_shapes: dict[str, tuple[int, ...]]
    shardings: dict[str, str]
    array_metadatas: list[tuple[str, tuple[int, ...], tuple[int, ...], Any]]
    custom_metadata: Any
    opts: SaveOptions  # this item's options (the save's, or its own from ``item_options``)


#: What one item of a save is, once planned.
Plan = ItemPlan | JsonItem | FilesItem

#: Array specs by everything they are made from: a training loop saving the same tree again
#: reuses them (``ArraySpec`` is immutable); cleared when it grows past 65536 entries.
_specs: dict[tuple[Any, ...], ArraySpec] = {}


def _spec(name: str, shape: tuple[int, ...], dtype: np.dtype[Any], write_shape: tuple[int, ...],
          opts: SaveOptions, item: str | None = None) -> ArraySpec:
    key = name if item is None else f"{item}/{name}"
    per_leaf = opts.leaf_chunk_byte_sizes.get(key, opts.chunk_byte_size)
    # Orbax caps chunks by the target data file size only for OCDBT
    target = opts.target_data_file_size if opts.use_ocdbt else 0
    memo = (name, tuple(shape), dtype, tuple(write_shape), per_leaf, target, opts.use_zarr3, opts.use_compression,
            opts.checksum)
    spec = _specs.get(memo)
    if spec is None:
        limit = chunk_byte_limit(write_shape, dtype.itemsize, per_leaf, target)
        chunk = choose_chunk_shape(shape, write_shape, dtype.itemsize, limit)
        spec = ArraySpec(name, shape, dtype, tuple(write_shape), chunk,
                         3 if opts.use_zarr3 else 2, opts.use_compression, checksum=opts.checksum)
        if len(_specs) >= 65536:
            _specs.clear()
        _specs[memo] = spec
    return spec


def _host_array(value: Any, leaf: Leaf) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "OUSMm":
        raise UnsupportedLeafError(f"cannot save leaf {leaf.where}: NumPy dtype {arr.dtype} is not storable")
    return arr


def _copy_shared(plans: Mapping[str, Any], workers: int, reuse: bool) -> np.ndarray | None:
    """Replace every job's data that is the caller's memory by a private copy (async saves);
    returns the buffer holding the copies."""

    where: list[tuple[ItemPlan, int]] = []
    for plan in plans.values():
        if isinstance(plan, ItemPlan):
            where.extend((plan, i) for i, shared in enumerate(plan.shared) if shared)
    if not where:
        return None
    # one copy thread per core, at most 4: the copy is memory-bound (2 threads saturate this
    # 2-core VM, 4 on it measured 1 ms slower per 304 MiB: bench/notes/i20-cont.md)
    copiers = min(workers, os.cpu_count() or 1, 4)
    copies, arena = copy_arrays([plan.jobs[i][2] for plan, i in where], copiers, reuse=reuse)
    for (plan, i), data in zip(where, copies):
        spec, origin, _ = plan.jobs[i]
        plan.jobs[i] = (spec, origin, data)
        plan.shared[i] = False
    return arena


def _scalar_array(value: Any, where: str) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except OverflowError as e:
        raise ValueError(f"cannot save scalar {where}: {e}") from e
    if arr.dtype == object or arr.shape != ():
        raise UnsupportedLeafError(f"cannot save scalar {where} ({value!r}) as a NumPy number")
    return arr


def plan_item(name: str | None, tree: Any, coord: Coordinator, opts: SaveOptions, handler: str | None,
              custom_metadata: Any) -> ItemPlan:
    """Step 1 of :func:`save` for one item: its leaves, array specs, chunk jobs and metadata.

    :func:`make_options`, :func:`plan_item` and :func:`commit_items` are the steps of a save
    for writers that supply the array data themselves, chunk by chunk (a streamed import)."""
    leaves = flatten(tree)
    primary = coord.is_primary
    plan = ItemPlan(name, leaves, "", [], [], [], [], {}, {}, {}, [], custom_metadata, opts)
    only_arrays = True
    for leaf in leaves:
        vt = leaf.value_type
        pname = leaf.param_name
        if vt == JAX_ARRAY:
            jp = plan_jax_array(leaf.value, replica_parallel=opts.replica_parallel, name=leaf.where,
                                devices=coord.writer_devices)
            spec = _spec(pname, jp.shape, jp.dtype, jp.write_shape, opts, name)
            plan.specs.append(spec)
            if primary:
                plan.metadata_specs.append(spec)
            plan.jobs.extend((spec, p.origin, p.data) for p in jp.pieces)
            plan.shared.extend(p.shared for p in jp.pieces)
            plan.write_shapes[pname] = jp.write_shape
            if jp.sharding is not None:
                plan.shardings[pname] = jp.sharding
            plan.array_metadatas.append((pname, jp.write_shape, spec.chunk_shape, jp.ext_metadata))
        elif vt in (NP_ARRAY, SCALAR):
            arr = _host_array(leaf.value, leaf) if vt == NP_ARRAY else _scalar_array(leaf.value, leaf.where)
            if arr.size == 0:
                raise ValueError(f"Cannot save arrays with zero size: {leaf.where} has shape {arr.shape}")
            try:
                dtype = storage_dtype(arr.dtype)
            except TypeError as e:
                raise UnsupportedLeafError(f"cannot save leaf {leaf.where}: {e}") from e
            shape = tuple(int(d) for d in arr.shape)
            spec = _spec(pname, shape, dtype, shape, opts, name)
            plan.specs.append(spec)
            if primary:  # numpy arrays and scalars are written by the primary process only
                plan.metadata_specs.append(spec)
                plan.jobs.append((spec, (0,) * len(shape), arr))
                plan.shared.append(vt == NP_ARRAY)
        elif vt == STRING:
            only_arrays = False  # StandardSave refuses strings
            plan.strings[pname] = str(leaf.value)
    if handler is None:
        plan.handler = layout_writer.STANDARD_HANDLER if only_arrays else layout_writer.PYTREE_HANDLER
    else:
        plan.handler = _HANDLERS[handler]
    return plan


def _write_process_part(item_kv: KvStore, plan: ItemPlan, coord: Coordinator, opts: SaveOptions
                        ) -> dict[bytes, Any] | None:
    """Step 3 for one item: this process's database (or files, per-parameter layout) and its
    array metadata file."""
    writer: ProcessWriter | DirWriter
    if opts.use_ocdbt:
        writer = ProcessWriter(item_kv, coord.process_index,
                               target_data_file_size=opts.target_data_file_size, sync=opts.sync)
    else:
        writer = DirWriter(item_kv, sync=opts.sync)
    try:
        for spec in plan.metadata_specs:
            writer.put(spec.metadata_key, spec.metadata_bytes())
        # only where encoders write local files: a thread started by a niced thread inherits its
        # priority, and a remote store's connection pools may start threads from an encoder
        nice = opts.nice if item_kv.local_path() is not None else 0
        writer.run(writer.tasks(plan.jobs), opts.workers, nice=nice)
    except BaseException:
        writer.abort()
        raise
    writer.finish()
    if plan.array_metadatas:
        item_kv.set(f"{layout_writer.ARRAY_METADATAS}/process_{coord.process_index}",
                    layout_writer.array_metadatas_file(plan.array_metadatas))
    if isinstance(writer, DirWriter):
        return None
    return writer.entries if writer.entries else None


def _finalize_item(item_kv: KvStore, plan: ItemPlan, coord: Coordinator, opts: SaveOptions,
                   own: dict[bytes, Any] | None) -> None:
    """Step 4 for one item (primary): merged root, metadata files."""
    entries: dict[bytes, Any] = {}
    if not opts.use_ocdbt:
        if plan.specs and not coord.partial:
            check_files_complete(item_kv, plan.specs)
    elif plan.specs:
        known = {coord.process_index: own} if own is not None else {}
        entries = collect_children(item_kv, coord.participants, known)
        if not coord.partial:
            check_complete(entries, plan.specs)
    if plan.shardings:
        item_kv.set(layout_writer.SHARDING, layout_writer.sharding_file(plan.shardings))
    if plan.strings:
        item_kv.set(layout_writer.STRINGS, layout_writer.strings_file(plan.strings))
    item_kv.set(layout_writer.TREE_METADATA, layout_writer.tree_metadata(
        plan.leaves, plan.write_shapes, use_zarr3=opts.use_zarr3, custom_metadata=plan.custom_metadata,
        use_ocdbt=opts.use_ocdbt))
    if entries:
        write_root(item_kv, entries, target_data_file_size=opts.target_data_file_size)


def _item_names(items: Mapping[str, Any]) -> None:
    for name in items:
        if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or name.startswith("."):
            raise ValueError(f"invalid item name {name!r}: item names are plain directory names")
        if name in _RESERVED_ITEM_NAMES:
            raise ValueError(f"item name {name!r} is reserved by Orbax")
        if ".orbax-checkpoint-tmp" in name:
            raise ValueError(f"item name {name!r} looks like a temporary directory")


def save(
    path: str | os.PathLike[str] | KvStore,
    tree: Any,
    *,
    composite: bool = False,
    force: bool = False,
    use_zarr3: bool = False,
    use_ocdbt: bool = True,
    use_compression: bool = True,
    checksum: bool = False,
    chunk_byte_size: int | None = None,
    leaf_chunk_byte_sizes: Mapping[str, int] | None = None,
    ocdbt_target_data_file_size: int | None = None,
    custom_metadata: Mapping[str, Any] | None = None,
    pytree_custom_metadata: Any = None,
    handler: str | Mapping[str, str] | None = None,
    item_options: Mapping[str, Mapping[str, Any]] | None = None,
    blocking: bool = True,
    copy: bool | None = None,
    keep_copy_buffer: bool = True,
    storage_options: dict[str, Any] | None = None,
    replica_parallel: bool | None = None,
    workers: int | None = None,
    sync: bool = True,
    barrier_timeout: float = 600.0,
    finalize: Callable[[str, str], None] | None = None,
    _coordinator: Coordinator | None = None,
) -> SaveHandle:
    """Save ``tree`` as an Orbax checkpoint at ``path`` (local path, fsspec URL or KvStore).

    The layout is the one Orbax 0.12 writes (OCDBT with Zarr v2 inside, ``_METADATA``,
    ``_sharding``, ``array_metadatas/``, ``_CHECKPOINT_METADATA``, ``commit_success.txt``), so
    ``ocp.StandardCheckpointer().restore(path)`` / ``PyTreeCheckpointer`` restore it, as does
    :func:`ocdbt_py.checkpoint.restore`.

    * ``tree``: nested dicts/lists/tuples/NamedTuples (any JAX pytree when JAX is imported)
      of ``jax.Array``, NumPy arrays (every dtype incl. ml_dtypes), Python/NumPy scalars,
      strings, ``None`` and empty containers.
    * ``composite=True``: ``tree`` maps item names to trees or :class:`JsonItem`; each item gets
      its own directory, as ``ocp.args.Composite`` (use ``{"default": tree}`` to write a
      CheckpointManager step of a single item).
    * ``force``: replace an existing checkpoint (otherwise :class:`CheckpointExistsError`).
    * ``use_zarr3``, ``use_compression``, ``chunk_byte_size``, ``ocdbt_target_data_file_size``:
      as Orbax's ``PyTreeCheckpointHandler`` / ``SaveArgs`` options (applied to every array).
      ``leaf_chunk_byte_sizes`` maps param names (key names joined with ``.``, e.g.
      ``"dense.kernel"``; ``"<item>/<param name>"`` in a composite save) to a
      ``chunk_byte_size`` for that array alone, as a per-leaf ``SaveArgs(chunk_byte_size=...)``;
      it overrides ``chunk_byte_size`` for those arrays.
    * ``use_ocdbt=False``: the per-parameter layout (``PyTreeCheckpointHandler(use_ocdbt=False)``):
      each array's Zarr metadata and chunks are files in ``<item>/<param>/``; chunks are not
      capped by ``ocdbt_target_data_file_size`` (there are no data files).
    * ``checksum``: make stored chunks self-checking, so a flipped byte is an error on restore
      (and in ``ocdbt verify --data``) instead of silently different values: Zarr v2 zstd
      frames carry their content checksum; with ``use_zarr3`` each chunk ends in the Zarr v3
      ``crc32c`` codec (TensorStore and Orbax read both).  Zarr v2 without compression has
      nowhere to put a checksum: ``ValueError``.
    * ``custom_metadata``: JSON stored in ``_CHECKPOINT_METADATA``;
      ``pytree_custom_metadata``: JSON stored in ``_METADATA`` (``PyTreeSave(custom_metadata=)``).
    * ``handler``: ``"standard"``, ``"pytree"`` or ``"array"`` (handler name recorded for the item;
      default: standard unless the tree holds strings); a dict gives it per item of a composite save.
    * ``item_options``: per item of a composite save, overrides of ``use_zarr3``,
      ``use_ocdbt``, ``use_compression``, ``checksum``, ``chunk_byte_size``,
      ``ocdbt_target_data_file_size`` and ``pytree_custom_metadata`` (Orbax gives each item its
      own handler and ``PyTreeSave`` options, e.g. ``{"ema": {"use_ocdbt": False}}``).
    * ``finalize(tmp_dir, final_dir)``: commits a local save instead of the built-in rename (:func:`commit_items`).
    * ``blocking=False``: return once host copies are made (``copy`` defaults to ``True`` then,
      so the caller may modify or donate its arrays); ``handle.wait()`` re-raises any error.
      A later save waits for the previous one.  ``keep_copy_buffer``: keep the copies' buffer
      for the next async save (a training loop then copies at memcpy speed, without page
      faults); it holds that much host memory between saves
      (``ocdbt_py.checkpoint.saving.host_copy.release_cached_arena()`` frees it).
    * ``replica_parallel``: split replicated shards across replicas (Orbax's default on CPU/TPU).
    * ``workers``: encoding threads; ``sync=False`` skips fsyncing local files (faster, not
      crash-durable; the commit is still atomic for other processes).
    * In a multi-process JAX job every process calls ``save`` with the same tree; each writes
      its own shards and process 0 commits.  ``_coordinator`` (internal, for the multi-tier
      manager) replaces that: a subset of the processes, or one process saving alone.

    Returns a :class:`SaveHandle` (already finished when ``blocking``).
    """
    started = time.perf_counter()
    async_save.wait_for_previous()
    coord = _coordinator if _coordinator is not None else coordinator(timeout_s=barrier_timeout)
    opts = make_options(path, use_zarr3, use_compression, chunk_byte_size, leaf_chunk_byte_sizes,
                        ocdbt_target_data_file_size, replica_parallel, not blocking if copy is None else copy, workers,
                        sync, use_ocdbt=use_ocdbt, checksum=checksum, background=not blocking)
    per_item = _item_options(item_options, composite, tree, path, opts, pytree_custom_metadata)
    plans = _make_plans(tree, composite, coord, opts, handler, pytree_custom_metadata, per_item)

    arena = _copy_shared(plans, opts.workers, keep_copy_buffer) if opts.copy else None
    dest = open_destination(path, storage_options)
    init_ns = time.time_ns()

    def work() -> None:
        _run(dest, plans, coord, opts, composite, force, custom_metadata, init_ns, finalize)
        if arena is not None and keep_copy_buffer:
            plans.clear()  # nothing references the copies any more
            keep_arena(arena)

    return async_save.start(dest.display, work, blocking=blocking, started=started)


def make_options(path: Any, use_zarr3: bool, use_compression: bool, chunk_byte_size: int | None,
                  leaf_chunk_byte_sizes: Mapping[str, int] | None, ocdbt_target_data_file_size: int | None,
                  replica_parallel: bool | None, copy: bool, workers: int | None, sync: bool, *,
                  use_ocdbt: bool = True, checksum: bool = False, background: bool = False) -> SaveOptions:
    """The checked options of one save, with Orbax's defaults filled in (see :func:`plan_item`);
    ``background``: a ``blocking=False`` save (niced encoders, one per core for local files)."""
    if ocdbt_target_data_file_size is not None and ocdbt_target_data_file_size < 0:
        raise ValueError("ocdbt_target_data_file_size must be >= 0")
    if chunk_byte_size is not None and chunk_byte_size <= 0:
        raise ValueError("chunk_byte_size must be positive")
    leaf_sizes = dict(leaf_chunk_byte_sizes or {})
    for pname, size in leaf_sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"leaf_chunk_byte_sizes[{pname!r}] must be a positive int, not {size!r}")
    if replica_parallel is None:
        replica_parallel = default_replica_parallel()
    target = ocdbt_target_data_file_size
    if target is None:  # Orbax's defaults: 400 MiB on GCS, 2 GiB elsewhere
        gcs = isinstance(path, str) and path.startswith(("gs://", "gcs://"))
        target = GCS_TARGET_DATA_FILE_SIZE if gcs else DEFAULT_TARGET_DATA_FILE_SIZE
    if checksum and not use_zarr3 and not use_compression:
        raise ValueError("checksum=True needs use_compression=True or use_zarr3=True (uncompressed "
                         "Zarr v2 chunks have nowhere to keep a checksum)")
    opts = SaveOptions(use_zarr3, bool(use_ocdbt), use_compression, chunk_byte_size, leaf_sizes, target,
                       bool(replica_parallel), bool(copy), workers or default_workers(), sync, bool(checksum))
    if background:
        opts = dataclasses.replace(opts, nice=background_nice(),
                                   workers=workers or background_workers(_writes_local_files(path)))
    return opts


#: What :func:`save`'s ``item_options`` may set for one item
ITEM_OPTIONS = frozenset({"use_zarr3", "use_ocdbt", "use_compression", "checksum", "chunk_byte_size",
                          "ocdbt_target_data_file_size", "pytree_custom_metadata"})


def _item_options(item_options: Mapping[str, Mapping[str, Any]] | None, composite: bool, tree: Any, path: Any,
                  opts: SaveOptions, pytree_custom_metadata: Any) -> dict[str, tuple[SaveOptions, Any]]:
    """``{item: (its save options, its pytree custom metadata)}`` for the items that
    ``item_options`` names, checked like the save's own options (``opts``: the save's, which
    the items' options start from)."""
    if not item_options:
        return {}
    if not composite:
        raise ValueError("item_options applies to the items of a composite save (composite=True)")
    if not isinstance(item_options, Mapping):
        raise TypeError(f"item_options must map item names to dicts of options, not {type(item_options).__name__}")
    out: dict[str, tuple[SaveOptions, Any]] = {}
    for name, given in item_options.items():
        if not isinstance(tree, Mapping) or name not in tree:
            raise ValueError(f"item_options names {name!r}, which is not an item of this save")
        if isinstance(tree[name], JsonItem):
            raise ValueError(f"item_options[{name!r}]: {name!r} is a JSON item, which takes no array options")
        if not isinstance(given, Mapping):
            raise TypeError(f"item_options[{name!r}] must be a dict of options, not {type(given).__name__}")
        unknown = set(given) - ITEM_OPTIONS
        if unknown:
            raise ValueError(f"unknown item_options[{name!r}] {sorted(unknown)} (known: {sorted(ITEM_OPTIONS)})")
        o = {"use_zarr3": opts.use_zarr3, "use_ocdbt": opts.use_ocdbt, "use_compression": opts.use_compression,
             "checksum": opts.checksum, "chunk_byte_size": opts.chunk_byte_size,
             "ocdbt_target_data_file_size": opts.target_data_file_size,
             "pytree_custom_metadata": pytree_custom_metadata, **given}
        item = make_options(path, bool(o["use_zarr3"]), bool(o["use_compression"]), o["chunk_byte_size"],
                            opts.leaf_chunk_byte_sizes, o["ocdbt_target_data_file_size"], opts.replica_parallel,
                            opts.copy, opts.workers, opts.sync, use_ocdbt=bool(o["use_ocdbt"]),
                            checksum=bool(o["checksum"]))
        out[name] = (dataclasses.replace(item, nice=opts.nice), o["pytree_custom_metadata"])
    return out


def _make_plans(tree: Any, composite: bool, coord: Coordinator, opts: SaveOptions,
                handler: str | Mapping[str, str] | None, pytree_custom_metadata: Any,
                per_item: Mapping[str, tuple[SaveOptions, Any]] | None = None) -> dict[str, Plan]:
    """What to write for each item (``""`` for a single item), checked before anything is;
    ``per_item`` gives some items their own options and custom metadata."""
    for h in handler.values() if isinstance(handler, Mapping) else [handler]:
        if h is not None and h not in _HANDLERS:
            raise ValueError(f"handler must be 'standard', 'pytree' or 'array', not {h!r}")
    if composite:
        if not isinstance(tree, Mapping) or not tree:
            raise TypeError("composite=True needs a non-empty dict of item name -> tree or JsonItem")
        _item_names(tree)
        items: dict[str, Any] = dict(tree)
    else:
        if isinstance(tree, JsonItem):
            raise TypeError("a JsonItem is saved as one item of a composite save (composite=True)")
        items = {"": tree}
    plans: dict[str, Plan] = {}
    for name, value in items.items():
        if isinstance(value, JsonItem):
            layout_writer.json_item(value.value)  # fail early if not serializable
            plans[name] = value
        elif isinstance(value, FilesItem):
            if not composite:
                raise TypeError("a FilesItem is saved as one item of a composite save (composite=True)")
            plans[name] = value
        else:
            item_handler = handler.get(name) if isinstance(handler, Mapping) else handler
            item_opts, item_meta = (per_item or {}).get(name, (opts, pytree_custom_metadata))
            plans[name] = plan_item(name or None, value, coord, item_opts, item_handler, item_meta)
    return plans


def _run(dest: Destination, plans: Mapping[str, Plan], coord: Coordinator, opts: SaveOptions,
         composite: bool, force: bool, custom_metadata: Mapping[str, Any] | None, init_ns: int,
         finalize: Callable[[str, str], None] | None = None) -> None:
    err: BaseException | None = None
    if coord.is_primary:
        try:
            dest.prepare(force)
        except BaseException as e:  # noqa: BLE001 - shared with the other processes first
            err = e
    coord.sync("prepared", err)
    root = dest.write_kv
    own: dict[str, dict[bytes, Any] | None] = {}
    syncing: async_save.Background | None = None
    try:
        for name, plan in plans.items():
            if isinstance(plan, ItemPlan):
                item_kv = PrefixStore(root, name) if name else root
                own[name] = _write_process_part(item_kv, plan, coord, plan.opts)
            elif isinstance(plan, FilesItem):
                plan.write(_item_directory(PrefixStore(root, name)))
        if opts.sync and coord.is_primary:
            # the primary's data files need only be durable before its commit: they are
            # fsynced while the merged root and metadata files are built (joined before the commit)
            syncing = async_save.Background(dest.sync, name="ocdbt-save-sync")
        elif opts.sync:
            dest.sync()  # before the barrier: the primary commits what the others wrote
    except BaseException as e:  # noqa: BLE001
        err = e
    coord.sync("written", err)
    if coord.is_primary:
        try:
            commit_items(dest, root, plans, coord, opts, composite, custom_metadata, init_ns, own,
                         before_commit=syncing.join if syncing is not None else None, finalize=finalize)
        except BaseException as e:  # noqa: BLE001
            err = e
        finally:
            if syncing is not None:
                syncing.join(check=False)  # never leave the thread running past the save
    coord.sync("committed", err)


def _item_directory(item_kv: KvStore) -> str:
    """The local directory of a :class:`FilesItem` (made if missing)."""
    path = item_kv.local_path("")
    if path is None:
        raise UnsupportedError(f"an item written by its own handler needs a local destination, not {item_kv.url}")
    os.makedirs(path, exist_ok=True)
    return path


def commit_items(dest: Destination, root: KvStore, plans: Mapping[str, Plan], coord: Coordinator,
            opts: SaveOptions, composite: bool, custom_metadata: Mapping[str, Any] | None, init_ns: int,
            own: Mapping[str, dict[bytes, Any] | None], *,
            before_commit: Callable[[], None] | None = None,
            finalize: Callable[[str, str], None] | None = None) -> None:
    """Step 4 (primary): merged roots, metadata documents, commit markers, then the commit
    (``before_commit``, if given, is called just before it: the end of a background sync).
    ``finalize(tmp_dir, final_dir)``, for a destination committed by a rename, does the commit
    instead: the commit time, the root's ``commit_success.txt`` and the rename are its job."""
    handlers: dict[str, str] = {}
    for name, plan in plans.items():
        item_kv = PrefixStore(root, name) if name else root
        if isinstance(plan, JsonItem):
            item_kv.set(plan.filename, layout_writer.json_item(plan.value))
            handlers[name] = layout_writer.JSON_HANDLER
        elif isinstance(plan, FilesItem):
            handlers[name] = plan.handler
        else:
            _finalize_item(item_kv, plan, coord, plan.opts, own.get(name))
            handlers[name] = plan.handler
        if composite:
            item_kv.set(layout_writer.COMMIT_MARKER,
                        layout_writer.commit_marker(f"{dest.write_display.rstrip('/')}/{name}"))
    item_handlers: str | dict[str, str] = handlers if composite else handlers[""]
    external = finalize is not None and dest.renames
    root.set(layout_writer.CHECKPOINT_METADATA, layout_writer.checkpoint_metadata(
        item_handlers, init_ns=init_ns, commit_ns=None if external else time.time_ns(),
        custom_metadata=custom_metadata))
    if not external:
        root.set(layout_writer.COMMIT_MARKER, layout_writer.commit_marker(dest.display))
    if before_commit is not None:
        before_commit()
    if external:
        assert finalize is not None and dest.tmp_dir is not None and dest.final_dir is not None
        if opts.sync:
            dest.sync()
        if not dest.tmp_exists():
            raise StorageError(f"cannot commit {dest.tmp_dir} to {dest.final_dir}: it is gone")
        finalize(dest.tmp_dir, dest.final_dir)
        return
    dest.commit(sync=opts.sync)
