"""Version tree: per-generation root references, version-tree nodes, and their codecs."""

from __future__ import annotations

import dataclasses

from ocdbt_py.format.data_file_table import (
    EMPTY_FILE_ID,
    DataFileId,
    IndirectDataReference,
    Statistics,
    check_reference,
    decode_data_file_table,
    encode_data_file_table,
)
from ocdbt_py.format.envelope import VERSION_NODE_MAGIC, decode_envelope, encode_envelope
from ocdbt_py.format.reader import Reader, put_u64le, put_varint

__all__ = [
    "BtreeGenerationReference",
    "VersionNodeReference",
    "VersionTreeNode",
    "decode_version_tree_node",
    "encode_version_tree_node",
    "max_version_tree_height",
    "manifest_version_node_ranges",
]

_MISSING = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class BtreeGenerationReference:
    """One committed generation: its B+tree root (``None`` for an empty tree) and commit time.

    ``commit_time`` is in nanoseconds since the Unix epoch.
    """

    generation_number: int
    root: IndirectDataReference | None
    root_height: int
    statistics: Statistics
    commit_time: int


@dataclasses.dataclass(frozen=True)
class VersionNodeReference:
    """A reference to a version-tree node.

    ``generation_number`` is the latest generation below it, ``commit_time`` the earliest.
    """

    generation_number: int
    location: IndirectDataReference
    num_generations: int
    commit_time: int
    height: int


@dataclasses.dataclass(frozen=True)
class VersionTreeNode:
    """A version-tree node: leaves hold generations, interior nodes hold node references."""

    arity_log2: int
    height: int
    versions: tuple[BtreeGenerationReference, ...] = ()
    children: tuple[VersionNodeReference, ...] = ()


def max_version_tree_height(arity_log2: int) -> int:
    """Greatest legal version-node height for the arity."""
    return 63 // arity_log2 - 1


def _file(r: Reader, files: list[DataFileId], idx: int, pos: int) -> DataFileId:
    if idx >= len(files):
        raise r.error(f"data file index {idx} out of range ({len(files)} files)", pos)
    return files[idx]


def decode_version_leaf_entries(
    r: Reader, files: list[DataFileId], arity_log2: int
) -> tuple[BtreeGenerationReference, ...]:
    """Read a version leaf entry array (manifest inline versions or a height-0 node)."""
    start = r.pos
    n = r.varint(what="version count")
    if not 1 <= n <= (1 << arity_log2):
        raise r.error(f"version count {n} outside 1..{1 << arity_log2}", start)
    if n * 16 > r.remaining():  # 8 one-byte columns + an 8-byte time per entry
        raise r.error("truncated version entries", start)
    gens = [r.varint(what="generation number") for _ in range(n)]
    heights = [r.byte("root height") for _ in range(n)]
    fpos = r.pos
    fids = [r.varint(what="data file id") for _ in range(n)]
    offsets = [r.varint(what="offset") for _ in range(n)]
    lengths = [r.varint(what="length") for _ in range(n)]
    nkeys = [r.varint(what="num_keys") for _ in range(n)]
    ntree = [r.varint(what="num_tree_bytes") for _ in range(n)]
    nind = [r.varint(what="num_indirect_value_bytes") for _ in range(n)]
    times = [r.u64le("commit time") for _ in range(n)]
    out = []
    for i in range(n):
        g = gens[i]
        if g == 0:
            raise r.error("generation number 0", start)
        if i and g <= gens[i - 1]:
            raise r.error(f"generation numbers not increasing: {gens[i - 1]} then {g}", start)
        if i and times[i] <= times[i - 1]:  # as TensorStore checks: later generations commit later
            raise r.error(f"commit time of generation {g} is not after generation {gens[i - 1]}'s", start)
        f = _file(r, files, fids[i], fpos)
        stats = Statistics(nkeys[i], ntree[i], nind[i])
        if offsets[i] == _MISSING and lengths[i] == _MISSING and f == EMPTY_FILE_ID:
            if heights[i] != 0 or stats != (0, 0, 0):
                raise r.error(f"missing root of generation {g} has non-zero height or statistics", start)
            root = None
        else:
            check_reference(r, offsets[i], lengths[i], "b+tree root", start)
            root = IndirectDataReference(f, offsets[i], lengths[i])
        out.append(BtreeGenerationReference(g, root, heights[i], stats, times[i]))
    last = gens[-1]
    first_allowed = last - ((last - 1) % (1 << arity_log2))
    if gens[0] < first_allowed:
        raise r.error(f"generations {gens[0]}..{last} do not lie in one version-tree leaf", start)
    return tuple(out)


def decode_version_interior_entries(
    r: Reader, files: list[DataFileId], arity_log2: int, height: int | None, max_count: int
) -> tuple[VersionNodeReference, ...]:
    """Read a version interior entry array; ``height=None`` means the manifest form.

    In the manifest form each entry carries its own height byte; inside a node of height
    ``height`` every child has height ``height - 1``.
    """
    start = r.pos
    n = r.varint(what="version node count")
    if n > max_count:
        raise r.error(f"version node count {n} exceeds {max_count}", start)
    if n * 13 > r.remaining():
        raise r.error("truncated version node entries", start)
    gens = [r.varint(what="generation number") for _ in range(n)]
    fpos = r.pos
    fids = [r.varint(what="data file id") for _ in range(n)]
    offsets = [r.varint(what="offset") for _ in range(n)]
    lengths = [r.varint(what="length") for _ in range(n)]
    ngens = [r.varint(what="num_generations") for _ in range(n)]
    times = [r.u64le("commit time") for _ in range(n)]
    hpos = r.pos
    heights = [r.byte("entry height") for _ in range(n)] if height is None else [height - 1] * n
    out = []
    for i in range(n):
        f = _file(r, files, fids[i], fpos)
        check_reference(r, offsets[i], lengths[i], "version node", start)
        if gens[i] == 0:
            raise r.error("generation number 0", start)
        if height is None:
            h = heights[i]
            if not 1 <= h <= max_version_tree_height(arity_log2):
                raise r.error(f"version node height {h} out of range", hpos)
            if i and h >= heights[i - 1]:
                raise r.error("manifest version node heights not decreasing", hpos)
        if i and gens[i] <= gens[i - 1]:
            raise r.error("version node generations not increasing", start)
        if ngens[i] == 0:
            raise r.error(f"version node of generation {gens[i]} holds 0 generations", start)
        if i and times[i] <= times[i - 1]:
            raise r.error("version node commit times not increasing", start)
        loc = IndirectDataReference(f, offsets[i], lengths[i])
        out.append(VersionNodeReference(gens[i], loc, ngens[i], times[i], heights[i]))
    return tuple(out)


def _check_interior_buckets(r: Reader, node: VersionTreeNode) -> None:
    a = node.arity_log2
    stride = 1 << (a * node.height)
    span = stride << a
    prev_bucket = -1
    parent = None
    for c in node.children:
        g = c.generation_number
        if g % stride:
            raise r.error(f"version node child generation {g} is not a multiple of {stride}")
        if c.num_generations > stride:
            raise r.error(f"version node child claims {c.num_generations} generations (> {stride})")
        bucket = (g - 1) // stride
        if bucket == prev_bucket:
            raise r.error("two version node children in one bucket")
        prev_bucket = bucket
        pb = (g - 1) // span
        if parent is not None and pb != parent:
            raise r.error("version node children span several parent buckets")
        parent = pb


def decode_version_tree_node(
    data: bytes | memoryview,
    *,
    arity_log2: int,
    transitive: bytes = b"",
    max_body: int = 64 << 20,
    path: str | None = None,
    base: int = 0,
) -> VersionTreeNode:
    """Decode an encoded version-tree node (envelope included)."""
    body = decode_envelope(data, VERSION_NODE_MAGIC, max_body=max_body, path=path, base=base)
    r = Reader(body, path=path)
    pos = r.pos
    a = r.byte("version_tree_arity_log2")
    if a != arity_log2:
        raise r.error(f"version node arity_log2 {a} differs from the manifest's {arity_log2}", pos)
    pos = r.pos
    height = r.byte("height")
    if height > max_version_tree_height(a):
        raise r.error(f"version node height {height} exceeds {max_version_tree_height(a)}", pos)
    files = decode_data_file_table(r, transitive)
    if height == 0:
        node = VersionTreeNode(a, 0, versions=decode_version_leaf_entries(r, files, a))
    else:
        children = decode_version_interior_entries(r, files, a, height, 1 << a)
        if not children:
            raise r.error("empty version tree node")
        node = VersionTreeNode(a, height, children=children)
        _check_interior_buckets(r, node)
    r.expect_end("version tree node")
    return node


def _collect_files(refs: list[IndirectDataReference]) -> tuple[list[DataFileId], dict[DataFileId, int]]:
    files = sorted(set(ref.file for ref in refs))
    return files, {f: i for i, f in enumerate(files)}


def gen_ref_location(v: BtreeGenerationReference) -> IndirectDataReference:
    """The root location to encode (the missing marker for an empty tree)."""
    if v.root is None:
        return IndirectDataReference(EMPTY_FILE_ID, _MISSING, _MISSING)
    return v.root


def encode_version_leaf_entries(
    out: bytearray,
    versions: tuple[BtreeGenerationReference, ...] | list[BtreeGenerationReference],
    index: dict[DataFileId, int],
) -> None:
    """Append a version leaf entry array."""
    put_varint(out, len(versions))
    locs = [gen_ref_location(v) for v in versions]
    for v in versions:
        put_varint(out, v.generation_number)
    for v in versions:
        out.append(v.root_height)
    for loc in locs:
        put_varint(out, index[loc.file])
    for loc in locs:
        put_varint(out, loc.offset)
    for loc in locs:
        put_varint(out, loc.length)
    for v in versions:
        put_varint(out, v.statistics.num_keys)
    for v in versions:
        put_varint(out, v.statistics.num_tree_bytes)
    for v in versions:
        put_varint(out, v.statistics.num_indirect_value_bytes)
    for v in versions:
        put_u64le(out, v.commit_time)


def encode_version_interior_entries(
    out: bytearray,
    refs: tuple[VersionNodeReference, ...] | list[VersionNodeReference],
    index: dict[DataFileId, int],
    with_height: bool,
) -> None:
    """Append a version interior entry array (``with_height`` for the manifest form)."""
    put_varint(out, len(refs))
    for c in refs:
        put_varint(out, c.generation_number)
    for c in refs:
        put_varint(out, index[c.location.file])
    for c in refs:
        put_varint(out, c.location.offset)
    for c in refs:
        put_varint(out, c.location.length)
    for c in refs:
        put_varint(out, c.num_generations)
    for c in refs:
        put_u64le(out, c.commit_time)
    if with_height:
        for c in refs:
            out.append(c.height)


def encode_version_tree_node(node: VersionTreeNode, zstd_level: int | None) -> bytes:
    """Encode a version-tree node (envelope included)."""
    body = bytearray([node.arity_log2, node.height])
    if node.height == 0:
        files, index = _collect_files([gen_ref_location(v) for v in node.versions])
        encode_data_file_table(body, files)
        encode_version_leaf_entries(body, node.versions, index)
    else:
        files, index = _collect_files([c.location for c in node.children])
        encode_data_file_table(body, files)
        encode_version_interior_entries(body, node.children, index, with_height=False)
    return encode_envelope(VERSION_NODE_MAGIC, body, zstd_level)


def manifest_version_node_ranges(latest: int, arity_log2: int) -> list[tuple[int, int, int]]:
    """The ``(height, first, last)`` generation ranges the manifest's node references may cover.

    Ordered lowest height first, for a manifest whose latest generation is ``latest``.
    """
    a = arity_log2
    out = []
    g = ((latest - 1) >> a) << a
    h = 1
    while g != 0 and h <= max_version_tree_height(a):
        nxt = ((g - 1) >> (a * (h + 1))) << (a * (h + 1))
        out.append((h, nxt + 1, g))
        h += 1
        g = nxt
    return out
