"""Copy-on-write application of a commit's mutations to a B+tree.

Mirrors TensorStore's non-distributed commit (``btree_writer_commit_operation.h``):

* mutations are partitioned top-down among the children of each interior node (child 0 also
  takes keys below its first key, so the leftmost path absorbs new minimum keys);
* only children that receive mutations are read, and a child wholly covered by one range
  delete is dropped without reading it;
* a leaf is re-encoded when any write lands in it (a delete of an absent key counts) or a
  range delete removes one of its entries; the parent swaps the old entry for the 0, 1 or
  more new nodes and is re-encoded in turn; untouched subtrees are shared;
* the root gains levels while a level produces more than one node; the height never shrinks.

Nodes are written bottom-up in key order, so a bulk load into an empty tree produces
TensorStore's data file byte for byte.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable

from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.btree import BtreeChild, BtreeNode, InteriorNode, LeafNode, node_nbytes
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import IndirectDataReference, Statistics
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.write.mutations import DELETE_RANGE, SortedMutations
from ocdbt_py.write.node_encoder import (
    LeafValue,
    NewChild,
    encode_interior_level,
    encode_leaf_level,
)

__all__ = ["TreeWriter", "NewRoot"]

_MAX_HEIGHT = 255


@dataclasses.dataclass(frozen=True)
class NewRoot:
    """Result of applying a commit: the new root (``None`` for an empty tree)."""

    location: IndirectDataReference | None
    height: int
    statistics: Statistics


class TreeWriter:
    """Applies sorted mutations to the tree rooted at one version.

    ``write_node(bytes) -> reference`` stores an encoded node.  Nodes this writer creates
    are put into the reader's cache, so the next commit need not read them back.
    """

    def __init__(
        self,
        reader: NodeReader,
        config: Config,
        write_node: Callable[[bytes], IndirectDataReference],
        *,
        cache_new_nodes: bool = True,
    ):
        self.reader = reader
        self.config = config
        self.write_node = write_node
        self._remember = self._cache_node if cache_new_nodes else None

    def _cache_node(self, loc: IndirectDataReference, node: BtreeNode) -> None:
        self.reader.cache.put(("b", loc), node, node_nbytes(node))

    # -- encoding ------------------------------------------------------------------------
    def _leaves(self, keys: list[bytes], values: list[LeafValue], may_be_root: bool) -> list[NewChild]:
        c = self.config
        return encode_leaf_level(
            keys, values, zstd_level=c.compression_level,
            max_decoded_node_bytes=c.max_decoded_node_bytes, may_be_root=may_be_root,
            write=self.write_node, remember=self._remember,
        )

    def _interiors(
        self, height: int, keys: list[bytes], scps: list[int], children: list[BtreeChild], may_be_root: bool
    ) -> list[NewChild]:
        c = self.config
        return encode_interior_level(
            height, keys, scps, children, zstd_level=c.compression_level,
            max_decoded_node_bytes=c.max_decoded_node_bytes, may_be_root=may_be_root,
            write=self.write_node, remember=self._remember,
        )

    # -- entry point -----------------------------------------------------------------------
    def apply(
        self, root: IndirectDataReference | None, root_height: int, mutations: SortedMutations
    ) -> NewRoot | None:
        """Apply ``mutations`` (from :meth:`MutationSet.sorted`).

        Returns the new root, or ``None`` when nothing changed (no new generation needed).
        """
        n = len(mutations)
        if not n:
            return None
        self._m = mutations
        if root is None:
            result = self._visit_leaf(None, b"", b"", None, 0, n, True)
            height = 0
        else:
            node = self.reader.btree_node(root, root_height)
            result = self._visit(node, b"", b"", None, 0, n, True)
            height = root_height
        if result is None:
            return None
        while len(result) > 1:
            if height >= _MAX_HEIGHT:
                raise CorruptionError("maximum b+tree height exceeded")
            height += 1
            result = self._interiors(
                height,
                [c.key for c in result],
                [c.subtree_prefix_length for c in result],
                [BtreeChild(c.location, c.statistics) for c in result],
                True,
            )
        if not result:
            return NewRoot(None, 0, Statistics(0, 0, 0))
        only = result[0]
        return NewRoot(only.location, height, only.statistics)

    # -- traversal ------------------------------------------------------------------------
    # Mutations ``[a, b)`` of ``self._m`` are those that meet the node's key range ``[lo, hi)``.
    def _visit(
        self, node: BtreeNode, prefix: bytes, lo: bytes, hi: bytes | None, a: int, b: int, may_be_root: bool,
    ) -> list[NewChild] | None:
        if isinstance(node, LeafNode):
            return self._visit_leaf(node, prefix, lo, hi, a, b, may_be_root)
        return self._visit_interior(node, prefix, lo, hi, a, b, may_be_root)

    def _visit_leaf(
        self, node: LeafNode | None, prefix: bytes, lo: bytes, hi: bytes | None, a: int, b: int,
        may_be_root: bool,
    ) -> list[NewChild] | None:
        m = self._m
        mkeys, mvals = m.keys, m.values
        if node is None or not node.keys:
            if not m.has_range_in(a, b):
                # writes into an empty leaf (a bulk load): every write is a modification
                ks = mkeys[a:b]
                vs = mvals[a:b]
                if None in vs:
                    pairs = [(k, v) for k, v in zip(ks, vs) if v is not None]
                    ks = [k for k, _ in pairs]
                    vs = [v for _, v in pairs]
                return self._leaves(ks, vs, may_be_root)
            old_keys: list[bytes] = []
            old_vals: list[LeafValue] = []
        else:
            old_keys = [prefix + k for k in node.keys] if prefix else list(node.keys)
            old_vals = list(node.values)  # type: ignore[arg-type]
        kinds, stops = m.kinds, m.stops
        keys: list[bytes] = []
        vals: list[LeafValue] = []
        modified = False
        i = 0
        n_old = len(old_keys)
        for t in range(a, b):
            key = mkeys[t]
            # existing entries before this mutation are kept
            j = bisect.bisect_left(old_keys, key, i)
            if j > i:
                keys.extend(old_keys[i:j])
                vals.extend(old_vals[i:j])
                i = j
            if kinds[t] == DELETE_RANGE:
                stop = stops[t]
                j = n_old if stop is None else bisect.bisect_left(old_keys, stop, i)
                if j > i:
                    modified = True
                    i = j
                continue
            modified = True
            if i < n_old and old_keys[i] == key:
                i += 1
            v = mvals[t]
            if v is not None:
                keys.append(key)
                vals.append(v)
        if not modified:
            return None
        if i < n_old:
            keys.extend(old_keys[i:])
            vals.extend(old_vals[i:])
        return self._leaves(keys, vals, may_be_root)

    def _visit_interior(
        self, node: InteriorNode, prefix: bytes, lo: bytes, hi: bytes | None, a: int, b: int,
        may_be_root: bool,
    ) -> list[NewChild] | None:
        m = self._m
        mkeys, kinds, stops = m.keys, m.kinds, m.stops
        n = len(node.keys)
        full = [prefix + k for k in node.keys] if prefix else list(node.keys)
        # partition: child i covers [full[i], full[i+1]); child 0 from lo, the last up to hi
        parts: list[tuple[int, bytes, bytes | None, int, int]] = []
        for i in range(n):
            c_lo = lo if i == 0 else full[i]
            c_hi = hi if i == n - 1 else full[i + 1]
            ca = a if i == 0 else bisect.bisect_left(mkeys, c_lo, a, b)
            # a range delete starting before c_lo may still reach into this child
            if ca > a:
                p = ca - 1
                if kinds[p] == DELETE_RANGE and (stops[p] is None or stops[p] > c_lo):  # type: ignore[operator]
                    ca = p
            cb = b if c_hi is None or i == n - 1 else bisect.bisect_left(mkeys, c_hi, ca, b)
            if cb > ca:
                parts.append((i, c_lo, c_hi, ca, cb))
        if not parts:
            return None
        removed: dict[int, list[NewChild]] = {}
        to_read: list[tuple[int, bytes, bytes | None, int, int]] = []
        for part in parts:
            i, c_lo, c_hi, ca, cb = part
            stop = stops[ca]
            if (
                cb - ca == 1 and kinds[ca] == DELETE_RANGE and mkeys[ca] <= c_lo
                and (stop is None or (c_hi is not None and stop >= c_hi))
            ):
                removed[i] = []  # wholly deleted: drop without reading
            else:
                to_read.append(part)
        if to_read:
            children = self.reader.btree_nodes(
                [node.children[p[0]].location for p in to_read], node.height - 1
            )
            for (i, c_lo, c_hi, ca, cb), child in zip(to_read, children):
                scp = node.subtree_prefix_lengths[i]
                child_prefix = prefix + node.keys[i][:scp]
                if child.keys and child_prefix + child.keys[0] < full[i]:
                    raise CorruptionError(
                        f"b+tree child's first key is below its parent's bound {full[i]!r}"
                    )
                res = self._visit(child, child_prefix, c_lo, c_hi, ca, cb, False)
                if res is not None:
                    removed[i] = res
        if not removed:
            return None
        keys: list[bytes] = []
        scps: list[int] = []
        kids: list[BtreeChild] = []
        plen = len(prefix)
        for i in range(n):
            new = removed.get(i)
            if new is None:
                keys.append(full[i])
                scps.append(plen + node.subtree_prefix_lengths[i])
                kids.append(node.children[i])
            else:
                for c in new:
                    keys.append(c.key)
                    scps.append(c.subtree_prefix_length)
                    kids.append(BtreeChild(c.location, c.statistics))
        if any(keys[j] >= keys[j + 1] for j in range(len(keys) - 1)):
            order = sorted(range(len(keys)), key=keys.__getitem__)
            keys = [keys[j] for j in order]
            scps = [scps[j] for j in order]
            kids = [kids[j] for j in order]
        return self._interiors(node.height, keys, scps, kids, may_be_root)
