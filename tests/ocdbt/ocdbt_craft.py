"""Test-only builder of small OCDBT databases from our own encoders.

It lets tests craft databases TensorStore would never write (hostile data-file paths, base
and transitive paths, broken trees) and build legal ones without TensorStore.  It is *not*
the project's writer: trees are bulk-built with a fixed fan-out, and the version tree only
covers what :func:`build_version_tree` documents.
"""

from __future__ import annotations

import dataclasses
import os

from ocdbt_py.format.btree import BtreeChild, encode_interior_node, encode_leaf_node
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest, encode_manifest
from ocdbt_py.format.version_tree import (
    BtreeGenerationReference,
    VersionNodeReference,
    VersionTreeNode,
    encode_version_tree_node,
    manifest_version_node_ranges,
)

__all__ = [
    "DbFiles",
    "Tree",
    "build_tree",
    "build_version_tree",
    "generation",
    "single_manifest",
    "write_dir",
    "common_prefix",
    "RAW",
]

#: A config whose nodes are stored uncompressed.
RAW = Config(uuid=bytes(range(16)), compression_level=None)


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DbFiles:
    """The files of a database being built: ``name -> bytes``, with append-only data files."""

    def __init__(self) -> None:
        self.files: dict[str, bytearray] = {}

    def append(self, blob: bytes, file: DataFileId | str = "d/data") -> IndirectDataReference:
        """Append ``blob`` to a data file and return its reference.

        ``file`` may be a :class:`DataFileId` whose (base + relative) path names the file; the
        reference keeps the id as given, so base paths can be tested.
        """
        fid = file if isinstance(file, DataFileId) else DataFileId(b"", file.encode())
        buf = self.files.setdefault(fid.path.decode("utf-8", "surrogateescape"), bytearray())
        off = len(buf)
        buf += blob
        return IndirectDataReference(fid, off, len(blob))

    def put(self, name: str, data: bytes) -> None:
        """Store a whole file (e.g. a manifest)."""
        self.files[name] = bytearray(data)

    def as_dict(self) -> dict[str, bytes]:
        """Snapshot of every file."""
        return {k: bytes(v) for k, v in self.files.items()}


@dataclasses.dataclass
class Tree:
    """A built B+tree: where its root is and its statistics."""

    root: IndirectDataReference | None
    height: int
    stats: Statistics


def _chunks(seq: list, size: int) -> list[list]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


def build_tree(
    db: DbFiles,
    items: dict[bytes, bytes],
    *,
    fanout: int = 4,
    inline_limit: int = 100,
    zstd_level: int | None = None,
    node_file: DataFileId | str = "d/nodes",
    value_file: DataFileId | str = "d/values",
    min_height: int = 0,
) -> Tree:
    """Bulk-build a B+tree of ``items`` with ``fanout`` entries per node.

    Non-root nodes drop the common prefix of their first and last key (as TensorStore does),
    so prefix handling is exercised.  ``min_height`` stacks single-child interior nodes on
    top (legal: TensorStore never shrinks a tree).
    """
    if fanout < 2:
        raise ValueError("fanout must be at least 2")
    if not items:
        return Tree(None, 0, Statistics(0, 0, 0))
    keys = sorted(items)
    values: list[bytes | IndirectDataReference] = []
    for k in keys:
        v = items[k]
        values.append(v if len(v) <= inline_limit else db.append(v, value_file))
    # level entries: (full first key, excluded prefix length (full), ref, stats)
    leaves = _chunks(list(zip(keys, values)), fanout)
    only_root = len(leaves) == 1 and min_height == 0
    level: list[tuple[bytes, int, IndirectDataReference, Statistics]] = []
    for chunk in leaves:
        first, last = chunk[0][0], chunk[-1][0]
        ex = 0 if only_root else common_prefix(first, last)
        blob = encode_leaf_node([k[ex:] for k, _ in chunk], [v for _, v in chunk], zstd_level)
        ref = db.append(blob, node_file)
        ind = sum(v.length for _, v in chunk if isinstance(v, IndirectDataReference))
        level.append((first, ex, ref, Statistics(len(chunk), len(blob), ind)))
    height = 0
    while len(level) > 1 or height < min_height:
        height += 1
        groups = _chunks(level, fanout)
        single = len(groups) == 1 and height >= min_height
        nxt = []
        for group in groups:
            first, last = group[0][0], group[-1][0]
            ex = 0 if single else min(common_prefix(first, last), min(e[1] for e in group))
            children = [BtreeChild(e[2], e[3]) for e in group]
            blob = encode_interior_node(
                height, [e[0][ex:] for e in group], [e[1] - ex for e in group], children, zstd_level
            )
            ref = db.append(blob, node_file)
            stats = Statistics(
                sum(e[3].num_keys for e in group),
                len(blob) + sum(e[3].num_tree_bytes for e in group),
                sum(e[3].num_indirect_value_bytes for e in group),
            )
            nxt.append((first, ex, ref, stats))
        level = nxt
    _, _, ref, stats = level[0]
    return Tree(ref, height, stats)


def generation(gen: int, tree: Tree, commit_time: int | None = None) -> BtreeGenerationReference:
    """A version entry for ``tree`` (commit time defaults to ``gen`` seconds after 2020)."""
    t = commit_time if commit_time is not None else 1_577_836_800_000_000_000 + gen * 1_000_000_000
    return BtreeGenerationReference(gen, tree.root, tree.height, tree.stats, t)


def single_manifest(config: Config, versions: list[BtreeGenerationReference]) -> bytes:
    """A single-kind manifest with inline versions only (they must fit one leaf bucket)."""
    return encode_manifest(Manifest(dataclasses.replace(config, manifest_kind=0), tuple(versions), ()))


def build_version_tree(
    db: DbFiles, config: Config, versions: list[BtreeGenerationReference], *, node_file: str = "d/versions"
) -> Manifest:
    """A manifest whose old generations live in version-tree nodes, laid out as TensorStore does.

    Generations must be ``1..N`` without gaps.  The newest (partial) leaf bucket stays inline;
    the manifest references one node per height over the ranges that
    :func:`manifest_version_node_ranges` prescribes, each built from complete child buckets.
    """
    a = config.version_tree_arity_log2
    last = versions[-1].generation_number
    if [v.generation_number for v in versions] != list(range(1, last + 1)):
        raise ValueError("generations must be 1..N")
    by_gen = {v.generation_number: v for v in versions}

    def node(height: int, lo: int, hi: int) -> VersionNodeReference:
        if height == 0:
            vs = tuple(by_gen[g] for g in range(lo, hi + 1))
            blob = encode_version_tree_node(VersionTreeNode(a, 0, versions=vs), config.compression_level)
            return VersionNodeReference(hi, db.append(blob, node_file), len(vs), vs[0].commit_time, 0)
        stride = 1 << (a * height)
        children = tuple(node(height - 1, c, min(c + stride - 1, hi)) for c in range(lo, hi + 1, stride))
        blob = encode_version_tree_node(VersionTreeNode(a, height, children=children), config.compression_level)
        return VersionNodeReference(
            hi, db.append(blob, node_file), sum(c.num_generations for c in children), children[0].commit_time, height
        )

    refs = [node(h, lo, hi) for h, lo, hi in manifest_version_node_ranges(last, a)]
    refs.sort(key=lambda r: -r.height)
    inline_first = last - ((last - 1) % (1 << a))
    inline = tuple(versions[inline_first - 1 :])
    return Manifest(dataclasses.replace(config, manifest_kind=0), inline, tuple(refs))


def write_dir(root: str | os.PathLike[str], files: dict[str, bytes]) -> None:
    """Write ``files`` below the directory ``root``."""
    for name, data in files.items():
        path = os.path.join(os.fspath(root), *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
