"""Integrity check of a whole OCDBT database: :func:`verify`.

The check reads every generation reachable from the manifest (its inline versions and the
version tree), then walks the B+tree of every generation and

* decodes every node (envelope, CRC-32C, zstd bounds, column layout; the decoders check these),
* checks every node's height against its parent's,
* checks key order *across* nodes: a child's keys lie within its parent entry's range
  ``[entry key, next entry key)``, so a child's first key is at least the entry key,
* checks the statistics (``num_keys``, ``num_tree_bytes``, ``num_indirect_value_bytes``)
  stored in each parent entry and in each version's root reference against the node they
  reference (a leaf's own content, or an interior node's length plus the statistics it
  stores for its children, so a wrong number is reported where it is stored),
* checks that every referenced byte range (nodes and out-of-line values) lies within its
  data file, asking each file's size once.

A node reached twice within one generation's tree (parent entries sharing a subtree: a DAG,
which TensorStore never writes and which can make a few KB describe 10^9 keys) is reported
once and not walked again.  Nodes shared between generations are checked once (by
location).  Problems are collected
rather than raised, up to ``max_problems``; a missing or truncated data file is one problem
that counts the references it breaks.  Memory stays bounded: nodes are decoded a window at a
time and only small per-node summaries (capped in number) are remembered.

>>> from ocdbt_py.maintenance.verify import verify
>>> report = verify("/path/to/db")          # doctest: +SKIP
>>> report.ok, report.nodes, [str(p) for p in report.problems]   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from ocdbt_py.errors import CorruptionError, OcdbtError
from ocdbt_py.format.btree import BtreeNode, InteriorNode, LeafNode, decode_btree_node
from ocdbt_py.format.data_file_table import IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest
from ocdbt_py.format.version_tree import BtreeGenerationReference, VersionNodeReference
from ocdbt_py.keys import escape_key
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.maintenance.verify_data import DataReport, verify_data
from ocdbt_py.read.cache import LruCache
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.read.version_read import find_generation, read_manifest
from ocdbt_py.store import OcdbtStore
from ocdbt_py.units import human_bytes

if TYPE_CHECKING:
    from ocdbt_py.read.node_reader import NodeReader
    from ocdbt_py.store import OcdbtStore

__all__ = ["verify", "VerifyReport", "Problem"]

_SATURATE = (1 << 64) - 1
#: Bytes of encoded nodes fetched at once per tree level (and at most this many nodes).
_WINDOW_BYTES = 16 << 20
_WINDOW_NODES = 16
#: Approximate bytes of node summaries remembered to skip subtrees shared between generations
#: (oldest forgotten first; a forgotten shared subtree is simply checked again).
_MEMO_BYTES = 64 << 20
#: Distinct data files whose sizes are remembered.
_SIZE_CACHE_LIMIT = 1 << 20


@dataclasses.dataclass
class Problem:
    """One thing found wrong.

    ``file`` is the data file (a key relative to the database root), the manifest key, or
    ``None`` when the problem is not about one file; ``offset`` is a byte position in it when
    known; ``generation`` is the first generation whose walk met the problem.
    """

    file: str | None
    message: str
    offset: int | None = None
    generation: int | None = None

    @property
    def location(self) -> str:
        """``file`` with the offset, e.g. ``d/1a2b...@1024`` (or ``-`` when there is none)."""
        if self.file is None:
            return "-" if self.offset is None else f"@{self.offset}"
        return self.file if self.offset is None else f"{self.file}@{self.offset}"

    def __str__(self) -> str:
        gen = "" if self.generation is None else f" [generation {self.generation}]"
        return f"{self.location}: {self.message}{gen}"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (``location`` included)."""
        out = dataclasses.asdict(self)
        out["location"] = self.location
        return out


@dataclasses.dataclass
class VerifyReport:
    """The result of :func:`verify`: problems found and what was checked.

    ``complete`` is false when the walk stopped early because ``max_problems`` were found.
    Counts are of distinct objects: a node shared by several generations counts once.
    """

    url: str
    problems: list[Problem] = dataclasses.field(default_factory=list)
    versions: int = 0
    versions_expected: int = 0
    version_nodes: int = 0
    nodes: int = 0
    node_bytes: int = 0
    values: int = 0
    indirect_values: int = 0
    value_bytes: int = 0
    data_files: int = 0
    complete: bool = True
    #: with ``verify(data=True)``: the chunk decoding pass (:mod:`.verify_data`)
    data: DataReport | None = None

    @property
    def ok(self) -> bool:
        """True when no problem was found (nor a chunk that fails to decode)."""
        return not self.problems and (self.data is None or self.data.ok)

    @property
    def bytes_checked(self) -> int:
        """Encoded node bytes read and checksummed plus out-of-line value bytes range-checked."""
        return self.node_bytes + self.value_bytes

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (problems as objects)."""
        out = dataclasses.asdict(self)
        out["problems"] = [p.to_json() for p in self.problems]
        out["data"] = None if self.data is None else self.data.to_json()
        out["ok"] = self.ok
        out["bytes_checked"] = self.bytes_checked
        out["values_checksummed"] = None if self.data is None else self.data.values_checksummed
        return out

    def summary(self) -> str:
        """One line saying what was checked."""
        of = f" of {self.versions_expected}" if self.versions_expected > self.versions else ""
        return (
            f"checked {self.versions}{of} version{_s(self.versions_expected or self.versions)}, "
            f"{self.nodes} b+tree node{_s(self.nodes)} ({human_bytes(self.node_bytes)}), "
            f"{self.version_nodes} version node{_s(self.version_nodes)}, "
            f"{self.values} value{_s(self.values)} ({self.indirect_values} out of line, "
            f"{human_bytes(self.value_bytes)}) in {self.data_files} data file{_s(self.data_files)}"
        )

    def format(self) -> str:
        """A human-readable multi-line report."""
        lines = []
        if self.ok:
            lines.append(f"OK: {self.url}")
        elif not self.problems and self.data is not None:  # the structure is sound, some values are not
            n = len(self.data.problems)
            lines.append(f"FAILED: {self.url}: {n} chunk{' does' if n == 1 else 's do'} not decode")
        else:
            more = "" if self.complete else f" (stopped after the first {len(self.problems)})"
            n = len(self.problems)
            lines.append(f"FAILED: {self.url}: {n} problem{_s(n)}{more}")
            lines.extend(f"  {p}" for p in self.problems)
        lines.append(self.summary())
        if self.data is not None:
            lines.append(self.data.format())
        return "\n".join(lines)


def _s(n: int) -> str:
    return "" if n == 1 else "s"


class _Stop(Exception):
    """Raised internally once ``max_problems`` problems were recorded."""


class _Summary(NamedTuple):
    """What a checked subtree looks like to its parents (memoized per location and prefix)."""

    height: int
    first: bytes  # the node's first full key
    last: bytes | None  # the subtree's last full key (None: unknown, a part was unreadable)
    stats: Statistics  # the node's own content: its leaf entries, or length + children's stats


_BAD = _Summary(-1, b"", None, Statistics(0, 0, 0))


def _add(a: Statistics, b: Statistics) -> Statistics:
    return Statistics(
        min(a.num_keys + b.num_keys, _SATURATE),
        min(a.num_tree_bytes + b.num_tree_bytes, _SATURATE),
        min(a.num_indirect_value_bytes + b.num_indirect_value_bytes, _SATURATE),
    )


def _fmt_stats(s: Statistics) -> str:
    return (f"num_keys={s.num_keys}, num_tree_bytes={s.num_tree_bytes}, "
            f"num_indirect_value_bytes={s.num_indirect_value_bytes}")


def _fmt_key(k: bytes) -> str:

    s = escape_key(k)
    return repr(s if len(s) <= 80 else s[:77] + "...")


def _weight(mkey: tuple[IndirectDataReference, bytes], s: _Summary) -> int:
    ref, prefix = mkey
    return 400 + len(ref.file.path) + len(prefix) + len(s.first) + len(s.last or b"")


class _FileState:
    """Size of one data file and the problem recorded against it, if any."""

    __slots__ = ("size", "problem", "refs", "bad_refs", "what")

    def __init__(self, size: int | None):
        self.size = size
        self.problem: Problem | None = None
        self.refs = 0
        self.bad_refs = 0
        self.what = ""


class _Verifier:
    def __init__(
        self,
        kv: KvStore,
        reader: NodeReader,
        report: VerifyReport,
        max_problems: int,
        progress: Callable[[VerifyReport], None] | None,
    ):
        self.kv = kv
        self.reader = reader
        self.report = report
        self.max_problems = max(1, max_problems)
        self.progress = progress
        self.files: dict[str, _FileState] = {}
        self.memo: OrderedDict[tuple[IndirectDataReference, bytes], _Summary] = OrderedDict()
        self.memo_bytes = 0
        self.generation: int | None = None
        #: (file, offset) of every b+tree node reached in the current generation's walk
        self.gen_nodes: set[tuple[object, int]] = set()

    # -- problems ----------------------------------------------------------------------------
    def problem(self, file: str | None | Problem, message: str = "", offset: int | None = None) -> None:
        p = file if isinstance(file, Problem) else Problem(file, message, offset, self.generation)
        self.report.problems.append(p)
        if len(self.report.problems) >= self.max_problems:
            raise _Stop

    def corruption(self, e: BaseException, file: str | None, offset: int | None, what: str) -> None:
        if isinstance(e, CorruptionError):
            reason = e.reason
            if not reason.startswith(what.split(" (")[0]) and what.split(" (")[0] not in reason:
                reason = f"{what}: {reason}"
            if e.offset is not None and e.offset != offset:
                reason += f" (at byte {e.offset})"
            self.problem(file, reason, offset if offset is not None else e.offset)
        elif isinstance(e, OcdbtError):
            self.problem(file, f"{what}: {e}", offset)
        else:  # a decoder bug must not hide the rest of the report
            self.problem(file, f"{what}: unexpected {type(e).__name__}: {e}", offset)

    def tick(self) -> None:
        if self.progress is not None:
            self.progress(self.report)

    # -- data files ----------------------------------------------------------------------------
    def _file(self, key: str) -> _FileState:
        st = self.files.get(key)
        if st is None:
            try:
                size = self.kv.size(key)
            except OcdbtError as e:
                st = _FileState(None)
                self._remember(key, st)
                st.what = f"cannot read the data file's size: {e}"
                st.problem = Problem(key, st.what, None, self.generation)
                self.problem(st.problem)
                return st
            st = _FileState(size)
            self._remember(key, st)
            self.report.data_files += 1
        return st

    def _remember(self, key: str, st: _FileState) -> None:
        if len(self.files) >= _SIZE_CACHE_LIMIT:
            self.files.clear()
        self.files[key] = st

    def check_range(self, ref: IndirectDataReference, what: str) -> str | None:
        """The validated file key if ``ref`` lies within an existing file, else ``None``.

        A missing or too-short file is reported once; later references to it are counted.
        """
        try:
            key = self.reader.file_key(ref.file)
        except CorruptionError as e:
            self.problem(None, f"{what} references an invalid data file path: {e.reason}")
            return None
        st = self._file(key)
        st.refs += 1
        if st.size is not None and ref.offset + ref.length <= st.size:
            return key
        st.bad_refs += 1
        if st.problem is None:
            if st.size is None:
                msg = f"data file is missing (referenced by a {what})"
            else:
                msg = (f"data file is truncated or too short: {st.size} bytes, but a {what} "
                       f"references bytes {ref.offset}..{ref.offset + ref.length}")
            st.what = msg
            st.problem = Problem(key, msg, None if st.size is None else ref.offset, self.generation)
            self.problem(st.problem)
        else:
            st.problem.message = f"{st.what}; {st.bad_refs} references in all are unreadable"
        return None

    # -- version tree ------------------------------------------------------------------------------
    def versions(self, manifest: Manifest) -> Iterator[BtreeGenerationReference]:
        """Every generation reachable, oldest first; unreadable version nodes become problems."""
        last = 0
        for ref in manifest.version_nodes:
            for v in self._version_subtree(ref):
                if v.generation_number <= last:
                    self.problem(None, f"generation {v.generation_number} follows generation {last} "
                                 "in the version tree (not increasing)")
                last = v.generation_number
                yield v
        for v in manifest.versions:
            if v.generation_number <= last:
                self.problem(None, f"inline generation {v.generation_number} is not newer than "
                             f"generation {last} in the version tree")
            last = v.generation_number
            yield v

    def _version_subtree(self, top: VersionNodeReference) -> Iterator[BtreeGenerationReference]:
        stack = [top]
        while stack:
            r = stack.pop()
            self.generation = None  # problems here belong to no single generation
            loc = r.location
            key = self.check_range(loc, "version tree node")
            if key is None:
                continue
            try:
                node = self.reader.version_node(loc, r.height, r.generation_number)
            except Exception as e:
                self.corruption(e, key, loc.offset, "version tree node")
                continue
            self.report.version_nodes += 1
            if node.height == 0:
                got = len(node.versions)
                first_time = node.versions[0].commit_time
            else:
                got = sum(c.num_generations for c in node.children)
                first_time = node.children[0].commit_time
            if got != r.num_generations:
                self.problem(key, f"version tree node holds {got} generations, its reference says "
                             f"{r.num_generations}", loc.offset)
            if first_time != r.commit_time:
                self.problem(key, f"version tree node's earliest commit time is {first_time}, its "
                             f"reference says {r.commit_time}", loc.offset)
            if node.height == 0:
                yield from node.versions
            else:
                stack.extend(reversed(node.children))
            self.tick()

    # -- b+tree ---------------------------------------------------------------------------------------
    def version(self, v: BtreeGenerationReference) -> None:
        self.generation = v.generation_number
        self.report.versions += 1
        self.gen_nodes = set()
        if v.root is not None:
            s = self.subtree(v.root, v.root_height, b"", b"", None, None)
            if s is not None and s.stats != v.statistics:
                key = self.reader.file_key(v.root.file)
                self.problem(key, f"statistics of generation {v.generation_number}'s root are wrong: "
                             f"the version says {_fmt_stats(v.statistics)}, the tree has "
                             f"{_fmt_stats(s.stats)}", v.root.offset)
        self.tick()

    def _load(self, ref: IndirectDataReference, height: int, data: bytes | None) -> tuple[str, BtreeNode] | None:
        what = "b+tree node" if height == 0 else f"b+tree node (height {height})"
        if ref.length == 0:
            self.problem(None, f"{what} reference of length 0")
            return None
        key = self.check_range(ref, "b+tree node")
        if key is None:
            return None
        if ref.length > self.reader.node_limit + (self.reader.node_limit >> 3) + 4096:
            self.problem(key, f"{what} of {ref.length} bytes exceeds the node size limit", ref.offset)
            return None
        if data is None:
            try:
                data = self.kv.get(key, (ref.offset, ref.offset + ref.length))
            except OcdbtError as e:
                self.problem(key, f"cannot read {what}: {e}", ref.offset)
                return None
        if data is None or len(data) != ref.length:
            got = "nothing" if data is None else f"{len(data)} bytes"
            self.problem(key, f"reading {what} of {ref.length} bytes returned {got}", ref.offset)
            return None
        try:
            node = decode_btree_node(data, transitive=ref.file.base_path, max_body=self.reader.node_limit,
                                     path=key, base=ref.offset)
        except Exception as e:
            self.corruption(e, key, ref.offset, what)
            return None
        self.report.nodes += 1
        self.report.node_bytes += ref.length
        if node.height != height:
            self.problem(key, f"b+tree node has height {node.height}, its parent expects {height}", ref.offset)
            return None
        return key, node

    def _prefetch(self, refs: list[IndirectDataReference]) -> list[bytes | None]:
        """Fetch several nodes' bytes concurrently (``None`` where not fetched: read singly later)."""
        reqs: list[tuple[str, tuple[int, int]]] = []
        idx: list[int] = []
        for i, ref in enumerate(refs):
            try:
                key = self.reader.file_key(ref.file)
            except CorruptionError:
                continue
            st = self.files.get(key)
            if st is None or st.size is None or ref.offset + ref.length > st.size or ref.length == 0:
                continue
            reqs.append((key, (ref.offset, ref.offset + ref.length)))
            idx.append(i)
        out: list[bytes | None] = [None] * len(refs)
        if len(reqs) > 1:
            try:
                results = self.kv.get_many(reqs)
            except OcdbtError:
                return out  # read one by one to attribute the error
            for i, d in zip(idx, results):
                out[i] = d
        return out

    def subtree(
        self,
        ref: IndirectDataReference,
        height: int,
        prefix: bytes,
        lo: bytes,
        hi: bytes | None,
        data: bytes | None,
    ) -> _Summary | None:
        """Check the subtree at ``ref``; ``None`` if its root node is unreadable (or shared)."""
        loc = (ref.file, ref.offset)
        if loc in self.gen_nodes:
            self.problem(self.reader.file_key(ref.file), "b+tree node is shared: a second parent entry "
                         "references it in the same generation (a DAG, not a tree); not walked again",
                         ref.offset)
            return None
        self.gen_nodes.add(loc)
        mkey = (ref, prefix)
        s = self.memo.get(mkey)
        if s is None:
            s = self._check_node(ref, height, prefix, data)
            self._memorize(mkey, s)
        if s is _BAD:
            return None
        key = self.reader.file_key(ref.file)
        if s.height != height:
            self.problem(key, f"b+tree node has height {s.height}, its parent expects {height}", ref.offset)
            return None
        if s.first < lo:
            self.problem(key, f"b+tree node's first key {_fmt_key(s.first)} is below its parent entry's "
                         f"key {_fmt_key(lo)}", ref.offset)
        if hi is not None and s.last is not None and s.last >= hi:
            self.problem(key, f"subtree's last key {_fmt_key(s.last)} is not below the next parent "
                         f"entry's key {_fmt_key(hi)}", ref.offset)
        return s

    def _memorize(self, mkey: tuple[IndirectDataReference, bytes], s: _Summary) -> None:
        self.memo[mkey] = s
        self.memo_bytes += _weight(mkey, s)
        while self.memo_bytes > _MEMO_BYTES and len(self.memo) > 1:
            k, old = self.memo.popitem(last=False)
            self.memo_bytes -= _weight(k, old)

    def _check_node(self, ref: IndirectDataReference, height: int, prefix: bytes, data: bytes | None) -> _Summary:
        loaded = self._load(ref, height, data)
        self.tick()
        if loaded is None:
            return _BAD
        key, node = loaded
        first = prefix + node.keys[0]
        if isinstance(node, LeafNode):
            return self._check_leaf(node, prefix, first, ref)
        return self._check_interior(key, node, prefix, first, ref)

    def _check_leaf(self, node: LeafNode, prefix: bytes, first: bytes, ref: IndirectDataReference) -> _Summary:
        indirect = 0
        rep = self.report
        rep.values += len(node.values)
        for v in node.values:
            if isinstance(v, IndirectDataReference):
                rep.indirect_values += 1
                indirect += v.length
                if v.length:
                    rep.value_bytes += v.length
                    self.check_range(v, "value")
        stats = Statistics(len(node.keys), ref.length, min(indirect, _SATURATE))
        return _Summary(0, first, prefix + node.keys[-1], stats)

    def _check_interior(
        self, key: str, node: InteriorNode, prefix: bytes, first: bytes, ref: IndirectDataReference
    ) -> _Summary:
        n = len(node.keys)
        full = [prefix + k for k in node.keys]
        cpre = [prefix + k[:scp] for k, scp in zip(node.keys, node.subtree_prefix_lengths)]
        total = Statistics(0, ref.length, 0)
        last: bytes | None = None
        i = 0
        while i < n:
            # a window of children whose nodes are fetched together
            j = i
            nbytes = 0
            todo: list[int] = []
            while j < n and j - i < _WINDOW_NODES and nbytes < _WINDOW_BYTES:
                loc = node.children[j].location
                if (loc, cpre[j]) not in self.memo:
                    todo.append(j)
                    nbytes += loc.length
                    try:  # learn the file's size before fetching
                        self._file(self.reader.file_key(loc.file))
                    except CorruptionError:
                        pass  # reported when the child is visited
                j += 1
            fetched = dict(zip(todo, self._prefetch([node.children[w].location for w in todo])))
            for w in range(i, j):
                child = node.children[w]
                s = self.subtree(child.location, node.height - 1, cpre[w], full[w],
                                 full[w + 1] if w + 1 < n else None, fetched.pop(w, None))
                total = _add(total, child.statistics)
                if s is None:
                    last = None
                    continue
                last = s.last
                if s.stats != child.statistics:
                    ckey = self.reader.file_key(child.location.file)
                    self.problem(
                        ckey,
                        f"statistics stored for this child (entry {w} of the node at {key}@{ref.offset}) "
                        f"are wrong: the entry says {_fmt_stats(child.statistics)}, the child has "
                        f"{_fmt_stats(s.stats)}",
                        child.location.offset,
                    )
            i = j
        return _Summary(node.height, first, last, total)


def verify(
    db_or_url: OcdbtStore | KvStore | str | os.PathLike[str],
    *,
    all_versions: bool = True,
    progress: Callable[[VerifyReport], None] | None = None,
    max_problems: int = 100,
    storage_options: dict[str, Any] | None = None,
    data: bool = False,
) -> VerifyReport:
    """Check the integrity of an OCDBT database; see the module docstring for what is checked.

    ``db_or_url`` is an open :class:`~ocdbt_py.store.OcdbtStore`, a :class:`KvStore`, a path or
    an fsspec URL.  With ``all_versions=False`` only one generation is walked: the store's
    selected version, or the latest for a location.  ``progress`` is called often with the
    report being filled in.  Returns a :class:`VerifyReport` (a corrupt manifest is a problem
    too); raises :class:`~ocdbt_py.errors.NotFoundError` when there is no database at all.
    With ``data=True`` every chunk of every Zarr array in the selected (or latest) version is
    decoded too, once the structure is clean (:func:`~.verify_data.verify_data`; the result
    is ``report.data``).
    """

    selected: int | None = None
    if isinstance(db_or_url, OcdbtStore):
        kv = db_or_url.kvstore
        report = VerifyReport(kv.url)
        manifest = db_or_url.manifest
        if not all_versions:
            selected = db_or_url.generation
    else:
        kv = open_kvstore(db_or_url, storage_options, read_only=True)
        report = VerifyReport(kv.url)
        try:
            manifest, _ = read_manifest(kv)
        except CorruptionError as e:
            report.problems.append(Problem(e.path, f"manifest: {e.reason}", e.offset))
            return report
        if not all_versions and manifest.versions:
            selected = manifest.versions[-1].generation_number
    reader = NodeReader(kv, manifest.config, LruCache(8 << 20))
    v = _Verifier(kv, reader, report, max_problems, progress)
    # the walk recurses a few frames per tree level, and a tree may be 255 levels high
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2000))
    try:
        if all_versions:
            report.versions_expected = len(manifest.versions) + sum(
                r.num_generations for r in manifest.version_nodes
            )
            for gen in v.versions(manifest):
                v.version(gen)
        elif selected:
            report.versions_expected = 1
            try:
                gen = find_generation(reader, manifest, selected)
            except OcdbtError as e:
                v.corruption(e, None, None, f"finding generation {selected}")
            else:
                v.version(gen)
    except _Stop:
        report.complete = False
    finally:
        sys.setrecursionlimit(limit)
    if data and not report.problems:
        target = db_or_url if isinstance(db_or_url, OcdbtStore) else OcdbtStore(kv)

        def data_progress(d: DataReport) -> None:
            report.data = d
            if progress is not None:
                progress(report)

        report.data = verify_data(target, max_problems=max_problems, progress=data_progress)
    return report
