"""Copying one PyTree item directory into another layout.

The item's arrays are planned (:mod:`.encoding`), copied in batches of arrays by a bounded
thread pool (:mod:`.arrays`), and after each batch the values are made durable and the
batch recorded in the resume journal.  Then the database (OCDBT: the process database and the
merged root, as Orbax writes them) and the metadata documents follow: ``_METADATA`` with the
new ``use_ocdbt``/``use_zarr3`` (and without excluded arrays), ``array_metadatas/`` with the
new chunk shapes, everything else (``_sharding``, ``_strings.json``, a legacy msgpack
``checkpoint``, ...) copied as bytes.
"""

from __future__ import annotations

import base64
import dataclasses
import fnmatch
import functools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ocdbt_py.checkpoint.convert.arrays import ArrayJob, Stats, array_tasks, run_budgeted, verify_array
from ocdbt_py.checkpoint.convert.encoding import Target, source_encoding, strategy, target_spec
from ocdbt_py.checkpoint.convert.journal import Journal, decode_entries, encode_entries
from ocdbt_py.checkpoint.jsonio import parse_json, read_bytes
from ocdbt_py.checkpoint.layout import param_dir_problem
from ocdbt_py.checkpoint.restore.item import PyTreeItem
from ocdbt_py.checkpoint.saving import layout_writer
from ocdbt_py.checkpoint.saving.dir_writer import DirWriter
from ocdbt_py.checkpoint.saving.merge import collect_children, write_root
from ocdbt_py.checkpoint.saving.process_writer import ProcessWriter
from ocdbt_py.errors import UnsupportedError
from ocdbt_py.format.data_file_table import IndirectDataReference
from ocdbt_py.kvstore.base import KvStore

__all__ = ["ItemOptions", "ItemCopy", "copy_files", "selected"]

#: A batch of arrays is recorded in the journal once about this much has been copied.
FLUSH_BYTES = 256 << 20
FLUSH_ARRAYS = 1024
#: Memory budget of the chunks in flight, per worker thread.
MEMORY_PER_WORKER = 16 << 20
_METADATA_FILES = (layout_writer.TREE_METADATA, layout_writer.COMMIT_MARKER)


@dataclasses.dataclass(frozen=True)
class ItemOptions:
    """How items are copied."""

    target: Target
    use_ocdbt: bool | None  # None: as the source
    forced_compression: bool
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    workers: int = 4
    sync: bool = True
    verify: bool = False


def selected(param: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether ``--include``/``--exclude`` keep the array named ``param``."""
    if include and not any(fnmatch.fnmatchcase(param, g) for g in include):
        return False
    return not any(fnmatch.fnmatchcase(param, g) for g in exclude)


def copy_files(src: KvStore, dst: KvStore, keys: Iterable[str]) -> int:
    """Copy values as bytes; returns the bytes copied."""
    n = 0
    for k in keys:
        v = src.get(k)
        if v is not None:
            dst.set(k, v)
            n += len(v)
    return n


def _is_storage_key(key: str, params: set[str]) -> bool:
    head = key.split("/", 1)[0]
    if key == "manifest.ocdbt" or head == "d" and "/" in key or head.startswith("ocdbt.process_"):
        return True
    p = key.rsplit("/", 1)[0]
    while p:
        if p in params:
            return True
        p = p.rsplit("/", 1)[0] if "/" in p else ""
    return False


class ItemCopy:
    """One PyTree item: source opened and planned, destination written on :meth:`run`."""

    def __init__(self, src_kv: KvStore, opts: ItemOptions, name: str = ""):
        self.src_kv = src_kv
        self.opts = opts
        self.name = name
        self.item = PyTreeItem(src_kv)
        store = self.item.array_store
        self.src_ocdbt = store.layout != "dirs"
        self.use_ocdbt = self.src_ocdbt if opts.use_ocdbt is None else opts.use_ocdbt
        self.all_params = sorted(_array_names(store.kv))
        self.params = [p for p in self.all_params if selected(p, opts.include, opts.exclude)]
        if not self.use_ocdbt:  # each array becomes a directory named after it
            for p in self.params:
                problem = param_dir_problem(p)
                if problem is not None:
                    raise UnsupportedError(f"array {p!r} cannot be written in the per-parameter layout: its name "
                                           f"{problem} (keep OCDBT, or leave it out with exclude=/--exclude)")
        metas = self.item.reader.metadata_many(self.params)
        write_shapes = {p: am.get("write_shape") for p, am in self.item.array_metadatas().items()}
        target = dataclasses.replace(opts.target, use_ocdbt=self.use_ocdbt)
        self.jobs: list[ArrayJob] = []
        for p, meta in zip(self.params, metas):
            src = source_encoding(meta)
            spec = target_spec(p, src, write_shapes.get(p), target)
            self.jobs.append(ArrayJob(p, meta, src, spec, strategy(src, spec, opts.forced_compression)))

    @property
    def nbytes(self) -> int:
        """Logical bytes of the arrays to copy."""
        return sum(j.nbytes for j in self.jobs)

    def run(self, dst_kv: KvStore, journal: Journal, stats: Stats,
            progress: Callable[[int], None]) -> None:
        """Write the item into ``dst_kv`` (a directory being written, not yet committed)."""
        writer = self._writer(dst_kv)
        done = journal.done.get(self.name, {})
        todo = [j for j in self.jobs if j.param not in done]
        for j in self.jobs:
            if j.param in done:
                stats.add(arrays_resumed=1)
                progress(j.nbytes)
                if isinstance(writer, ProcessWriter):
                    writer.entries.update(decode_entries(done[j.param]["entries"]))
                j.crcs.update({k: (int(c), int(f), int(r)) for k, (c, f, r) in done[j.param].get("crcs", {}).items()})
        try:
            for batch in _batches(todo):
                self._copy_batch(batch, writer, dst_kv, journal, stats, progress)
        except BaseException:
            writer.abort()
            raise
        self._finish(writer, dst_kv)
        stats.add(bytes_written=_stored_bytes(writer))
        if self.opts.verify:
            self._verify(dst_kv)

    def _writer(self, dst_kv: KvStore) -> ProcessWriter | DirWriter:
        if self.use_ocdbt:
            return ProcessWriter(dst_kv, 0, target_data_file_size=self.opts.target.target_data_file_size,
                                 sync=self.opts.sync)
        return DirWriter(dst_kv, sync=self.opts.sync)

    def _copy_batch(self, batch: list[ArrayJob], writer: ProcessWriter | DirWriter, dst_kv: KvStore,
                    journal: Journal, stats: Stats, progress: Callable[[int], None]) -> None:
        reader = self.item.reader
        src_kv = self.item.array_store.kv
        before = set(writer.entries) if isinstance(writer, ProcessWriter) else set()
        for j in batch:
            if j.how == "bytes":
                raw = src_kv.get(j.spec.metadata_key)
                writer.put(j.spec.metadata_key, raw if raw is not None else j.spec.metadata_bytes())
            else:
                writer.put(j.spec.metadata_key, j.spec.metadata_bytes())

        def tasks() -> Iterator[tuple[int, Callable[[], None]]]:
            for j in batch:
                yield from array_tasks(j, reader, src_kv, writer, stats)
                yield 0, functools.partial(progress, j.nbytes)

        workers = self.opts.workers
        run_budgeted(tasks(), workers, workers * MEMORY_PER_WORKER)
        stats.add(arrays=len(batch), logical_bytes=sum(j.nbytes for j in batch))
        records: dict[str, Any] = {}
        if isinstance(writer, ProcessWriter):
            writer.pool.close()  # values durable (files closed) before they are recorded
            new = {k: v for k, v in writer.entries.items() if k not in before}
            for j in batch:
                pre = (j.param + "/").encode()
                records[j.param] = {"entries": encode_entries({k: v for k, v in new.items() if k.startswith(pre)})}
        else:
            records = {j.param: {} for j in batch}
        for j in batch:  # kept for a --verify of a resumed copy
            records[j.param]["crcs"] = {k: list(v) for k, v in j.crcs.items()}
        journal.record(self.name, records)

    def _finish(self, writer: ProcessWriter | DirWriter, dst_kv: KvStore) -> None:
        """The databases (OCDBT) and the metadata documents."""
        if isinstance(writer, ProcessWriter):
            writer.pool.close()
            _drop_unreferenced(writer)  # before the B+tree's own files are written
        writer.finish()
        if isinstance(writer, ProcessWriter) and writer.entries:
            entries = collect_children(dst_kv, 1, {0: writer.entries})
            write_root(dst_kv, entries, target_data_file_size=self.opts.target.target_data_file_size)
        keep = set(self.params)
        excluded = set(self.all_params) - keep
        skip = set(self.all_params)
        others = [k for k in self.src_kv.list("") if not _is_storage_key(k, skip) and not k.startswith(".ocdbt-cp/")
                  and k not in _METADATA_FILES and not k.startswith(layout_writer.ARRAY_METADATAS + "/")]
        if excluded and layout_writer.SHARDING in others:
            others.remove(layout_writer.SHARDING)
            _rewrite_sharding(self.src_kv, dst_kv, excluded)
        copy_files(self.src_kv, dst_kv, others)
        self._rewrite_tree_metadata(dst_kv, excluded)
        self._rewrite_array_metadatas(dst_kv, excluded)

    def _rewrite_tree_metadata(self, dst_kv: KvStore, excluded: set[str]) -> None:
        raw = read_bytes(self.src_kv, layout_writer.TREE_METADATA)
        if raw is None:
            return
        doc = parse_json(raw, what="_METADATA")
        if not isinstance(doc, dict):
            dst_kv.set(layout_writer.TREE_METADATA, raw)
            return
        tm = doc.get("tree_metadata")
        if excluded and isinstance(tm, dict):
            def param(entry: Any) -> str | None:
                km = entry.get("key_metadata") if isinstance(entry, dict) else None
                return ".".join(str(k.get("key")) for k in km) if isinstance(km, list) else None

            doc["tree_metadata"] = {k: v for k, v in tm.items() if param(v) not in excluded}
        doc["use_ocdbt"] = self.use_ocdbt
        formats = {j.spec.zarr_format for j in self.jobs}
        if formats:
            doc["use_zarr3"] = formats == {3}
        dst_kv.set(layout_writer.TREE_METADATA, json.dumps(doc).encode("utf-8"))

    def _rewrite_array_metadatas(self, dst_kv: KvStore, excluded: set[str]) -> None:
        chunks = {j.param: list(j.spec.chunk_shape) for j in self.jobs}
        for key in self.src_kv.list(layout_writer.ARRAY_METADATAS + "/"):
            raw = read_bytes(self.src_kv, key)
            if raw is None:
                continue
            doc = parse_json(raw, what=key)
            entries = doc.get("array_metadatas") if isinstance(doc, dict) else None
            if not isinstance(entries, list):
                dst_kv.set(key, raw)
                continue
            out = []
            for e in entries:
                am = e.get("array_metadata") if isinstance(e, dict) else None
                name = am.get("param_name") if isinstance(am, dict) else None
                if name in excluded:
                    continue
                if isinstance(am, dict) and name in chunks:
                    am["chunk_shape"] = chunks[name]
                out.append(e)
            doc["array_metadatas"] = out
            dst_kv.set(key, json.dumps(doc).encode("utf-8"))

    def _verify(self, dst_kv: KvStore) -> None:
        dst = PyTreeItem(dst_kv)
        try:
            for j in self.jobs:
                verify_array(j, self.item.reader, dst.reader, dst.array_store.kv, self.item.array_store.kv)
        finally:
            dst.close()

    def close(self) -> None:
        """Release the source."""
        self.item.close()


def _batches(jobs: list[ArrayJob]) -> Iterator[list[ArrayJob]]:
    batch: list[ArrayJob] = []
    size = 0
    for j in jobs:
        batch.append(j)
        size += j.nbytes
        if size >= FLUSH_BYTES or len(batch) >= FLUSH_ARRAYS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _stored_bytes(writer: ProcessWriter | DirWriter) -> int:
    """Bytes of the item's array values in the copy."""
    if isinstance(writer, DirWriter):
        return sum(writer.written.values())
    return sum(v.length if isinstance(v, IndirectDataReference) else len(v) for v in writer.entries.values())


def _drop_unreferenced(writer: ProcessWriter) -> None:
    """Delete data files an interrupted copy left that nothing references."""
    used = {v.file.relative_path.decode() for v in writer.entries.values() if isinstance(v, IndirectDataReference)}
    for key in list(writer.kv.list("d/")):
        if key not in used:
            writer.kv.delete(key)


def _array_names(kv: KvStore) -> set[str]:
    names: set[str] = set()
    for key in kv.list(""):
        for suffix in ("/.zarray", "/zarr.json"):
            if key.endswith(suffix):
                names.add(key[: -len(suffix)])
    return names


def _rewrite_sharding(src: KvStore, dst: KvStore, excluded: set[str]) -> None:
    raw = read_bytes(src, layout_writer.SHARDING)
    if raw is None:
        return
    doc = parse_json(raw, what="_sharding")
    if isinstance(doc, dict):
        drop = {base64.urlsafe_b64encode(p.encode()).decode() for p in excluded}
        doc = {k: v for k, v in doc.items() if k not in drop}
        raw = json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
    dst.set(layout_writer.SHARDING, raw)

