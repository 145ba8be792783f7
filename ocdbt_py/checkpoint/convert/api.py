"""``copy()``: any Orbax checkpoint into any other valid layout, anywhere.

A copy works on units that each become visible at once: an item directory, a step directory
(every item, JSON items and ``_CHECKPOINT_METADATA`` included), or each selected step of a
manager root.  A unit is written as :func:`~ocdbt_py.checkpoint.save` writes a checkpoint (a
temporary directory renamed on local disks; in place with ``commit_success.txt`` last on
object stores), so a reader sees the old state or the complete copy.  The resume journal
(:mod:`.journal`) lets ``resume=True`` continue an interrupted unit, skipping its finished
arrays, and skip units already copied.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ocdbt_py.checkpoint.convert.arrays import Stats
from ocdbt_py.checkpoint.convert.encoding import Target, cast_dtype
from ocdbt_py.checkpoint.convert.item import ItemCopy, ItemOptions, copy_files
from ocdbt_py.checkpoint.convert.journal import JOURNAL_DIR, Journal, SourceChangedError, changed, source_identity
from ocdbt_py.checkpoint.layout import TMP_SUFFIX, Kind, classify, list_steps, parse_step_name
from ocdbt_py.checkpoint.saving import layout_writer
from ocdbt_py.checkpoint.saving.atomic import Destination, open_destination
from ocdbt_py.checkpoint.saving.chunking import DEFAULT_TARGET_DATA_FILE_SIZE, GCS_TARGET_DATA_FILE_SIZE
from ocdbt_py.checkpoint.saving.process_writer import default_workers
from ocdbt_py.errors import NotFoundError, OcdbtError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = ["copy", "parse_compression"]

#: ``progress(done_bytes, total_bytes, unit)``
ProgressFn = Callable[[int, int, str], None]
_MARKER = layout_writer.COMMIT_MARKER


def parse_compression(value: str | int | None) -> int | None:
    """``"zstd"``/``"zstd:LEVEL"``/``"none"`` (or a level) -> zstd level, ``0`` for none,
    ``None`` to keep the source's."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == "none":
        return 0
    if text == "zstd":
        return 3
    name, sep, level = text.partition(":")
    if name == "zstd" and sep:
        try:
            n = int(level)
        except ValueError:
            n = None
        if n is not None and 1 <= n <= 22:
            return n
    raise ValueError(f"compression must be 'none', 'zstd' or 'zstd:LEVEL' (LEVEL 1..22), not {value!r}")


def _join(location: str | os.PathLike[str] | KvStore, name: str) -> str | KvStore:
    if isinstance(location, KvStore):
        return PrefixStore(location, name)
    return os.fspath(location).rstrip("/") + "/" + name


def _scheme(location: Any) -> str | None:
    """The URL scheme of a location (``None``: a local path or a KvStore)."""
    if isinstance(location, KvStore):
        return None
    text = os.fspath(location)
    return text.split("://", 1)[0] if "://" in text else None


def _prepare(dest: Destination, force: bool, resume: bool) -> bool:
    """Make room for writing the unit; ``True`` when an interrupted copy is continued."""
    if resume:
        if dest.renames and dest.tmp_dir is not None:
            if dest.tmp_exists() and not dest.exists():  # a link there is refused, never followed
                return True
        elif dest.write_kv.exists(f"{JOURNAL_DIR}/options.json") and not dest.write_kv.exists(_MARKER):
            return True
    dest.prepare(force)
    return False


def _committed(dest: Destination) -> bool:
    if dest.renames:
        return dest.exists()
    return dest.final_kv.exists(_MARKER)


class _Unit:
    """One item, step or manager step being copied."""

    def __init__(self, src_kv: KvStore, kind: Kind, opts: ItemOptions):
        self.src_kv = src_kv
        self.kind = kind
        self.items: dict[str, ItemCopy] = {}
        self.other_dirs: list[str] = []
        self.markers: list[str] = []
        if kind == Kind.PYTREE:
            self.items[""] = ItemCopy(src_kv, opts, "")
        elif kind == Kind.STEP:
            dirs, _ = src_kv.list_dir("")
            for d in sorted(dirs):
                if TMP_SUFFIX in d or d == JOURNAL_DIR:
                    continue
                try:
                    sub = classify(src_kv, d + "/")
                except OcdbtError:  # not an item we understand: copied as bytes
                    sub = None
                if sub == Kind.PYTREE:
                    self.items[d] = ItemCopy(PrefixStore(src_kv, d), opts, d)
                else:
                    self.other_dirs.append(d)

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.items.values())

    def run(self, dest: Destination, journal: Journal, stats: Stats, progress: Callable[[int], None]) -> None:
        root = dest.write_kv
        for name, item in self.items.items():
            item.run(PrefixStore(root, name) if name else root, journal, stats, progress)
        self.markers = [f"{name}/" for name in self.items if name]
        if self.kind == Kind.PYTREE:
            return
        # everything else of a step (or a JSON item) as bytes; commit markers are written last
        keys = [f for f in self.src_kv.list_dir("")[1] if f != _MARKER]
        for d in self.other_dirs:
            for k in self.src_kv.list(d + "/"):
                if k.rsplit("/", 1)[-1] == _MARKER:
                    self.markers.append(k[: -len(_MARKER)])
                else:
                    keys.append(k)
        stats.add(bytes_written=copy_files(self.src_kv, root, keys))

    def write_markers(self, dest: Destination) -> None:
        """Commit markers of the items (the unit's own is written by the caller)."""
        for prefix in self.markers:
            dest.write_kv.set(prefix + _MARKER,
                              layout_writer.commit_marker(f"{dest.write_display.rstrip('/')}/{prefix.rstrip('/')}"))

    def close(self) -> None:
        for item in self.items.values():
            item.close()


def _options_doc(opts: ItemOptions) -> dict[str, Any]:
    t = opts.target
    return {"use_ocdbt": opts.use_ocdbt, "zarr3": t.zarr3, "chunk_byte_size": t.chunk_byte_size,
            "target_data_file_size": t.target_data_file_size, "compression": t.compression,
            "dtype": None if t.dtype is None else str(t.dtype), "include": list(opts.include),
            "exclude": list(opts.exclude)}


def _copy_unit(src_kv: KvStore, kind: Kind, dst: Any, opts: ItemOptions, *, force: bool, resume: bool,
               storage_options: dict[str, Any] | None, stats: Stats, progress: ProgressFn | None,
               label: str) -> str:
    """Copy one unit; returns ``"copied"``, ``"resumed"`` or ``"skipped"``."""
    dest = open_destination(dst, storage_options)
    if resume and _committed(dest) and not force:
        return "skipped"
    unit = _Unit(src_kv, kind, opts)
    try:
        resumed = _prepare(dest, force, resume)
        journal = Journal(dest.write_kv)
        doc = _options_doc(opts)
        source = source_identity(src_kv)
        if resumed:
            journal.load(doc, source)
        else:
            journal.start(doc, source)
        total = unit.nbytes
        done = [0]
        lock = threading.Lock()

        def advance(n: int) -> None:  # called from the copy's threads
            with lock:
                done[0] += n
                now = done[0]
            if progress is not None:
                progress(now, total, label)

        advance(0)
        unit.run(dest, journal, stats, advance)
        what = changed(source, source_identity(src_kv))
        if what is not None:
            raise SourceChangedError(f"the source changed while it was being copied ({what} differs); the copy is "
                                     f"not committed: rerun it without --resume")
        journal.remove()
        unit.write_markers(dest)
        dest.write_kv.set(_MARKER, layout_writer.commit_marker(dest.display))
        if opts.sync:
            dest.sync()
        dest.commit(sync=opts.sync)
    finally:
        unit.close()
    return "resumed" if resumed else "copied"


def _copy_root_files(src_kv: KvStore, dst: Any, storage_options: dict[str, Any] | None) -> int:
    """A manager root's own files (``metadata/_ROOT_METADATA``...), as bytes."""
    dirs, keys = src_kv.list_dir("")
    for d in dirs:
        if parse_step_name(d) is None and TMP_SUFFIX not in d:
            keys.extend(src_kv.list(d + "/"))
    if not keys:
        return 0
    dst_kv = dst if isinstance(dst, KvStore) else open_kvstore(os.fspath(dst), storage_options)
    return copy_files(src_kv, dst_kv, keys)


def _units(src_kv: KvStore, dst: Any, steps: Iterable[int] | None) -> list[tuple[KvStore, Kind, Any, str]]:
    kind = classify(src_kv)
    if kind != Kind.ROOT:
        return [(src_kv, kind, dst, "")]
    entries = list_steps(src_kv)
    if steps is not None:
        want = set(steps)
        missing = want - {e.step for e in entries}
        if missing:
            raise NotFoundError(f"{src_kv.url}: no finalized step(s) {sorted(missing)} "
                                f"(have {[e.step for e in entries]})")
        entries = [e for e in entries if e.step in want]
    out: list[tuple[KvStore, Kind, Any, str]] = []
    for e in entries:
        sub = PrefixStore(src_kv, e.name)
        out.append((sub, classify(src_kv, e.name + "/"), _join(dst, e.name), e.name))
    return out


def copy(
    src: str | os.PathLike[str] | KvStore,
    dst: str | os.PathLike[str] | KvStore,
    *,
    use_ocdbt: bool | None = None,
    use_zarr3: bool | None = None,
    chunk_byte_size: int | None = None,
    ocdbt_target_data_file_size: int | None = None,
    compression: str | int | None = None,
    dtype: str | None = None,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    steps: Iterable[int] | None = None,
    workers: int | None = None,
    resume: bool = False,
    verify: bool = False,
    force: bool = False,
    sync: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Copy the Orbax checkpoint at ``src`` to ``dst``, converting its layout on the way.

    ``src`` is an item directory, a step directory or a CheckpointManager root (``steps``:
    which steps; default all), a local path, fsspec URL or KvStore; ``dst`` is where the copy
    goes (for a root: the new root, one directory per step).

    * ``use_ocdbt``: OCDBT (``True``) or the per-parameter layout (``False``); ``use_zarr3``:
      Zarr v3 or v2; ``None`` keeps the source's.
    * ``chunk_byte_size``: re-chunk every array as Orbax's ``SaveArgs(chunk_byte_size=)``;
      ``ocdbt_target_data_file_size``: data file size of OCDBT copies (Orbax's default 2 GiB,
      400 MiB on GCS), which also caps chunks as Orbax does.
    * ``compression``: ``"zstd:LEVEL"`` or ``"none"`` (default: as the source); ``dtype``:
      cast floating-point arrays (``"bfloat16"``, ``"float16"``, ``"float32"``...).
    * ``include``/``exclude``: glob patterns on array names (``params.layer0.*``).
    * Without options the layout is kept and chunks are copied as bytes; a change of Zarr
      version alone keeps the compressed frames; anything else decodes and encodes chunks.
    * ``storage_options``: fsspec options of ``src`` (and of ``dst`` when it has the same URL
      scheme); ``dst_storage_options``: of ``dst``.
    * ``workers``: threads, also the bound on chunks in flight (memory).
    * ``resume``: continue an interrupted copy (finished arrays and steps are skipped);
      ``force``: replace an existing destination; ``verify``: compare the copy with the source
      before committing it (CRC-32C of chunks moved as bytes, every value otherwise).

    Returns a summary (counts, bytes, seconds, per-unit status).
    """
    t0 = time.monotonic()
    so = dict(storage_options) if storage_options is not None else None
    dso = dict(dst_storage_options) if dst_storage_options is not None else (
        so if _scheme(src) == _scheme(dst) else None)
    if chunk_byte_size is not None and chunk_byte_size <= 0:
        raise ValueError("chunk_byte_size must be positive")
    if ocdbt_target_data_file_size is not None and ocdbt_target_data_file_size < 0:
        raise ValueError("ocdbt_target_data_file_size must be >= 0")
    level = parse_compression(compression)
    tfs = ocdbt_target_data_file_size
    if tfs is None:
        gcs = isinstance(dst, str) and dst.startswith(("gs://", "gcs://"))
        tfs = GCS_TARGET_DATA_FILE_SIZE if gcs else DEFAULT_TARGET_DATA_FILE_SIZE
    target = Target(use_zarr3, chunk_byte_size, tfs, level, cast_dtype(dtype) if dtype else None)
    opts = ItemOptions(target, use_ocdbt, level is not None, tuple(include), tuple(exclude),
                       workers or default_workers(), sync, verify)
    src_kv = src if isinstance(src, KvStore) else open_kvstore(os.fspath(src), so, read_only=True)
    stats = Stats()
    units = []
    plan = _units(src_kv, dst, steps)
    if plan and plan[0][3]:  # a manager root
        stats.add(bytes_written=_copy_root_files(src_kv, dst, dso))
    for sub, kind, where, label in plan:
        status = _copy_unit(sub, kind, where, opts, force=force, resume=resume, storage_options=dso,
                            stats=stats, progress=progress, label=label)
        units.append({"name": label, "kind": kind.value, "status": status})
    out: dict[str, Any] = {"src": str(getattr(src, "url", src)), "dst": str(getattr(dst, "url", dst)),
                           "units": units, "verified": verify, "seconds": round(time.monotonic() - t0, 3)}
    out.update(stats.as_dict())
    return out

