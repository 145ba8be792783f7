"""B+tree read algorithms: point lookup, batched lookup, and ordered range iteration.

All traversals are iterative or bounded by the tree height (a byte, so at most 255 levels),
and every node's height must be its parent's minus one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from ocdbt_py.format.btree import BtreeNode, InteriorNode, LeafNode
from ocdbt_py.format.data_file_table import IndirectDataReference
from ocdbt_py.node_reader import NodeReader

__all__ = ["Root", "lookup", "lookup_many", "iterate", "Value"]

#: A leaf value: inline bytes or a reference to out-of-line bytes.
Value = "bytes | IndirectDataReference"

#: A B+tree root: its location and height (``None`` location for an empty tree).
Root = tuple["IndirectDataReference | None", int]

_WINDOW = 16


def lookup(reader: NodeReader, root: Root, key: bytes) -> bytes | IndirectDataReference | None:
    """Find ``key``; returns its inline value, its reference, or ``None``."""
    ref, height = root
    if ref is None:
        return None
    u = key
    while True:
        node = reader.btree_node(ref, height)
        if isinstance(node, LeafNode):
            i = bisect.bisect_left(node.keys, u)
            if i < len(node.keys) and node.keys[i] == u:
                return node.values[i]
            return None
        i = bisect.bisect_right(node.keys, u) - 1
        if i < 0:
            return None
        scp = node.subtree_prefix_lengths[i]
        if scp and not u.startswith(node.keys[i][:scp]):
            return None
        u = u[scp:]
        ref = node.children[i].location
        height -= 1


def lookup_many(
    reader: NodeReader, root: Root, keys: Sequence[bytes]
) -> list[bytes | IndirectDataReference | None]:
    """Look up many keys in one traversal, fetching each level's nodes concurrently."""
    out: list[bytes | IndirectDataReference | None] = [None] * len(keys)
    ref, height = root
    if ref is None or not keys:
        return out
    # pending: (node ref, [(result index, remaining key)])
    level: list[tuple[IndirectDataReference, list[tuple[int, bytes]]]] = [
        (ref, [(i, k) for i, k in enumerate(keys)])
    ]
    while level:
        nodes = reader.btree_nodes([r for r, _ in level], height)
        nxt: dict[IndirectDataReference, list[tuple[int, bytes]]] = {}
        for node, (_, items) in zip(nodes, level):
            if isinstance(node, LeafNode):
                for idx, u in items:
                    j = bisect.bisect_left(node.keys, u)
                    if j < len(node.keys) and node.keys[j] == u:
                        out[idx] = node.values[j]
                continue
            for idx, u in items:
                j = bisect.bisect_right(node.keys, u) - 1
                if j < 0:
                    continue
                scp = node.subtree_prefix_lengths[j]
                if scp and not u.startswith(node.keys[j][:scp]):
                    continue
                nxt.setdefault(node.children[j].location, []).append((idx, u[scp:]))
        level = list(nxt.items())
        height -= 1
    return out


def _child_range(node: InteriorNode, prefix: bytes, lo: bytes, hi: bytes | None) -> range:
    """Indices of children whose key range ``[prefix+key[i], prefix+key[i+1])`` meets ``[lo, hi)``."""
    keys = node.keys
    n = len(keys)
    plen = len(prefix)
    # first child: last i with prefix+key[i] <= lo (or 0)
    if lo[:plen] < prefix:
        first = 0
    elif lo[:plen] > prefix:
        return range(0)
    else:
        first = max(bisect.bisect_right(keys, lo[plen:]) - 1, 0)
    if hi is None or hi[:plen] > prefix:
        last = n
    elif hi[:plen] < prefix:
        return range(0)
    else:
        last = bisect.bisect_left(keys, hi[plen:])
    return range(first, last)


def _leaf_range(node: LeafNode, prefix: bytes, lo: bytes, hi: bytes | None) -> range:
    keys = node.keys
    plen = len(prefix)
    if lo[:plen] < prefix:
        first = 0
    elif lo[:plen] > prefix:
        return range(0)
    else:
        first = bisect.bisect_left(keys, lo[plen:])
    if hi is None or hi[:plen] > prefix:
        last = len(keys)
    elif hi[:plen] < prefix:
        return range(0)
    else:
        last = bisect.bisect_left(keys, hi[plen:])
    return range(first, last)


def iterate(
    reader: NodeReader, root: Root, lo: bytes = b"", hi: bytes | None = None
) -> Iterator[tuple[bytes, bytes | IndirectDataReference]]:
    """Yield ``(key, value)`` in key order for keys in ``[lo, hi)``.

    Children are fetched in concurrent windows; memory stays bounded by the window size times
    the node size per level.
    """
    ref, height = root
    if ref is None:
        return
    top = reader.btree_node(ref, height)
    # explicit stack of (node, prefix, pending child indices iterator)
    yield from _walk(reader, top, b"", lo, hi)


def _walk(
    reader: NodeReader, node: BtreeNode, prefix: bytes, lo: bytes, hi: bytes | None
) -> Iterator[tuple[bytes, bytes | IndirectDataReference]]:
    if isinstance(node, LeafNode):
        keys = node.keys
        values = node.values
        for i in _leaf_range(node, prefix, lo, hi):
            yield prefix + keys[i], values[i]
        return
    idx = list(_child_range(node, prefix, lo, hi))
    for w in range(0, len(idx), _WINDOW):
        window = idx[w : w + _WINDOW]
        children = reader.btree_nodes([node.children[i].location for i in window], node.height - 1)
        for i, child in zip(window, children):
            scp = node.subtree_prefix_lengths[i]
            yield from _walk(reader, child, prefix + node.keys[i][:scp], lo, hi)


def walk_nodes(
    reader: NodeReader, root: Root
) -> Iterator[tuple[IndirectDataReference, BtreeNode, bytes]]:
    """Yield every node of a tree as ``(location, node, prefix)``, parents before children."""
    ref, height = root
    if ref is None:
        return
    stack: list[tuple[IndirectDataReference, int, bytes]] = [(ref, height, b"")]
    while stack:
        r, h, prefix = stack.pop()
        node = reader.btree_node(r, h)
        yield r, node, prefix
        if isinstance(node, InteriorNode):
            for i in range(len(node.keys) - 1, -1, -1):
                scp = node.subtree_prefix_lengths[i]
                stack.append((node.children[i].location, h - 1, prefix + node.keys[i][:scp]))
