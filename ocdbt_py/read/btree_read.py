"""B+tree read algorithms: point lookup, batched lookup, and ordered range iteration.

All traversals are iterative or bounded by the tree height (a byte, so at most 255 levels),
and every node's height must be its parent's minus one.  A B+tree is a tree: a node reached
a second time within one traversal (two parent entries sharing one child, which TensorStore
never writes) is :class:`~ocdbt_py.errors.CorruptionError`, so the work of a listing is
bounded by the stored bytes it reads -- a few KB of nodes sharing children cannot describe
10^9 keys.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any

from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.btree import BtreeNode, InteriorNode, LeafNode, inline_values, value_lengths, value_locations
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.read.node_reader import NodeReader

__all__ = ["Root", "lookup", "lookup_many", "iterate", "iterate_columns", "LeafColumns", "Value"]

#: A leaf value: inline bytes or a reference to out-of-line bytes.
Value = "bytes | IndirectDataReference"

#: A B+tree root: its location and height (``None`` location for an empty tree).
Root = tuple["IndirectDataReference | None", int]

_WINDOW = 16
_WINDOW_BYTES = 8 << 20


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
    the node size per level.  Every child's keys must lie within the range its parent entry
    gives it, so the output is strictly increasing even for a crafted tree, and a tree whose
    entries share subtrees cannot make a listing do unbounded work without output.
    """
    ref, height = root
    if ref is None:
        return
    top = reader.btree_node(ref, height)
    for leaf, prefix, rng in _walk(reader, top, b"", lo, hi, None, {(ref.file, ref.offset)}):
        keys = leaf.keys
        values = leaf.values
        for i in rng:
            yield prefix + keys[i], values[i]


class LeafColumns:
    """The entries of one leaf node within a range, as columns: full ``keys``, value
    ``sizes``, and :meth:`inline` for the inline values of chosen entries.  Built without a
    Python object per value (see :func:`iterate_columns`)."""

    __slots__ = ("keys", "sizes", "_values", "_start")

    def __init__(self, keys: list[bytes], sizes: list[int], values: Sequence[Any], start: int):
        self.keys = keys
        self.sizes = sizes
        self._values = values
        self._start = start

    def inline(self, indices: Sequence[int]) -> list[bytes | None]:
        """The inline value of each entry at ``indices`` (positions in :attr:`keys`);
        ``None`` where the value is stored out of line."""
        s = self._start
        return inline_values(self._values, [s + i for i in indices])

    def locations(self) -> tuple[list[DataFileId], list[int], list[int], list[int]]:
        """Where each entry's value is: the distinct data ``files``, and per entry (aligned
        with :attr:`keys`) the index of its file (``-1``: inline), its offset and its length
        (see :func:`~ocdbt_py.format.btree.value_locations`)."""
        files, fidx, offsets, lengths = value_locations(self._values)
        s, e = self._start, self._start + len(self.keys)
        if s or e != len(fidx):
            fidx, offsets, lengths = fidx[s:e], offsets[s:e], lengths[s:e]
        return files, fidx, offsets, lengths


def iterate_columns(reader: NodeReader, root: Root, lo: bytes = b"", hi: bytes | None = None
                    ) -> Iterator[LeafColumns]:
    """Like :func:`iterate`, one :class:`LeafColumns` per leaf node instead of one pair per
    entry (for scans of many small values: sizes and a few inline values)."""
    ref, height = root
    if ref is None:
        return
    top = reader.btree_node(ref, height)
    for leaf, prefix, rng in _walk(reader, top, b"", lo, hi, None, {(ref.file, ref.offset)}):
        keys = leaf.keys
        run = list(keys[rng.start : rng.stop]) if isinstance(keys, list) else list(islice(keys, rng.start, rng.stop))
        if prefix:
            run = list(map(prefix.__add__, run))
        sizes = value_lengths(leaf.values)
        if rng.start or rng.stop != len(sizes):
            sizes = sizes[rng.start : rng.stop]
        yield LeafColumns(run, sizes, leaf.values, rng.start)


def iterate_keys(reader: NodeReader, root: Root, lo: bytes = b"", hi: bytes | None = None) -> Iterator[bytes]:
    """Like :func:`iterate`, keys only: no leaf value is ever materialised.

    Lazy like :func:`iterate` (nothing is read before the first key is asked for); the keys
    of each leaf are handed out by C-level iterators rather than one Python step per key.
    """
    return chain.from_iterable(_leaf_key_runs(reader, root, lo, hi))


def _leaf_key_runs(reader: NodeReader, root: Root, lo: bytes, hi: bytes | None) -> Iterator[Iterable[bytes]]:
    """For each leaf in ``[lo, hi)`` in key order, an iterable of its full keys in range."""
    ref, height = root
    if ref is None:
        return
    top = reader.btree_node(ref, height)
    for leaf, prefix, rng in _walk(reader, top, b"", lo, hi, None, {(ref.file, ref.offset)}):
        keys = leaf.keys
        run: Iterable[bytes]
        if isinstance(keys, list):
            run = keys if rng.start == 0 and rng.stop == len(keys) else keys[rng.start : rng.stop]
        else:
            run = islice(keys, rng.start, rng.stop)
        yield map(prefix.__add__, run) if prefix else run


def _out_of_range(reader: NodeReader, ref: IndirectDataReference, what: str) -> CorruptionError:
    return CorruptionError(f"b+tree node {what}", path=reader.file_key(ref.file), offset=ref.offset)


def _shared(reader: NodeReader, ref: IndirectDataReference) -> CorruptionError:
    return _out_of_range(reader, ref, "is reached twice in one traversal (parent entries share a subtree)")


def _walk(
    reader: NodeReader, node: BtreeNode, prefix: bytes, lo: bytes, hi: bytes | None, upper: bytes | None,
    seen: set[tuple[object, int]],
) -> Iterator[tuple[LeafNode, bytes, range]]:
    """The leaves below ``node`` (whose keys are relative to ``prefix``) in key order, each with
    its prefix and the range of its entries that lies in ``[lo, hi)``.

    ``upper`` is the exclusive bound the parent gives this subtree (``None``: none); ``seen``
    holds the ``(file, offset)`` of every node of this traversal so far.
    """
    if isinstance(node, LeafNode):
        rng = _leaf_range(node, prefix, lo, hi)
        if rng:
            yield node, prefix, rng
        return
    idx = list(_child_range(node, prefix, lo, hi))
    keys = node.keys
    n = len(keys)
    w = 0
    while w < len(idx):
        # a window of up to _WINDOW children, fewer when they are big
        end = w + 1
        size = node.children[idx[w]].location.length
        while end < len(idx) and end - w < _WINDOW and size < _WINDOW_BYTES:
            size += node.children[idx[end]].location.length
            end += 1
        window = idx[w:end]
        w = end
        refs = [node.children[i].location for i in window]
        for ref in refs:
            loc = (ref.file, ref.offset)
            if loc in seen:
                raise _shared(reader, ref)
            seen.add(loc)
        children = reader.btree_nodes(refs, node.height - 1)
        for i, ref, child in zip(window, refs, children):
            scp = node.subtree_prefix_lengths[i]
            entry = keys[i]
            # the child's keys must lie in [prefix + entry, prefix + next entry or upper)
            if child.keys[0] < entry[scp:]:
                raise _out_of_range(reader, ref, "has a first key below its parent entry's key")
            child_upper = prefix + keys[i + 1] if i + 1 < n else upper
            child_prefix = prefix + entry[:scp]
            if child_upper is not None and child_prefix + child.keys[-1] >= child_upper:
                raise _out_of_range(reader, ref, "has a key at or above the next parent entry's key")
            yield from _walk(reader, child, child_prefix, lo, hi, child_upper, seen)


def walk_nodes(
    reader: NodeReader, root: Root
) -> Iterator[tuple[IndirectDataReference, BtreeNode, bytes]]:
    """Yield every node of a tree as ``(location, node, prefix)``, parents before children."""
    ref, height = root
    if ref is None:
        return
    stack: list[tuple[IndirectDataReference, int, bytes]] = [(ref, height, b"")]
    seen: set[tuple[object, int]] = set()
    while stack:
        r, h, prefix = stack.pop()
        if (r.file, r.offset) in seen:
            raise _shared(reader, r)
        seen.add((r.file, r.offset))
        node = reader.btree_node(r, h)
        yield r, node, prefix
        if isinstance(node, InteriorNode):
            for i in range(len(node.keys) - 1, -1, -1):
                scp = node.subtree_prefix_lengths[i]
                stack.append((node.children[i].location, h - 1, prefix + node.keys[i][:scp]))
