"""B+tree nodes: leaves map keys to inline or out-of-line values, interior nodes to children.

Keys inside a node are stored relative to the node's implicit prefix (which the parent's
entry determines) and prefix-compressed against the previous key.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import NamedTuple, Union, overload

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
    "PrefixedKeys",
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

    keys: Sequence[bytes]
    values: Sequence[bytes | IndirectDataReference]
    height: int = 0


@dataclasses.dataclass
class InteriorNode:
    """An interior node of ``height >= 1``.

    Child ``i`` covers keys from ``keys[i]`` (inclusive) to ``keys[i+1]``; its own keys are
    relative to this node's prefix plus ``keys[i][:subtree_prefix_lengths[i]]``.
    """

    height: int
    keys: Sequence[bytes]
    subtree_prefix_lengths: list[int]
    children: list[BtreeChild]


BtreeNode = Union[LeafNode, InteriorNode]


class PrefixedKeys(Sequence[bytes]):
    """Keys sharing one long common prefix, stored once: ``keys[i] == prefix + rest[i]``.

    A node's keys may all repeat a long prefix (up to 64 KiB, times up to 2**20 entries), which
    the encoding stores once; materialising every key would multiply the memory by the entry
    count.  Decoding returns this compact sequence instead of a list in that case.
    """

    __slots__ = ("prefix", "rest")

    def __init__(self, prefix: bytes, rest: list[bytes]):
        self.prefix = prefix
        self.rest = rest

    def __len__(self) -> int:
        return len(self.rest)

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self.prefix + r for r in self.rest[i]]
        return self.prefix + self.rest[i]

    def __iter__(self) -> Iterator[bytes]:
        p = self.prefix
        return (p + r for r in self.rest)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (bytes, str)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PrefixedKeys(prefix={self.prefix[:16]!r}..., n={len(self.rest)})"


class _LeafValues(Sequence[Union[bytes, IndirectDataReference]]):
    """A decoded leaf's values, built on first access from the already validated columns."""

    __slots__ = ("_inline", "_lengths", "_kinds", "_files", "_fids", "_offsets", "_list")

    def __init__(
        self,
        inline: bytes,
        lengths: list[int],
        kinds: bytes,
        files: list[DataFileId],
        fids: list[int],
        offsets: list[int],
    ):
        self._inline = inline
        self._lengths = lengths
        self._kinds = kinds
        self._files = files
        self._fids = fids
        self._offsets = offsets
        self._list: list[bytes | IndirectDataReference] | None = None

    def _values(self) -> list[bytes | IndirectDataReference]:
        out = self._list
        if out is None:
            out = []
            append = out.append
            data = self._inline
            files, fids, offsets = self._files, self._fids, self._offsets
            pos = 0
            j = 0
            for ln, kind in zip(self._lengths, self._kinds):
                if kind:
                    append(IndirectDataReference(files[fids[j]], offsets[j], ln))
                    j += 1
                else:
                    append(data[pos : pos + ln])
                    pos += ln
            self._list = out
        return out

    def __len__(self) -> int:
        return len(self._lengths)

    @overload
    def __getitem__(self, i: int) -> bytes | IndirectDataReference: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes | IndirectDataReference]: ...

    def __getitem__(self, i: int | slice) -> bytes | IndirectDataReference | list[bytes | IndirectDataReference]:
        return self._values()[i]

    def __iter__(self) -> Iterator[bytes | IndirectDataReference]:
        return iter(self._values())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LeafValues):
            other = other._values()
        if not isinstance(other, Sequence) or isinstance(other, (bytes, str)):
            return NotImplemented
        return self._values() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._values())


#: Keys are materialised as a plain list unless that would repeat more than this many bytes
#: (or four times the node's size budget, if larger) of the node-wide common prefix.
_SHARED_PREFIX_BYTES = 1 << 20


def _read_keys(r: Reader, n: int, interior: bool, max_key_bytes: int) -> tuple[Sequence[bytes], list[int]]:
    """Read the key columns; keys are relative to the node's implicit prefix.

    As in TensorStore, the bytes held for the keys are bounded without repeating the common
    prefix of all keys: ``common + sum(len(key) - common)`` must not exceed ``max_key_bytes``
    (a node's decoded size bound), so a crafted node cannot expand into gigabytes of keys.
    """
    prefix = r.varint_column(n - 1, MAX_KEY_LENGTH, "key prefix length")
    ppos = r.pos
    suffix = r.varint_column(n, MAX_KEY_LENGTH, "key suffix length")
    scp = r.varint_column(n, MAX_KEY_LENGTH, "subtree common prefix length") if interior else []
    total = sum(suffix)
    kpos = r.pos
    blob = r.take(total, "key bytes")
    common = suffix[0]
    if prefix:
        common = min(common, min(prefix))
    if scp:
        common = min(common, min(scp))
    # bytes held for the keys, as TensorStore's key buffer: the common prefix once, plus the
    # rest of every key (the prefix lengths are validated one by one below)
    held = sum(prefix) + total - common * (n - 1)
    if held > max_key_bytes:
        raise r.error(f"keys expand to {held} bytes, more than {max_key_bytes}", ppos)
    # repeating the prefix may cost at most a few times the node's own budget
    compact = common * n > max(_SHARED_PREFIX_BYTES, 4 * max_key_bytes)
    # Keys are built relative to `drop` bytes of the common prefix: 0 (plain full keys), or
    # all of it (compact form, the prefix stored once).
    drop = common if compact else 0
    prev = blob[drop : suffix[0]]
    keys: list[bytes] = [prev]
    append = keys.append
    off = suffix[0]
    # The hot loop only builds keys; the checks run afterwards over whole columns at C speed.
    for p, s in zip(prefix, islice(suffix, 1, None)):
        end = off + s
        k = prev[: p - drop] + blob[off:end]
        append(k)
        prev = k
        off = end
    if n > 1:
        lens = list(map(len, keys))
        # a prefix may not reach past the previous key (else the slice above was short)
        if any(map(operator.gt, prefix, map(drop.__add__, lens))):
            i = next(i for i in range(1, n) if prefix[i - 1] > drop + lens[i - 1])
            raise r.error(
                f"key {i}: prefix length {prefix[i - 1]} exceeds the previous key's length {drop + lens[i - 1]}",
                ppos,
            )
        if drop + max(lens) > MAX_KEY_LENGTH:
            i = next(i for i in range(n) if drop + lens[i] > MAX_KEY_LENGTH)
            raise r.error(f"key {i}: length {drop + lens[i]} exceeds {MAX_KEY_LENGTH}", ppos)
        # keys share the dropped prefix, so comparing the rest decides the order
        if any(map(operator.ge, keys, islice(keys, 1, None))):
            i = next(i for i in range(1, n) if keys[i] <= keys[i - 1])
            raise r.error(f"keys not strictly increasing at entry {i}", kpos)
    if interior:
        for i in range(n):
            if scp[i] > drop + len(keys[i]):
                raise r.error(f"entry {i}: subtree common prefix length exceeds its key length", ppos)
    if compact:
        return PrefixedKeys(blob[:common], keys), scp
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
    ``max_body`` bounds the decoded body size and the bytes its keys expand to (keys that
    all share a long prefix come back as a compact :class:`PrefixedKeys` sequence).
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
    keys, scp = _read_keys(r, n, height > 0, max_body)
    node: BtreeNode
    if height == 0:
        lengths = r.varint_column(n, _LIMIT63, "value length")
        kpos = r.pos
        kinds = r.take(n, "value kinds")
        if max(kinds) > 1:
            raise r.error("unknown value kind", kpos + next(i for i, k in enumerate(kinds) if k > 1))
        m = kinds.count(1)
        fpos = r.pos
        if m and not files:
            raise r.error("out-of-line value but the data file table is empty", fpos)
        fids = r.varint_column(m, len(files) - 1, "data file index") if m else []
        offsets = r.varint_column(m, _LIMIT63, "value offset") if m else []
        vpos = r.pos
        # Validate every value now; build the value objects only when first asked for
        # (listing keys never needs them).
        if m == 0:
            inline_lengths: Sequence[int] = lengths
        elif m == n:
            inline_lengths = []
        else:
            inline_lengths = [ln for ln, k in zip(lengths, kinds) if not k]
        if inline_lengths and max(inline_lengths) > MAX_INLINE_VALUE_READ:
            raise r.error(f"inline value of {max(inline_lengths)} bytes exceeds {MAX_INLINE_VALUE_READ}", vpos)
        inline_total = sum(inline_lengths)
        if vpos + inline_total > r.end:
            raise r.error("truncated inline values", vpos)
        if m:
            out_lengths = lengths if m == n else [ln for ln, k in zip(lengths, kinds) if k]
            if any(o + ln > _LIMIT63 for o, ln in zip(offsets, out_lengths)):
                raise r.error("value reference overflows", fpos)
        r.pos = vpos + inline_total
        values = _LeafValues(bytes(body[vpos : vpos + inline_total]), lengths, kinds, files, fids, offsets)
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


def _encode_keys(body: bytearray, keys: Sequence[bytes], scp: Sequence[int] | None) -> None:
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
    keys: Sequence[bytes], values: Sequence[bytes | IndirectDataReference], zstd_level: int | None
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
    keys: Sequence[bytes],
    subtree_prefix_lengths: Sequence[int],
    children: Sequence[BtreeChild],
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
