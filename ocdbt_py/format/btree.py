"""B+tree nodes: leaves map keys to inline or out-of-line values, interior nodes to children.

Keys inside a node are stored relative to the node's implicit prefix (which the parent's
entry determines) and prefix-compressed against the previous key.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Union

from ocdbt_py.format.data_file_table import (
    DataFileId,
    IndirectDataReference,
    Statistics,
    decode_data_file_table,
    encode_data_file_table,
)
from ocdbt_py.format.envelope import BTREE_NODE_MAGIC, decode_envelope, encode_envelope
from ocdbt_py.format.reader import Reader, put_varint

__all__ = [
    "BtreeChild",
    "LeafNode",
    "InteriorNode",
    "BtreeNode",
    "decode_btree_node",
    "encode_leaf_node",
    "encode_interior_node",
    "MAX_NODE_ENTRIES",
    "MAX_KEY_LENGTH",
    "MAX_INLINE_VALUE_READ",
]

MAX_NODE_ENTRIES = 1 << 20
MAX_KEY_LENGTH = 65535
#: Inline values larger than this are rejected when read (as TensorStore does).
MAX_INLINE_VALUE_READ = 1 << 20
_LIMIT63 = (1 << 63) - 1


class BtreeChild(NamedTuple):
    """An interior entry's child: where the node is and the statistics of its subtree."""

    location: IndirectDataReference
    statistics: Statistics


@dataclasses.dataclass
class LeafNode:
    """A leaf: ``values[i]`` is the inline value (bytes) or where the value is stored."""

    keys: list[bytes]
    values: list[bytes | IndirectDataReference]
    height: int = 0


@dataclasses.dataclass
class InteriorNode:
    """An interior node of ``height >= 1``.

    Child ``i`` covers keys from ``keys[i]`` (inclusive) to ``keys[i+1]``; its own keys are
    relative to this node's prefix plus ``keys[i][:subtree_prefix_lengths[i]]``.
    """

    height: int
    keys: list[bytes]
    subtree_prefix_lengths: list[int]
    children: list[BtreeChild]


BtreeNode = Union[LeafNode, InteriorNode]


def _read_keys(r: Reader, n: int, interior: bool) -> tuple[list[bytes], list[int]]:
    prefix = r.varint_column(n - 1, MAX_KEY_LENGTH, "key prefix length")
    ppos = r.pos
    suffix = r.varint_column(n, MAX_KEY_LENGTH, "key suffix length")
    scp = r.varint_column(n, MAX_KEY_LENGTH, "subtree common prefix length") if interior else []
    total = sum(suffix)
    kpos = r.pos
    blob = r.take(total, "key bytes")
    keys: list[bytes] = []
    prev = blob[0 : suffix[0]]
    keys.append(prev)
    off = suffix[0]
    for i in range(1, n):
        p = prefix[i - 1]
        s = suffix[i]
        if p > len(prev):
            raise r.error(f"key {i}: prefix length {p} exceeds the previous key's length {len(prev)}", ppos)
        if p + s > MAX_KEY_LENGTH:
            raise r.error(f"key {i}: length {p + s} exceeds {MAX_KEY_LENGTH}", ppos)
        k = prev[:p] + blob[off : off + s] if p else blob[off : off + s]
        off += s
        if k <= prev:
            raise r.error(f"keys not strictly increasing at entry {i}", kpos)
        keys.append(k)
        prev = k
    if interior:
        for i in range(n):
            if scp[i] > len(keys[i]):
                raise r.error(f"entry {i}: subtree common prefix length exceeds its key length", ppos)
    return keys, scp


def _file(r: Reader, files: list[DataFileId], idx: int, pos: int) -> DataFileId:
    if idx >= len(files):
        raise r.error(f"data file index {idx} out of range ({len(files)} files)", pos)
    return files[idx]


def decode_btree_node(
    data: bytes | memoryview,
    *,
    transitive: bytes = b"",
    max_body: int,
    path: str | None = None,
    base: int = 0,
) -> BtreeNode:
    """Decode an encoded B+tree node (envelope included).

    ``transitive`` is prepended to the base paths of the node's data file table;
    ``max_body`` bounds the decoded body size.
    """
    body = decode_envelope(data, BTREE_NODE_MAGIC, max_body=max_body, path=path, base=base)
    r = Reader(body, path=path)
    height = r.byte("height")
    files = decode_data_file_table(r, transitive)
    npos = r.pos
    n = r.varint32("entry count")
    if n == 0:
        raise r.error("empty b+tree node", npos)
    if n > MAX_NODE_ENTRIES:
        raise r.error(f"b+tree node has {n} entries (> {MAX_NODE_ENTRIES})", npos)
    if 2 * n - 1 > r.remaining():
        raise r.error(f"b+tree node claims {n} entries but only {r.remaining()} bytes remain", npos)
    keys, scp = _read_keys(r, n, height > 0)
    node: BtreeNode
    if height == 0:
        lengths = r.varint_column(n, _LIMIT63, "value length")
        kpos = r.pos
        kinds = r.take(n, "value kinds")
        if kinds and max(kinds) > 1:
            raise r.error("unknown value kind", kpos + next(i for i, k in enumerate(kinds) if k > 1))
        m = kinds.count(1)
        fpos = r.pos
        fids = r.varint_column(m, len(files) - 1 if files else 0, "data file index") if m else []
        if m and not files:
            raise r.error("out-of-line value but the data file table is empty", fpos)
        offsets = r.varint_column(m, _LIMIT63, "value offset") if m else []
        values: list[bytes | IndirectDataReference] = []
        j = 0
        vpos = r.pos
        data_view = r.data
        pos = r.pos
        end = r.end
        for i in range(n):
            ln = lengths[i]
            if kinds[i] == 0:
                if ln > MAX_INLINE_VALUE_READ:
                    raise r.error(f"inline value of {ln} bytes exceeds {MAX_INLINE_VALUE_READ}", vpos)
                if pos + ln > end:
                    raise r.error("truncated inline values", pos)
                values.append(bytes(data_view[pos : pos + ln]))
                pos += ln
            else:
                off = offsets[j]
                if off + ln > _LIMIT63:
                    raise r.error("value reference overflows", fpos)
                values.append(IndirectDataReference(_file(r, files, fids[j], fpos), off, ln))
                j += 1
        r.pos = pos
        node = LeafNode(keys, values)
    else:
        fpos = r.pos
        fids = r.varint_column(n, _LIMIT63, "data file index")
        offsets = r.varint_column(n, what="child offset")
        lens = r.varint_column(n, what="child length")
        nkeys = r.varint_column(n, what="num_keys")
        ntree = r.varint_column(n, what="num_tree_bytes")
        nind = r.varint_column(n, what="num_indirect_value_bytes")
        children = []
        for i in range(n):
            if offsets[i] + lens[i] > _LIMIT63:
                raise r.error("child reference overflows", fpos)
            loc = IndirectDataReference(_file(r, files, fids[i], fpos), offsets[i], lens[i])
            children.append(BtreeChild(loc, Statistics(nkeys[i], ntree[i], nind[i])))
        node = InteriorNode(height, keys, scp, children)
    r.expect_end("b+tree node")
    return node


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _encode_keys(body: bytearray, keys: list[bytes], scp: list[int] | None) -> None:
    n = len(keys)
    put_varint(body, n)
    prefixes = [_common_prefix(keys[i - 1], keys[i]) for i in range(1, n)]
    for p in prefixes:
        put_varint(body, p)
    put_varint(body, len(keys[0]))
    for i in range(1, n):
        put_varint(body, len(keys[i]) - prefixes[i - 1])
    if scp is not None:
        for s in scp:
            put_varint(body, s)
    body += keys[0]
    for i in range(1, n):
        body += keys[i][prefixes[i - 1]:]


def encode_leaf_node(
    keys: list[bytes], values: list[bytes | IndirectDataReference], zstd_level: int | None
) -> bytes:
    """Encode a leaf whose ``keys`` (relative to the node prefix) are sorted and unique."""
    if not keys or len(keys) != len(values):
        raise ValueError("a leaf needs as many values as keys, and at least one")
    files = sorted({v.file for v in values if isinstance(v, IndirectDataReference)})
    index = {f: i for i, f in enumerate(files)}
    body = bytearray([0])
    encode_data_file_table(body, files)
    _encode_keys(body, keys, None)
    for v in values:
        put_varint(body, len(v) if isinstance(v, bytes) else v.length)
    for v in values:
        body.append(0 if isinstance(v, bytes) else 1)
    indirect = [v for v in values if isinstance(v, IndirectDataReference)]
    for v in indirect:
        put_varint(body, index[v.file])
    for v in indirect:
        put_varint(body, v.offset)
    for v in values:
        if isinstance(v, bytes):
            body += v
    return encode_envelope(BTREE_NODE_MAGIC, body, zstd_level)


def encode_interior_node(
    height: int,
    keys: list[bytes],
    subtree_prefix_lengths: list[int],
    children: list[BtreeChild],
    zstd_level: int | None,
) -> bytes:
    """Encode an interior node of ``height >= 1``."""
    if height < 1 or not keys or not len(keys) == len(children) == len(subtree_prefix_lengths):
        raise ValueError("bad interior node")
    files = sorted({c.location.file for c in children})
    index = {f: i for i, f in enumerate(files)}
    body = bytearray([height])
    encode_data_file_table(body, files)
    _encode_keys(body, keys, subtree_prefix_lengths)
    for c in children:
        put_varint(body, index[c.location.file])
    for c in children:
        put_varint(body, c.location.offset)
    for c in children:
        put_varint(body, c.location.length)
    for c in children:
        put_varint(body, c.statistics.num_keys)
    for c in children:
        put_varint(body, c.statistics.num_tree_bytes)
    for c in children:
        put_varint(body, c.statistics.num_indirect_value_bytes)
    return encode_envelope(BTREE_NODE_MAGIC, body, zstd_level)
