"""Garbage collection of data files (TensorStore has none).

Data files are immutable and never deleted by commits, so a database accumulates files that
only old versions, or no version at all, reference (superseded nodes and values; blobs of
failed or retried commits).  :func:`collect_garbage`:

1. Optionally drops old versions from the version history (``keep_versions`` newest
   generations, or those current at or after ``keep_since``).  The latest version is always
   kept.  Single manifest: the manifest is rewritten in place with a conditional write (same
   latest generation).  Numbered manifests: a new generation with the same tree records the
   shortened history.  Version-tree nodes that straddle the cut are rewritten.
2. Reads the latest manifest again and marks every data file it references: version-tree
   nodes, every node and out-of-line value of every version still in the history.
3. Deletes data files (``<prefix><32 hex digits>`` keys) that nothing references and that are
   older than ``grace_seconds``: a writer that has written data files but not yet committed
   its manifest is protected by the grace period, and a writer that loses the manifest race
   re-stages its values when its commit has taken a large part of the grace period.

Nested databases (a subdirectory with its own ``manifest.ocdbt``, like Orbax's
``ocdbt.process_*``) are never touched.  ``dry_run`` reports without changing anything; with a
version cut it lists the files only dropped versions reference, but not the version-tree
nodes that the real run rewrites (and then deletes).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from ocdbt_py.errors import ConditionFailedError, OcdbtError, UnsupportedError
from ocdbt_py.format.btree import InteriorNode, LeafNode
from ocdbt_py.format.data_file_table import IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest
from ocdbt_py.format.version_tree import (
    BtreeGenerationReference,
    VersionNodeReference,
    VersionTreeNode,
    encode_version_tree_node,
)
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.local import TMP_MARK
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.read.version_read import MANIFEST_KEY, all_versions
from ocdbt_py.store import OcdbtStore
from ocdbt_py.store import open as open_store
from ocdbt_py.timeutil import to_nanoseconds
from ocdbt_py.write.data_writer import DataWriter
from ocdbt_py.write.manifest_io import is_numbered
from ocdbt_py.write.version_tree_writer import add_generation, next_commit_time

__all__ = ["collect_garbage", "GcReport", "DEFAULT_GRACE_SECONDS"]

#: Unreferenced data files younger than this are kept (a commit may be about to use them).
DEFAULT_GRACE_SECONDS = 3600.0
_DATA_FILE = re.compile(r"[0-9a-f]{32}$")


@dataclasses.dataclass
class GcReport:
    """What :func:`collect_garbage` found and did (or would do, with ``dry_run``)."""

    url: str
    dry_run: bool
    kept_generations: list[int] = dataclasses.field(default_factory=list)
    dropped_generations: list[int] = dataclasses.field(default_factory=list)
    referenced_files: int = 0
    deleted: list[str] = dataclasses.field(default_factory=list)
    deleted_bytes: int = 0
    kept_young: list[str] = dataclasses.field(default_factory=list)
    #: temporary files of crashed writes (local directories), deleted with the data files
    temp_files: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line."""
        verb = "would delete" if self.dry_run else "deleted"
        dropped = len(self.dropped_generations)
        temp = f" and {len(self.temp_files)} stale temporary file(s)" if self.temp_files else ""
        return (
            f"{verb} {len(self.deleted)} data file(s){temp} ({self.deleted_bytes} bytes); "
            f"{'would drop' if self.dry_run else 'dropped'} {dropped} old version(s), kept "
            f"{len(self.kept_generations)}; {self.referenced_files} file(s) referenced; "
            f"{len(self.kept_young)} unreferenced file(s) kept as younger than the grace period"
        )


def _cutoff(
    versions: list[BtreeGenerationReference], keep_versions: int | None, keep_since_ns: int | None
) -> int:
    """The oldest generation to keep."""
    gens = [v.generation_number for v in versions]
    if keep_versions is not None:
        return gens[max(0, len(gens) - keep_versions)]
    if keep_since_ns is not None:
        current = [v.generation_number for v in versions if v.commit_time <= keep_since_ns]
        return current[-1] if current else gens[0]
    return gens[0]


class _HistoryPruner:
    """Rewrites the version tree so it holds only generations ``>= cutoff``."""

    def __init__(self, reader: NodeReader, cutoff: int, write: Callable[[bytes], IndirectDataReference]):
        self.reader = reader
        self.cutoff = cutoff
        self.write = write

    def node(self, ref: VersionNodeReference) -> VersionNodeReference | None:
        if ref.generation_number < self.cutoff:
            return None  # the whole subtree is older
        node = self.reader.version_node(ref.location, ref.height, ref.generation_number)
        level = self.reader.config.compression_level
        if node.height == 0:
            vs = tuple(v for v in node.versions if v.generation_number >= self.cutoff)
            if len(vs) == len(node.versions):
                return ref
            loc = self.write(encode_version_tree_node(VersionTreeNode(node.arity_log2, 0, versions=vs), level))
            return VersionNodeReference(ref.generation_number, loc, len(vs), vs[0].commit_time, 0)
        kids = []
        changed = False
        for c in node.children:
            nc = self.node(c)
            changed |= nc is not c
            if nc is not None:
                kids.append(nc)
        if not changed:
            return ref
        new = VersionTreeNode(node.arity_log2, node.height, children=tuple(kids))
        loc = self.write(encode_version_tree_node(new, level))
        return VersionNodeReference(
            ref.generation_number, loc, sum(k.num_generations for k in kids), kids[0].commit_time, ref.height
        )

    def manifest(self, m: Manifest) -> Manifest:
        versions = tuple(v for v in m.versions if v.generation_number >= self.cutoff) or (m.latest,)
        refs = [self.node(r) for r in m.version_nodes]
        return Manifest(m.config, versions, tuple(r for r in refs if r is not None))


def _prune_history(db: Any, keep_versions: int | None, keep_since_ns: int | None, report: GcReport) -> None:
    """Commit a manifest without the generations older than the cut."""
    writer = db._writer
    with writer._lock:
        for _attempt in range(writer.max_retries + 1):
            state = writer._read()
            m = state.manifest
            if m is None:
                return
            reader = writer.reader(m.config)
            versions = list(all_versions(reader, m))
            cutoff = _cutoff(versions, keep_versions, keep_since_ns)
            dropped = [v.generation_number for v in versions if v.generation_number < cutoff]
            if not dropped:
                return
            out = DataWriter(writer.kv, writer.options.version_tree_node_data_prefix,
                             writer.options.target_data_file_size)
            new = _HistoryPruner(reader, cutoff, out.append).manifest(m)
            if is_numbered(m.config):
                latest = m.latest
                same_tree = dataclasses.replace(latest, commit_time=next_commit_time(m))

                def read_node(ref: VersionNodeReference, rd: NodeReader = reader) -> VersionTreeNode:
                    return rd.version_node(ref.location, ref.height, ref.generation_number)

                new = add_generation(new, same_tree, read_node=read_node, write=out.append)
            out.flush()
            written = writer.io.try_write(state, new, reader)
            if written is not None:
                writer._state = written
                report.dropped_generations = dropped
                return
            writer.conflicts += 1
        raise ConditionFailedError("gave up pruning the version history: the manifest kept changing")


def _referenced(reader: NodeReader, m: Manifest, min_generation: int = 0) -> tuple[set[str], list[int]]:
    """Keys of the data files the manifest reaches (version nodes, and the trees of the
    generations ``>= min_generation``), and the generations it holds."""
    files: set[str] = set()
    seen_nodes: set[IndirectDataReference] = set()
    gens: list[int] = []
    stack: list[VersionNodeReference] = list(m.version_nodes)
    while stack:
        ref = stack.pop()
        files.add(reader.file_key(ref.location.file))
        node = reader.version_node(ref.location, ref.height, ref.generation_number)
        stack.extend(node.children)
    for v in all_versions(reader, m):
        gens.append(v.generation_number)
        if v.root is None or v.generation_number < min_generation:
            continue
        for loc, node, _prefix in _walk_unseen(reader, v, seen_nodes):
            files.add(reader.file_key(loc.file))
            if isinstance(node, LeafNode):
                for val in node.values:
                    if isinstance(val, IndirectDataReference) and val.length:
                        files.add(reader.file_key(val.file))
    return files, sorted(gens)


def _walk_unseen(
    reader: NodeReader, v: BtreeGenerationReference, seen: set[IndirectDataReference]
) -> Iterator[Any]:
    """Every node of ``v``'s tree, skipping subtrees already visited through another version."""
    assert v.root is not None
    if v.root in seen:
        return
    stack: list[tuple[IndirectDataReference, int]] = [(v.root, v.root_height)]
    while stack:
        ref, h = stack.pop()
        if ref in seen:
            continue
        seen.add(ref)
        node = reader.btree_node(ref, h)
        yield ref, node, b""
        if isinstance(node, InteriorNode):
            stack.extend((c.location, h - 1) for c in node.children if c.location not in seen)


def _age_seconds(kv: KvStore, key: str, now: float) -> float | None:
    """Seconds since ``key`` was last modified, or ``None`` when the backend cannot tell."""
    path = kv.local_path(key)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return now - st.st_mtime


def _candidates(kv: KvStore) -> Iterator[str]:
    """Data-file keys of this database (not of nested databases, not manifests)."""
    keys = list(kv.list())
    nested = sorted(
        k[: -len(MANIFEST_KEY)] for k in keys if k.endswith("/" + MANIFEST_KEY)
    )
    for k in keys:
        if k.startswith("manifest.") or not _DATA_FILE.search(k):
            continue
        if any(k.startswith(n) for n in nested):
            continue
        yield k


def _inside_parent_database(kv: KvStore) -> bool:
    root = kv.local_path()
    if root is None:
        return False
    parent = os.path.dirname(root.rstrip(os.sep))
    return os.path.exists(os.path.join(parent, MANIFEST_KEY))


def collect_garbage(
    location: Any,
    *,
    keep_versions: int | None = None,
    keep_since: Any = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    dry_run: bool = False,
    storage_options: dict[str, Any] | None = None,
    force: bool = False,
    now: float | None = None,
) -> GcReport:
    """Delete data files no kept version references; see the module docstring.

    ``location`` is a path, URL, :class:`KvStore` or open store.  ``keep_versions`` (>= 1) and
    ``keep_since`` (ISO-8601 time or ``datetime``) are exclusive; with neither, every version
    is kept and only unreferenced files go.  A database inside another one (Orbax's
    per-process databases, whose files the parent references) is refused unless ``force``.
    """
    if keep_versions is not None and keep_since is not None:
        raise ValueError("give keep_versions or keep_since, not both")
    if keep_versions is not None and (isinstance(keep_versions, bool) or keep_versions < 1):
        raise ValueError("keep_versions must be at least 1")
    if grace_seconds < 0:
        raise ValueError("grace_seconds must not be negative")
    since_ns = None if keep_since is None else to_nanoseconds(keep_since)
    if isinstance(location, OcdbtStore):
        kv = location.kvstore
    else:
        kv = open_kvstore(location, storage_options, read_only=dry_run)
    report = GcReport(kv.url, dry_run)
    if _inside_parent_database(kv) and not force:
        raise UnsupportedError(
            f"{kv.url} lies inside another OCDBT database that may reference its files; "
            f"pass force=True (--force) to collect garbage anyway"
        )
    if dry_run:
        db = open_store(kv)
        versions = db.versions()
        refs = [BtreeGenerationReference(v.generation, v.root, v.root_height,
                                         _stats(v), v.commit_time_ns) for v in versions]
        if refs:
            cutoff = _cutoff(refs, keep_versions, since_ns)
            report.dropped_generations = [v.generation for v in versions if v.generation < cutoff]
    else:
        db = open_store(kv, mode="a")
        if db.manifest.versions and (keep_versions is not None or since_ns is not None):
            _prune_history(db, keep_versions, since_ns, report)
        db.refresh()
    manifest = db.manifest
    if not manifest.versions:
        return report
    reader = NodeReader(kv, manifest.config)
    keep_from = min((g for g in _all_gens(reader, manifest) if g not in set(report.dropped_generations)),
                    default=0) if dry_run else 0
    files, gens = _referenced(reader, manifest, keep_from)
    report.referenced_files = len(files)
    dropped = set(report.dropped_generations)
    report.kept_generations = [g for g in gens if g not in dropped] if dry_run else gens
    clock = time.time() if now is None else now
    for key in _candidates(kv):
        if key in files:
            continue
        age = _age_seconds(kv, key, clock)
        if grace_seconds > 0 and (age is None or age < grace_seconds):
            report.kept_young.append(key)
            continue
        size = kv.size(key)
        report.deleted.append(key)
        report.deleted_bytes += size or 0
        if not dry_run:
            try:
                kv.delete(key)
            except (OcdbtError, OSError) as e:
                report.errors.append(f"{key}: {e}")
    _remove_stale_temp_files(kv, clock, grace_seconds, dry_run, report)
    return report


def _remove_stale_temp_files(kv: KvStore, now: float, grace: float, dry_run: bool, report: GcReport) -> None:
    """Local directories: temporary files of writes that crashed before their rename."""
    root = kv.local_path()
    if root is None:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.exists(os.path.join(dirpath, MANIFEST_KEY)) and os.path.abspath(dirpath) != root:
            dirnames[:] = []  # a nested database: not ours
            continue
        for name in filenames:
            if TMP_MARK not in name:
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            if now - st.st_mtime < grace:
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            report.temp_files.append(rel)
            report.deleted_bytes += st.st_size
            if not dry_run:
                try:
                    os.unlink(full)
                except OSError as e:
                    report.errors.append(f"{rel}: {e}")


def _all_gens(reader: NodeReader, m: Manifest) -> list[int]:
    return [v.generation_number for v in all_versions(reader, m)]


def _stats(v: Any) -> Any:
    return Statistics(v.num_keys, v.num_tree_bytes, v.num_indirect_value_bytes)
