"""B+tree nodes: leaves map keys to inline or out-of-line values, interior nodes to children.

Keys inside a node are stored relative to the node's implicit prefix (which the parent's
entry determines) and prefix-compressed against the previous key.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, NamedTuple, Union, overload

import numpy as np

from ocdbt_py.format.data_file_table import (
    DataFileId,
    IndirectDataReference,
    Statistics,
    decode_data_file_table,
    encode_data_file_table,
)
from ocdbt_py.format.envelope import BTREE_NODE_MAGIC, decode_envelope, encode_envelope
from ocdbt_py.format.reader import Reader, put_varint

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BtreeChild",
    "LeafNode",
    "InteriorNode",
    "BtreeNode",
    "PrefixedKeys",
    "decode_btree_node",
    "node_nbytes",
    "list_leaf_nbytes",
    "value_lengths",
    "inline_values",
    "value_locations",
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
    #: Estimated bytes of memory the node holds, set by the decoder (``-1``: not known yet;
    #: see :func:`node_nbytes`).
    nbytes: int = dataclasses.field(default=-1, compare=False, repr=False)


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
    #: As :attr:`LeafNode.nbytes`.
    nbytes: int = dataclasses.field(default=-1, compare=False, repr=False)


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


def _as_list(column: list[int] | np.ndarray) -> list[int]:
    return column if isinstance(column, list) else column.tolist()  # type: ignore[no-any-return]


class _LeafValues(Sequence[Union[bytes, IndirectDataReference]]):
    """A decoded leaf's values, built on first access from the already validated columns.

    The inline values stay in the decoded node body (``inline`` is that body, they start at
    ``start``) until then, so listing keys never copies them; the body is released once the
    values are built.
    """

    __slots__ = ("_inline", "_start", "_lengths", "_kinds", "_files", "_fids", "_offsets", "_list")

    def __init__(
        self,
        inline: bytes | memoryview,
        start: int,
        lengths: list[int] | np.ndarray,
        kinds: bytes,
        files: list[DataFileId],
        fids: list[int] | np.ndarray,
        offsets: list[int] | np.ndarray,
    ):
        self._inline: bytes | memoryview | None = inline
        self._start = start
        self._lengths = lengths
        self._kinds = kinds
        self._files = files
        self._fids = fids
        self._offsets = offsets
        self._list: list[bytes | IndirectDataReference] | None = None

    def _values(self) -> list[bytes | IndirectDataReference]:
        # read the body before the list: another thread sets the list before it drops the body
        data = self._inline
        out = self._list
        if out is None:
            assert data is not None
            out = []
            append = out.append
            files = self._files
            # NumPy columns (from large nodes) become lists of Python ints here
            fids = _as_list(self._fids)
            offsets = _as_list(self._offsets)
            pos = self._start
            j = 0
            for ln, kind in zip(_as_list(self._lengths), self._kinds):
                if kind:
                    append(IndirectDataReference(files[fids[j]], offsets[j], ln))
                    j += 1
                else:
                    append(bytes(data[pos : pos + ln]))
                    pos += ln
            self._list = out
            self._inline = None
        return out

    def lengths(self) -> list[int]:
        """Every value's length (inline or not), without building the values."""
        return _as_list(self._lengths)

    def inline_values(self, indices: Sequence[int]) -> list[bytes | None]:
        """The inline values at ``indices`` (``None`` where a value is stored out of line),
        without building the other values."""
        data = self._inline
        built = self._list
        if data is None:
            assert built is not None
            return [v if isinstance(v, bytes) else None for v in (built[i] for i in indices)]
        lengths = np.asarray(self._lengths, dtype=np.int64)
        kinds = np.frombuffer(self._kinds, dtype=np.uint8)
        inline = np.where(kinds == 0, lengths, 0)
        starts = np.cumsum(inline) - inline + self._start
        ix = np.asarray(indices, dtype=np.intp)
        lo = starts[ix]
        cut = zip(kinds[ix].tolist(), lo.tolist(), (lo + lengths[ix]).tolist())
        if isinstance(data, bytes):  # a slice of bytes is bytes: one copy
            return [None if k else data[a:b] for k, a, b in cut]
        return [None if k else bytes(data[a:b]) for k, a, b in cut]

    def locations(self) -> tuple[list[DataFileId], list[int], list[int], list[int]]:
        """Where every value is, as columns (see :func:`value_locations`), without building
        the values."""
        if self._inline is None:
            assert self._list is not None
            return _locations_of(self._list)
        lengths = np.asarray(self._lengths, dtype=np.int64)
        out_of_line = np.frombuffer(self._kinds, dtype=np.uint8) != 0
        fidx = np.full(len(lengths), -1, dtype=np.int64)
        offsets = np.zeros(len(lengths), dtype=np.int64)
        fidx[out_of_line] = self._fids
        offsets[out_of_line] = self._offsets
        return list(self._files), fidx.tolist(), offsets.tolist(), lengths.tolist()

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

    def nbytes(self) -> int:
        """Estimated bytes of memory these values hold at most (see :func:`node_nbytes`).

        Until first use they keep the decoded node body, from then on the value objects
        instead: the estimate is the larger of the two (plus the columns, kept throughout),
        so a cached node's weight need not change when its values are built.  O(1) for the
        NumPy columns of large nodes.
        """
        # read the body before the list, as _values() does
        data = self._inline
        built = self._list
        n = len(self._lengths)
        m = len(self._fids)
        out = (
            _VALUES_OBJECT + _column_nbytes(self._lengths) + _BYTES + n
            + _column_nbytes(self._fids) + _column_nbytes(self._offsets) + _files_nbytes(self._files, True)
        )
        if data is None:
            assert built is not None
            return out + _values_nbytes(built)
        # the inline values fill the body from _start to its end
        inline_total = len(data) - self._start
        # (references count ints of their own: those built from NumPy columns have them)
        return out + max(_buffer_nbytes(data), _value_list_nbytes(n, inline_total, m))


# -- memory estimates ---------------------------------------------------------------------
# What the objects of a decoded node cost in CPython (64-bit), allocator rounding included;
# the node cache weighs nodes by these (node_nbytes).
_PTR = 8  # a list slot
_LIST = 64  # a list's header
_BYTES = 48  # a bytes object beyond its data (33-byte header, rounded up)
_INT = 32  # an int outside the small-int cache (beyond 256)
_REF = 64  # a 3-tuple: IndirectDataReference, Statistics
_VIEW = 192  # a memoryview
_ARRAY = 112  # a NumPy array's header
_NODE_OBJECT = 352  # a LeafNode / InteriorNode with an attribute dict (3.11+ may not build it)
_VALUES_OBJECT = 128  # a _LeafValues and its start offset
_PREFIXED = 64  # a PrefixedKeys
#: An interior node's child: list slot, BtreeChild, reference, Statistics, and five ints
#: (location offset and length, the three counts; small counts are shared, so this is a bound).
_CHILD = _PTR + 64 + _REF + _REF + 5 * _INT
#: A DataFileId (a 2-tuple and its two paths), beyond the paths' data.
_FILE = 64 + 2 * _BYTES


def _buffer_nbytes(data: bytes | memoryview) -> int:
    """Memory ``data`` keeps alive: a view keeps all of the object it views."""
    if isinstance(data, memoryview):
        owner = data.obj
        size = len(owner) if isinstance(owner, bytes) else memoryview(owner).nbytes
        return _VIEW + _BYTES + size
    return _BYTES + len(data)


def value_lengths(values: Sequence[bytes | IndirectDataReference]) -> list[int]:
    """The length of every value of a leaf node (see :meth:`_LeafValues.lengths`)."""
    if isinstance(values, _LeafValues):
        return values.lengths()
    return [len(v) if isinstance(v, bytes) else v.length for v in values]


def value_locations(
    values: Sequence[bytes | IndirectDataReference],
) -> tuple[list[DataFileId], list[int], list[int], list[int]]:
    """Where every value of a leaf node is, as four columns: the distinct data ``files``, and
    per value the index of its file in ``files`` (``-1``: stored inline), its offset in that
    file (``0`` when inline) and its length.  For the values of a decoded node this builds no
    Python object per value."""
    if isinstance(values, _LeafValues):
        return values.locations()
    return _locations_of(values)


def _locations_of(
    values: Sequence[bytes | IndirectDataReference],
) -> tuple[list[DataFileId], list[int], list[int], list[int]]:
    files: list[DataFileId] = []
    index: dict[DataFileId, int] = {}
    fidx: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []
    for v in values:
        if isinstance(v, bytes):
            fidx.append(-1)
            offsets.append(0)
            lengths.append(len(v))
            continue
        i = index.get(v.file)
        if i is None:
            i = index[v.file] = len(files)
            files.append(v.file)
        fidx.append(i)
        offsets.append(v.offset)
        lengths.append(v.length)
    return files, fidx, offsets, lengths


def inline_values(values: Sequence[bytes | IndirectDataReference], indices: Sequence[int]) -> list[bytes | None]:
    """The inline values of a leaf node at ``indices`` (``None``: stored out of line)."""
    if isinstance(values, _LeafValues):
        return values.inline_values(indices)
    return [v if isinstance(v, bytes) else None for v in (values[i] for i in indices)]


def _column_nbytes(column: list[int] | np.ndarray) -> int:
    """A list of ints (with the ints beyond CPython's small-int cache) or a NumPy column."""
    if isinstance(column, list):
        big = sum(map((256).__lt__, column)) if column and max(column) > 256 else 0
        return _LIST + len(column) * _PTR + _INT * big
    return _ARRAY + int(column.nbytes)


def _files_nbytes(files: Sequence[DataFileId], as_list: bool) -> int:
    """The data file ids of a node's table (in a list of their own if ``as_list``)."""
    out = sum(_FILE + len(f.base_path) + len(f.relative_path) for f in files)
    return out + _LIST + len(files) * _PTR if as_list else out


def _keys_nbytes(keys: Sequence[bytes], key_bytes: int | None) -> int:
    """A node's keys, ``key_bytes`` long in all (``None``: measured here, in one pass)."""
    out = _LIST + len(keys) * (_PTR + _BYTES)
    if isinstance(keys, PrefixedKeys):
        out += _PREFIXED + _BYTES + len(keys.prefix)
        keys = keys.rest
    return out + (sum(map(len, keys)) if key_bytes is None else key_bytes)


def _value_list_nbytes(n: int, inline_bytes: int, refs: int) -> int:
    """A list of ``n`` leaf values: ``refs`` references, the others ``inline_bytes`` of bytes."""
    return _LIST + n * _PTR + (n - refs) * _BYTES + inline_bytes + refs * (_REF + 2 * _INT)


def _values_nbytes(values: Sequence[bytes | IndirectDataReference]) -> int:
    """A plain list of leaf values (bytes or references), one pass over it."""
    inline = refs = 0
    for v in values:
        if isinstance(v, bytes):
            inline += len(v)
        else:
            refs += 1
    return _value_list_nbytes(len(values), inline, refs)


def list_leaf_nbytes(n: int, key_bytes: int, inline_bytes: int, refs: int) -> int:
    """:func:`node_nbytes` of a :class:`LeafNode` of plain lists, from its sizes alone.

    ``n`` entries whose keys are ``key_bytes`` long in all, ``refs`` of whose values are
    references and the others ``inline_bytes`` of bytes in all.  The writer sizes the nodes it
    builds with this from the columns it has at hand (a pass over a node's key and value
    objects would cost a cache miss each).
    """
    return _NODE_OBJECT + _LIST + n * (_PTR + _BYTES) + key_bytes + _value_list_nbytes(n, inline_bytes, refs)


def node_nbytes(node: BtreeNode) -> int:
    """Estimated bytes of memory ``node`` holds: its keys, values or children, and columns.

    A leaf decoded by :func:`decode_btree_node` counts the larger of its two states (the
    decoded body it keeps until its values are first used, or the value objects built
    then), so the estimate stays a bound for the node's lifetime.  Decoded nodes carry the
    estimate (:attr:`LeafNode.nbytes`, computed in O(1) from what the decoder measured), as
    do the leaves the writer builds (:func:`list_leaf_nbytes`); other nodes are measured in
    one pass, without their data file ids (those of built nodes are the writer's, shared).
    """
    if node.nbytes >= 0:
        return node.nbytes
    return _node_nbytes(node, None, ())


def _node_nbytes(node: BtreeNode, key_bytes: int | None, files: Sequence[DataFileId]) -> int:
    out = _NODE_OBJECT + _keys_nbytes(node.keys, key_bytes)
    if isinstance(node, LeafNode):
        values = node.values
        return out + (values.nbytes() if isinstance(values, _LeafValues) else _values_nbytes(values))
    n = len(node.children)
    return (
        out + _column_nbytes(node.subtree_prefix_lengths) + _LIST + n * _CHILD + _files_nbytes(files, False)
    )


#: Keys are materialised as a plain list unless that would repeat more than this many bytes
#: (or four times the node's size budget, if larger) of the node-wide common prefix.
_SHARED_PREFIX_BYTES = 1 << 20
#: Nodes with at least this many entries decode their key and value columns with NumPy
#: (below it the fixed cost of the NumPy calls exceeds the per-key loop's).
_VECTOR_ENTRIES = 384
#: The NumPy key builder lays the keys out as an ``entries x longest key`` byte matrix; it
#: runs only while that matrix holds at most this many times the keys' own bytes (plus
#: ``_MATRIX_PER_KEY`` bytes a key, about what a Python bytes object costs anyway).
_MATRIX_SLACK = 3
_MATRIX_PER_KEY = 64
#: ... and while the columns keys share with their predecessors beyond the node-wide prefix
#: number at most one per this many keys, plus a few.
_KEYS_PER_FILL_COLUMN = 100
_FREE_FILL_COLUMNS = 8
#: Rows of the key matrix are laid out in blocks of about this many bytes (temporaries this
#: small are recycled by the allocator instead of being mapped, and faulted in, each time).
_BLOCK_BYTES = 64 << 10


def _read_keys(
    r: Reader, n: int, interior: bool, max_key_bytes: int, sizes: list[int] | None = None
) -> tuple[Sequence[bytes], list[int]]:
    """Read the key columns; keys are relative to the node's implicit prefix.

    If ``sizes`` is given, the total length of the keys as returned (the bytes objects,
    without a :class:`PrefixedKeys` prefix) is appended to it.

    As in TensorStore, the bytes held for the keys are bounded without repeating the common
    prefix of all keys: ``common + sum(len(key) - common)`` must not exceed ``max_key_bytes``
    (a node's decoded size bound), so a crafted node cannot expand into gigabytes of keys.

    Large nodes are decoded with NumPy (:func:`_read_keys_numpy`); small ones, and nodes whose
    keys would make its byte matrix too sparse, key by key (:func:`_read_keys_loop`).  Both
    accept exactly the same input and raise the same first error.
    """
    if n >= _VECTOR_ENTRIES:
        start = r.pos
        out = _read_keys_numpy(r, n, interior, max_key_bytes, sizes)
        if out is not None:
            return out
        r.pos = start
    return _read_keys_loop(r, n, interior, max_key_bytes, sizes)


def _read_keys_loop(
    r: Reader, n: int, interior: bool, max_key_bytes: int, sizes: list[int] | None = None
) -> tuple[Sequence[bytes], list[int]]:
    """:func:`_read_keys`, one key at a time (each key is the previous one's prefix plus its suffix)."""
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
    if sizes is not None:
        # sum(prefix) + total is the keys' full length
        sizes.append(held + common * (n - 1) - drop * n)
    if compact:
        return PrefixedKeys(blob[:common], keys), scp
    return keys, scp


def _gather_rows(r: Reader, n: int, width: int, rel: np.ndarray, own: np.ndarray, begin: np.ndarray,
                 end: np.ndarray, own_pos: int, own_bytes: np.ndarray) -> np.ndarray:
    """The ``n x width`` key matrix with each row's own bytes in place (columns left of
    ``own`` are filled later); ``own_pos`` is where ``own_bytes`` start in the node body."""
    # Every key's own bytes, in blob order: key i's `count[i]` bytes start at `begin[i]` in
    # `own_bytes` and belong in row i from column own[i] on.  Row i is first filled with the
    # `width` bytes of the node body that put them there (a gather of fixed-size windows of
    # the body, in place), then zeroed from column rel[i] on; columns left of own[i] are
    # overwritten below.  Rows whose window would leave the body are filled one by one.
    body = np.frombuffer(r.data, dtype=np.uint8, count=r.end)
    start = begin - own
    start += own_pos
    outside = (start < 0) | (start > body.size - width)
    stray = np.flatnonzero(outside).tolist() if outside.any() else []
    if stray:
        np.clip(start, 0, body.size - width, out=start)
    windows = np.lib.stride_tricks.sliding_window_view(body, width)
    m = np.empty((n, width), dtype=np.uint8)
    # in blocks of rows, so that no temporary is larger than _BLOCK_BYTES
    block = max(1, _BLOCK_BYTES // width)
    keep = np.zeros(2 * block, dtype=np.uint8)
    keep[::2] = 1
    runs = np.empty((block, 2), dtype=np.int64)
    for a in range(0, n, block):
        b = min(a + block, n)
        rows = m[a:b]
        rows[...] = windows[start[a:b]]
        runs[: b - a, 0] = rel[a:b]
        np.subtract(width, rel[a:b], out=runs[: b - a, 1])
        rows *= np.repeat(keep[: 2 * (b - a)], runs[: b - a].ravel()).reshape(b - a, width)
    for i in stray:
        row = m[i]
        row[own[i] : rel[i]] = own_bytes[begin[i] : end[i]]
        row[rel[i] :] = 0
    return m


def _fill_shared_columns(m: np.ndarray, own: np.ndarray, head: int, n: int) -> None:
    """Fill the bytes each key shares with its predecessor, column by column."""
    # Column j of a key with own > j is its predecessor's column j, so each column is
    # piecewise constant between the rows that store it themselves (own <= j; row 0 always
    # does).  Per column, whichever is smaller is expanded: the runs starting at those rows,
    # or the rows that copy (each run of copying rows takes the row just before the run).
    for j in range(head, int(own.max())):
        col = m[:, j]
        copy = own > j
        ncopy = int(np.count_nonzero(copy))
        if 2 * ncopy >= n:
            starts = np.flatnonzero(~copy)
            col[:] = np.repeat(col[starts], np.diff(starts, append=n))
        elif ncopy:
            copying = np.flatnonzero(copy)
            first = np.empty(ncopy, dtype=bool)
            first[0] = True
            np.not_equal(copying[1:], copying[:-1] + 1, out=first[1:])
            src = np.where(first, copying - 1, 0)
            np.maximum.accumulate(src, out=src)
            col[copying] = col[src]


def _rows_to_keys(r: Reader, m: np.ndarray, n: int, width: int, rel: np.ndarray, own: np.ndarray,
                  count: np.ndarray, begin: np.ndarray, end: np.ndarray, own_bytes: np.ndarray,
                  kpos: int) -> list[bytes]:
    """The matrix rows as ``bytes`` keys, checked to be strictly increasing."""
    flat = m.ravel()
    keys: list[bytes] = m.view(f"S{width}").ravel().tolist()
    # the S view dropped trailing NULs: rebuild the keys that really end in 0x00 (a key's
    # last byte is its own last byte, or, without own bytes, its predecessor's byte there)
    has_own = count > 0
    last = np.where(has_own, own_bytes[np.maximum(end - 1, 0)], 1)
    if not has_own.all():
        no_own = np.flatnonzero(~has_own & (rel > 0))
        last[no_own] = flat[no_own * width + rel[no_own] - 1]
    if not last.all():
        for i in np.flatnonzero(last == 0).tolist():
            keys[i] = m[i, : rel[i]].tobytes()
    # Key i (i >= 1) equals key i-1 in its first own[i] bytes, so it is greater iff it has
    # own bytes and key i-1 ends there or key i's first own byte is the greater.  Pairs that
    # tie on that byte (legal only for a prefix length shorter than the two keys' common
    # prefix) are compared exactly.
    nxt = own[1:]
    lead = own_bytes[np.minimum(begin[1:], own_bytes.size - 1)] if own_bytes.size else np.zeros(n - 1, np.uint8)
    before = flat[np.minimum(np.arange(0, (n - 1) * width, width, dtype=np.int64) + nxt, flat.size - 1)]
    greater = has_own[1:] & ((nxt == rel[:-1]) | (lead > before))
    if not greater.all():
        for i in np.flatnonzero(~greater).tolist():
            if keys[i + 1] <= keys[i]:
                raise r.error(f"keys not strictly increasing at entry {i + 1}", kpos)
    return keys


def _read_keys_numpy(
    r: Reader, n: int, interior: bool, max_key_bytes: int, sizes: list[int] | None = None
) -> tuple[Sequence[bytes], list[int]] | None:
    """:func:`_read_keys` for ``n >= 2`` keys at once with NumPy; ``None`` to use the loop.

    The keys (less ``drop`` bytes of the common prefix, as in the loop) are laid out as the
    rows of an ``n x width`` zero-padded byte matrix.  Row ``i`` is gathered from a window of
    the key bytes that puts key ``i``'s own (suffix) bytes in place, then zeroed past its
    length; the bytes a key shares with its predecessor are filled in column by column (a
    column is piecewise constant between the rows that store it themselves).  The rows
    become ``bytes`` through a fixed-width ``S`` view, which drops trailing NUL padding: the
    keys that really end in ``0x00`` are rebuilt exactly.  Lengths and prefix lengths are
    validated on whole columns before anything is built; the order is checked from each
    key's first own byte against its predecessor's byte in that column (ties and keys without
    own bytes are compared exactly).  The matrix is used only while it is at most
    ``_MATRIX_SLACK`` times the keys' bytes (plus ``_MATRIX_PER_KEY`` a key) and the shared
    columns are few; otherwise ``None`` hands the node to the loop.
    """

    prefix = r.varint_array(n - 1, MAX_KEY_LENGTH, "key prefix length")
    ppos = r.pos
    suffix = r.varint_array(n, MAX_KEY_LENGTH, "key suffix length")
    scp = r.varint_array(n, MAX_KEY_LENGTH, "subtree common prefix length") if interior else None
    total = int(suffix.sum())
    kpos = r.pos
    if total > r.remaining():
        r.take(total, "key bytes")  # raises: truncated
    # the key bytes are read in place (copied once, into the key matrix)
    key_bytes = np.frombuffer(r.data, dtype=np.uint8, count=total, offset=kpos)
    r.pos = kpos + total
    common = min(int(suffix[0]), int(prefix.min()))
    if scp is not None:
        common = min(common, int(scp.min()))
    held = int(prefix.sum()) + total - common * (n - 1)
    if held > max_key_bytes:
        raise r.error(f"keys expand to {held} bytes, more than {max_key_bytes}", ppos)
    compact = common * n > max(_SHARED_PREFIX_BYTES, 4 * max_key_bytes)
    drop = common if compact else 0
    # absolute key lengths, valid once every prefix is within its predecessor
    lens = suffix.copy()
    lens[1:] += prefix
    bad = prefix > lens[:-1]
    if bad.any():
        i = int(np.argmax(bad)) + 1
        raise r.error(
            f"key {i}: prefix length {int(prefix[i - 1])} exceeds the previous key's length {int(lens[i - 1])}",
            ppos,
        )
    if int(lens.max()) > MAX_KEY_LENGTH:
        i = int(np.argmax(lens > MAX_KEY_LENGTH))
        raise r.error(f"key {i}: length {int(lens[i])} exceeds {MAX_KEY_LENGTH}", ppos)
    rel = lens - drop  # lengths of the built keys (drop <= common <= every length)
    width = int(rel.max())
    if width == 0 or n * width > _MATRIX_SLACK * int(rel.sum()) + _MATRIX_PER_KEY * n:
        return None
    head = common - drop  # columns every key shares with key 0
    # relative column where each key's own bytes start (key 0 stores all of its bytes)
    own = np.empty(n, dtype=np.int64)
    own[0] = 0
    np.subtract(prefix, drop, out=own[1:])
    # each column some key shares with its predecessor (beyond the node-wide prefix) costs
    # one NumPy pass over the rows; past about one such column per 100 keys the loop wins
    if int(own.max()) - head > n // _KEYS_PER_FILL_COLUMN + _FREE_FILL_COLUMNS:
        return None
    count = rel - own
    end = np.cumsum(count)
    begin = end - count
    own_bytes = key_bytes[drop:]
    m = _gather_rows(r, n, width, rel, own, begin, end, kpos + drop, own_bytes)
    if head:
        m[:, :head] = key_bytes[drop:common]
    _fill_shared_columns(m, own, head, n)
    keys = _rows_to_keys(r, m, n, width, rel, own, count, begin, end, own_bytes, kpos)
    scp_list: list[int] = []
    if scp is not None:
        bad = scp > lens
        if bad.any():
            raise r.error(f"entry {int(np.argmax(bad))}: subtree common prefix length exceeds its key length", ppos)
        scp_list = scp.tolist()
    if sizes is not None:
        sizes.append(held + common * (n - 1) - drop * n)
    if compact:
        return PrefixedKeys(key_bytes[:common].tobytes(), keys), scp_list
    return keys, scp_list


def _file(r: Reader, files: list[DataFileId], idx: int, pos: int) -> DataFileId:
    if idx >= len(files):
        raise r.error(f"data file index {idx} out of range ({len(files)} files)", pos)
    return files[idx]


def _read_leaf_values(r: Reader, n: int, files: list[DataFileId], body: bytes | memoryview) -> _LeafValues:
    """Read and validate a leaf's value columns; the value objects are built on first use.

    Nodes of at least ``_VECTOR_ENTRIES`` entries are checked with NumPy over whole columns
    (same checks, same first error as the list path).
    """
    vector = n >= _VECTOR_ENTRIES
    lengths: list[int] | np.ndarray
    if vector:
        lengths = r.varint_array(n, _LIMIT63, "value length")
    else:
        lengths = r.varint_column(n, _LIMIT63, "value length")
    kpos = r.pos
    kinds = r.take(n, "value kinds")
    if vector:
        kind_column = np.frombuffer(kinds, dtype=np.uint8)
        bad_kind = int(kind_column.max()) > 1
        m = int(np.count_nonzero(kind_column))
    else:
        m = kinds.count(1)
        bad_kind = m + kinds.count(0) != n
    if bad_kind:
        raise r.error("unknown value kind", kpos + next(i for i, k in enumerate(kinds) if k > 1))
    fpos = r.pos
    if m and not files:
        raise r.error("out-of-line value but the data file table is empty", fpos)
    fids: list[int] | np.ndarray = []
    offsets: list[int] | np.ndarray = []
    vpos: int
    inline_total: int
    if vector:
        assert isinstance(lengths, np.ndarray)
        if m:
            fids = r.varint_array(m, len(files) - 1, "data file index")
            offsets = r.varint_array(m, _LIMIT63, "value offset")
        vpos = r.pos
        is_inline = kind_column == 0
        inline_lengths = np.where(is_inline, lengths, 0) if m else lengths
        # the maximum is checked first, so the sum below cannot overflow
        top = int(inline_lengths.max())
        if top > MAX_INLINE_VALUE_READ:
            raise r.error(f"inline value of {top} bytes exceeds {MAX_INLINE_VALUE_READ}", vpos)
        inline_total = int(inline_lengths.sum())
        if vpos + inline_total > r.end:
            raise r.error("truncated inline values", vpos)
        # offset + length > 2**63 - 1 for some reference?  The largest of each bounds it.
        if m and int(np.max(offsets)) + int(lengths.max()) > _LIMIT63:
            out_lengths = lengths if m == n else lengths[~is_inline]
            # (both are at most 2**63 - 1, so the subtraction cannot overflow)
            if (np.asarray(offsets) > _LIMIT63 - out_lengths).any():
                raise r.error("value reference overflows", fpos)
    else:
        assert isinstance(lengths, list)
        if m:
            fids = r.varint_column(m, len(files) - 1, "data file index")
            offsets = r.varint_column(m, _LIMIT63, "value offset")
        vpos = r.pos
        # Validate every value now; build the value objects only when first asked for
        # (listing keys never needs them).
        if m == 0:
            inline_list: list[int] = lengths
        elif m == n:
            inline_list = []
        else:
            inline_list = [ln for ln, k in zip(lengths, kinds) if not k]
        if inline_list and max(inline_list) > MAX_INLINE_VALUE_READ:
            raise r.error(f"inline value of {max(inline_list)} bytes exceeds {MAX_INLINE_VALUE_READ}", vpos)
        inline_total = sum(inline_list)
        if vpos + inline_total > r.end:
            raise r.error("truncated inline values", vpos)
        if m:
            out_list = lengths if m == n else [ln for ln, k in zip(lengths, kinds) if k]
            if any(o + ln > _LIMIT63 for o, ln in zip(offsets, out_list)):
                raise r.error("value reference overflows", fpos)
    r.pos = vpos + inline_total
    return _LeafValues(body, vpos, lengths, kinds, files, fids, offsets)


#: Whatever the configuration allows, a node's keys may expand to at most this many times its
#: (decoded) body size, or this floor: a 193 KB leaf whose keys share 65,533-byte prefixes
#: with their predecessors cannot become 1 GiB of keys under ``max_decoded_node_bytes = 0``.
KEY_EXPANSION_RATIO = 128
KEY_EXPANSION_FLOOR = 16 << 20


def key_bytes_limit(body_bytes: int, max_body: int) -> int:
    """Most bytes a node's keys may expand to: ``max_body``, and at most
    ``KEY_EXPANSION_RATIO`` times the body size (but never less than ``KEY_EXPANSION_FLOOR``)."""
    return min(max_body, max(KEY_EXPANSION_FLOOR, KEY_EXPANSION_RATIO * body_bytes))


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
    all share a long prefix come back as a compact :class:`PrefixedKeys` sequence); the keys
    are also bounded by :func:`key_bytes_limit` of the body size.
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
    sizes: list[int] = []
    keys, scp = _read_keys(r, n, height > 0, key_bytes_limit(len(body), max_body), sizes)
    node: BtreeNode
    if height == 0:
        values = _read_leaf_values(r, n, files, body)
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
    node.nbytes = _node_nbytes(node, sizes[0], files)
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
