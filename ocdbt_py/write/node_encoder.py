"""Encoding one B+tree level: TensorStore's node-splitting estimate, excluded prefixes, bodies.

Entries are given with *full* keys (relative to the tree root) in strictly increasing order.
The encoder splits them into nodes exactly as TensorStore's ``BtreeNodeEncoder::Finalize``
does (same size estimate, same split points, same excluded prefix), encodes each node, hands
the bytes to ``write`` (which returns where they will be stored) and returns the entries the
parent level needs.  Output bytes equal :func:`ocdbt_py.format.encode_leaf_node` /
:func:`~ocdbt_py.format.encode_interior_node` on the same node; this module builds the
columns in bulk because a bulk load may put a million entries in one level.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Union

import numpy as np

from ocdbt_py.format.btree import MAX_NODE_ENTRIES, BtreeChild, BtreeNode, InteriorNode, LeafNode, list_leaf_nbytes
from ocdbt_py.format.data_file_table import (
    DataFileId,
    IndirectDataReference,
    Statistics,
    encode_data_file_table,
)
from ocdbt_py.format.envelope import BTREE_NODE_MAGIC, encode_envelope
from ocdbt_py.format.reader import put_varint

__all__ = [
    "NewChild",
    "LeafValue",
    "common_prefix_len",
    "adjacent_prefixes",
    "split_ranges",
    "encode_leaf_level",
    "encode_interior_level",
    "put_column",
]

#: A leaf value as the writer holds it: inline bytes or a reference to stored bytes.
LeafValue = Union[bytes, memoryview, IndirectDataReference]

_MAX_U64 = (1 << 64) - 1
_MAX_KEY_LENGTH = 65535
#: TensorStore's in-memory size estimates (``kLeafNodeFixedSize``, ``kInteriorNodeFixedSize``).
_LEAF_FIXED = 16
_INTERIOR_FIXED = 56
_REF_FIXED = 16

#: ``write(encoded_node) -> where it is stored``.
WriteFn = Callable[[bytes], IndirectDataReference]
#: ``remember(location, decoded_node)``: lets the caller cache what it just wrote.
RememberFn = Callable[[IndirectDataReference, BtreeNode], None]


class NewChild(NamedTuple):
    """A freshly written node, as its parent's entry sees it (full key and prefix length).

    ``key`` is empty for a root.
    """

    key: bytes
    subtree_prefix_length: int
    location: IndirectDataReference
    statistics: Statistics


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    x = int.from_bytes(a[:m], "big") ^ int.from_bytes(b[:m], "big")
    return m - ((x.bit_length() + 7) >> 3)


#: Levels with at least this many entries use numpy for the per-entry columns...
_VECTOR_MIN = 64
#: ...when their longest key is at most this long (the keys are padded to one width)...
_VECTOR_MAX_WIDTH = 1024
#: ...a block of rows at a time, each padded block at most this many bytes.
_BLOCK_BYTES = 8 << 20


def adjacent_prefixes(keys: Sequence[bytes]) -> list[int]:
    """``out[i]`` = common prefix length of ``keys[i-1]`` and ``keys[i]`` (``out[0] = 0``)."""
    return _KeyColumns(keys).cps


def _padded(keys: Sequence[bytes], width: int) -> Any:
    """``keys`` as a ``(len(keys), width)`` uint8 matrix, NUL-padded."""

    flat = np.frombuffer(b"".join([k.ljust(width, b"\0") for k in keys]), dtype=np.uint8)
    return flat.reshape(len(keys), width)


class _KeyColumns:
    """The sorted full keys of one level, their adjacent common prefixes, and the key columns
    of any node cut from them.

    Large levels are processed as NUL-padded byte matrices, a block of rows at a time (memory
    stays bounded), so prefixes, suffix lengths and concatenated suffixes come from numpy.
    Padding never extends a prefix past the shorter key: results are capped at both lengths.
    """

    def __init__(self, keys: Sequence[bytes]):
        self.keys = keys
        n = len(keys)
        self.width = 0
        self.mat: Any = None
        if n >= _VECTOR_MIN:
            lens = np.fromiter(map(len, keys), dtype=np.int64, count=n)
            width = int(lens.max())
            if 0 < width <= _VECTOR_MAX_WIDTH:
                rows = max(2, _BLOCK_BYTES // width)
                cps = np.zeros(n, dtype=np.int64)
                mat = None
                for a in range(0, n - 1, rows - 1):  # blocks overlap by one row
                    b = min(n, a + rows)
                    mat = _padded(keys[a:b], width)
                    diff = mat[1:] != mat[:-1]
                    first = np.where(diff.any(axis=1), diff.argmax(axis=1), width)
                    cps[a + 1:b] = np.minimum(first, np.minimum(lens[a + 1:b], lens[a:b - 1]))
                # a level that fits one block keeps its matrix for encoding the suffixes
                self.mat = mat if rows >= n else None
                self.width, self.lens, self.cps_np = width, lens, cps
                self.cps: list[int] = cps.tolist()
                return
        cp = common_prefix_len
        self.cps = [0] + [cp(a, b) for a, b in zip(keys, itertools.islice(keys, 1, None))]

    def lengths(self) -> list[int]:
        """Every key's length."""
        if self.width:
            return self.lens.tolist()  # type: ignore[no-any-return]
        return list(map(len, self.keys))

    def encode(self, body: bytearray, s: int, e: int, x: int, scps: Sequence[int] | None) -> None:
        """Append the key columns of a node holding keys ``[s, e)`` minus ``x`` prefix bytes."""
        keys = self.keys
        put_varint(body, e - s)
        if self.width and e - s >= _VECTOR_MIN:
            cs = self.cps_np[s + 1:e]
            body += _varints_np(cs - x)
            body += _varints_np(np.concatenate(([len(keys[s]) - x], self.lens[s + 1:e] - cs)))
            if scps is not None:
                put_column(body, [p - x for p in scps[s:e]])
            body += keys[s][x:]
            rows = max(1, _BLOCK_BYTES // self.width)
            col = np.arange(self.width)
            for a in range(s + 1, e, rows):
                b = min(e, a + rows)
                mat = self.mat[a:b] if self.mat is not None else _padded(keys[a:b], self.width)
                keep = (col >= self.cps_np[a:b, None]) & (col < self.lens[a:b, None])
                body += mat[keep].tobytes()
            return
        ks = keys[s + 1:e]
        cl = self.cps[s + 1:e]
        put_column(body, [c - x for c in cl] if x else cl)
        put_column(body, [len(keys[s]) - x] + [len(k) - c for k, c in zip(ks, cl)])
        if scps is not None:
            put_column(body, [p - x for p in scps[s:e]])
        body += keys[s][x:]
        body += b"".join([k[c:] for k, c in zip(ks, cl)])


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def split_ranges(
    estimates: Any, cpl: int, min_arity: int, max_bytes: int
) -> list[tuple[int, int]]:
    """Split points of TensorStore's ``BtreeNodeEncoder::Finalize``.

    ``estimates`` are the per-entry size estimates and ``cpl`` the minimum common prefix
    length of adjacent keys (the first key's length if there is one entry).  The size of a
    range ``[s, e)`` is ``sum(estimates[s:e]) - (e - s - 1) * cpl``.
    """
    n = len(estimates)
    # g[j] = size(0, j + 1); size(s, e) = g[e-1] - base(s) with base(s) = g[s-1] - cpl.
    g: Any
    if hasattr(estimates, "dtype"):  # a numpy array

        g = (np.cumsum(estimates - cpl) + cpl).tolist()
    else:
        g = [x + cpl for x in itertools.accumulate(e - cpl for e in estimates)]
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:
        base = g[start - 1] - cpl if start else 0
        upper = g[n - 1] - base
        nodes = _ceil_div(n - start, MAX_NODE_ENTRIES)
        if max_bytes:
            nodes = max(nodes, _ceil_div(upper, max_bytes))
        target = _ceil_div(upper, nodes)
        lo_end = start + max(1, min_arity)
        hi_end = min(n - 1, start + MAX_NODE_ENTRIES - 1)
        end = -1
        if lo_end <= hi_end:
            j = bisect.bisect_left(g, target + base, lo_end - 1, hi_end)
            if j <= hi_end - 1:
                end = j + 1
                if g[j] - base > max_bytes and end > start + min_arity:
                    end -= 1
        if end < 0:
            end = start + MAX_NODE_ENTRIES if start + MAX_NODE_ENTRIES <= n - 1 else n
        out.append((start, end))
        start = end
    return out


_SHIFTS: Any = None


def put_column(out: bytearray, values: Sequence[int]) -> None:
    """Append varints for every value (all below 2**64)."""
    if not values:
        return
    if max(values) < 0x80:
        out += bytes(values)
        return
    if len(values) >= _VECTOR_MIN:
        out += _varints_np(values)
        return
    app = out.append
    for v in values:
        while v >= 0x80:
            app((v & 0x7F) | 0x80)
            v >>= 7
        app(v)


def _varints_np(values: Any) -> bytes:
    """Canonical varints of many values (a sequence or an integer array) at once."""

    global _SHIFTS
    if _SHIFTS is None:
        _SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
    a = np.asarray(values, dtype=np.uint64)
    if not a.size:
        return b""
    if int(a.max()) < 0x80:
        return a.astype(np.uint8).tobytes()  # type: ignore[no-any-return]
    groups = (a[:, None] >> _SHIFTS) & np.uint64(0x7F)
    # bytes per value: 1 + number of higher non-empty 7-bit groups
    nbytes = 1 + (a[:, None] >= (np.uint64(1) << _SHIFTS[1:])).sum(axis=1)
    idx = np.arange(10)
    groups |= np.where(idx < (nbytes - 1)[:, None], np.uint64(0x80), np.uint64(0))
    return groups.astype(np.uint8)[idx < nbytes[:, None]].tobytes()  # type: ignore[no-any-return]


def _min_range(cps: Sequence[int], s: int, e: int, first_len: int) -> int:
    """Common prefix of ``keys[s]`` and ``keys[e-1]`` from the adjacent prefix lengths."""
    if e - s == 1:
        return first_len
    return min(itertools.islice(cps, s + 1, e))


def _sat(v: int) -> int:
    return v if v <= _MAX_U64 else _MAX_U64


def encode_leaf_level(
    keys: Sequence[bytes],
    values: Sequence[Any],
    *,
    zstd_level: int | None,
    max_decoded_node_bytes: int,
    may_be_root: bool,
    write: WriteFn,
    remember: RememberFn | None = None,
) -> list[NewChild]:
    """Split, encode and write the leaves holding ``keys`` -> ``values`` (full keys)."""
    n = len(keys)
    if n == 0:
        return []
    kc = _KeyColumns(keys)
    cps = kc.cps
    cpl = min(cps[1:]) if n > 1 else len(keys[0])
    cpl = min(cpl, len(keys[0]))
    klens = kc.lengths()
    ref_t = IndirectDataReference
    is_ref = [type(v) is ref_t for v in values]
    any_ref = True in is_ref
    any_view = not any_ref and any([type(v) is memoryview for v in values])
    est: Any
    if any_ref:
        vlens = [v.length if r else len(v) for v, r in zip(values, is_ref)]  # type: ignore[union-attr,arg-type]
        files_used = {v.file for v, r in zip(values, is_ref) if r}  # type: ignore[union-attr]
        fsize = {f: _REF_FIXED + len(f.base_path) + len(f.relative_path) for f in files_used}
        if kc.width and len(fsize) == 1:
            (one,) = fsize.values()
            inline = np.fromiter(map(len, values), dtype=np.int64, count=n)  # type: ignore[arg-type]
            mask = np.array(is_ref)
            est = _LEAF_FIXED + kc.lens + np.where(mask, one, inline)
        else:
            est = [
                _LEAF_FIXED + kl + (fsize[v.file] if r else vl)  # type: ignore[union-attr]
                for kl, v, r, vl in zip(klens, values, is_ref, vlens)
            ]
    else:
        vlens = list(map(len, values))
        est = [_LEAF_FIXED + kl + vl for kl, vl in zip(klens, vlens)]
    out: list[NewChild] = []
    for s, e in split_ranges(est, cpl, 1, max_decoded_node_bytes):
        is_root = may_be_root and s == 0 and e == n
        x = 0 if is_root else min(_MAX_KEY_LENGTH, _min_range(cps, s, e, len(keys[s])))
        vals = values[s:e]
        refs = [v for v, r in zip(vals, is_ref[s:e]) if r] if any_ref else []
        files: list[DataFileId] = sorted({r.file for r in refs})
        index = {f: i for i, f in enumerate(files)}
        body = bytearray(b"\x00")
        encode_data_file_table(body, files)
        kc.encode(body, s, e, x, None)
        put_column(body, vlens[s:e])
        if refs:
            body += bytes(is_ref[s:e])
            put_column(body, [index[r.file] for r in refs])
            put_column(body, [r.offset for r in refs])
            body += b"".join([v for v, r in zip(vals, is_ref[s:e]) if not r])  # type: ignore[misc]
        else:
            body += bytes(e - s)
            body += b"".join(vals)  # type: ignore[arg-type]
        encoded = encode_envelope(BTREE_NODE_MAGIC, body, zstd_level)
        loc = write(encoded)
        indirect = _sat(sum(r.length for r in refs))
        stats = Statistics(e - s, len(encoded), indirect)
        out.append(NewChild(b"" if is_root else bytes(keys[s]), x, loc, stats))
        if remember is not None:
            node = LeafNode(
                [k[x:] for k in keys[s:e]] if x else list(keys[s:e]),
                [bytes(v) if type(v) is memoryview else v for v in vals] if any_view else list(vals),
            )
            # its memory (the cache weight), from the length columns
            node.nbytes = list_leaf_nbytes(
                e - s, sum(klens[s:e]) - x * (e - s), sum(vlens[s:e]) - sum(r.length for r in refs), len(refs)
            )
            remember(loc, node)
    return out


def encode_interior_level(
    height: int,
    keys: Sequence[bytes],
    subtree_prefix_lengths: Sequence[int],
    children: Sequence[BtreeChild],
    *,
    zstd_level: int | None,
    max_decoded_node_bytes: int,
    may_be_root: bool,
    write: WriteFn,
    remember: RememberFn | None = None,
) -> list[NewChild]:
    """Split, encode and write interior nodes of ``height`` over ``children`` (full keys)."""
    n = len(keys)
    if n == 0:
        return []
    scps = subtree_prefix_lengths
    kc = _KeyColumns(keys)
    cps = kc.cps
    cpl = min(cps[1:]) if n > 1 else len(keys[0])
    cpl = min(cpl, len(keys[0]))
    est = [
        _INTERIOR_FIXED + len(k) + len(c.location.file.base_path) + len(c.location.file.relative_path)
        for k, c in zip(keys, children)
    ]
    out: list[NewChild] = []
    for s, e in split_ranges(est, cpl, 2, max_decoded_node_bytes):
        is_root = may_be_root and s == 0 and e == n
        if is_root:
            x = 0
        else:
            x = min(min(scps[s:e]), _min_range(cps, s, e, len(keys[s])))
        kids = children[s:e]
        files: list[DataFileId] = sorted({c.location.file for c in kids})
        index = {f: i for i, f in enumerate(files)}
        body = bytearray([height])
        encode_data_file_table(body, files)
        kc.encode(body, s, e, x, scps)
        put_column(body, [index[c.location.file] for c in kids])
        put_column(body, [c.location.offset for c in kids])
        put_column(body, [c.location.length for c in kids])
        put_column(body, [c.statistics.num_keys for c in kids])
        put_column(body, [c.statistics.num_tree_bytes for c in kids])
        put_column(body, [c.statistics.num_indirect_value_bytes for c in kids])
        encoded = encode_envelope(BTREE_NODE_MAGIC, body, zstd_level)
        loc = write(encoded)
        stats = Statistics(
            _sat(sum(c.statistics.num_keys for c in kids)),
            _sat(sum(c.statistics.num_tree_bytes for c in kids) + len(encoded)),
            _sat(sum(c.statistics.num_indirect_value_bytes for c in kids)),
        )
        out.append(NewChild(b"" if is_root else bytes(keys[s]), x, loc, stats))
        if remember is not None:
            node = InteriorNode(
                height, [k[x:] for k in keys[s:e]], [p - x for p in scps[s:e]], list(kids)
            )
            remember(loc, node)
    return out
