"""The NumPy decoding paths of B+tree nodes against the key-by-key ones.

Large nodes build their keys as rows of a byte matrix and check their value columns with
NumPy (``_read_keys_numpy``, the vector branch of ``_read_leaf_values``, ``Reader.varint_array``).
They must accept exactly what the list paths accept, decode it to the same keys and values,
and reject everything else with the same first :class:`CorruptionError` (message and offset).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ocdbt_py
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format import btree
from ocdbt_py.format.btree import (
    MAX_KEY_LENGTH,
    BtreeChild,
    InteriorNode,
    LeafNode,
    PrefixedKeys,
    decode_btree_node,
    encode_interior_node,
    encode_leaf_node,
)
from ocdbt_py.format.data_file_table import (
    DataFileId,
    IndirectDataReference,
    Statistics,
    encode_data_file_table,
)
from ocdbt_py.format.envelope import BTREE_NODE_MAGIC, encode_envelope
from ocdbt_py.format.reader import Reader, put_varint
from ocdbt_py.kvstore import MemoryStore
from ocdbt_py.read.btree_read import iterate, iterate_keys
from tests.ocdbt.ocdbt_craft import RAW, DbFiles, build_tree, generation, single_manifest

BIG = 1 << 30
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _numpy_path_for_any_node() -> Iterator[None]:
    """Let the NumPy key builder take nodes the cost heuristics would give to the loop."""
    with mock.patch.object(btree, "_FREE_FILL_COLUMNS", 1 << 20):
        yield


def _varints(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        put_varint(out, v)
    return bytes(out)


def _run(fn, body: bytes, n: int, interior: bool, limit: int = BIG):  # type: ignore[no-untyped-def]
    """``fn`` over a key-column body: its result and end position, or its CorruptionError text."""
    r = Reader(body, path="node", base=100)
    try:
        out = fn(r, n, interior, limit)
    except CorruptionError as e:
        return ("error", str(e))
    if out is None:
        return None
    keys, scp = out
    return ("ok", type(keys).__name__, list(keys), getattr(keys, "prefix", None), scp, r.pos)


def _same(body: bytes, n: int, interior: bool, limit: int = BIG) -> Any:
    """Both paths agree on ``body`` (the NumPy one may decline, then the loop decides)."""
    loop = _run(btree._read_keys_loop, body, n, interior, limit)
    vec = _run(btree._read_keys_numpy, body, n, interior, limit)
    if vec is not None:
        assert vec == loop
    # the dispatcher gives the loop's answer whichever path it takes
    assert _run(btree._read_keys, body, n, interior, limit) == loop
    return loop


def _key_columns(keys: list[bytes], scp: list[int] | None = None, maximal: bool = True) -> bytes:
    """The key columns of a node; ``maximal=False`` shortens some shared prefixes (legal)."""
    prefixes = []
    for i in range(1, len(keys)):
        a, b = keys[i - 1], keys[i]
        p = 0
        while p < min(len(a), len(b)) and a[p] == b[p]:
            p += 1
        if not maximal and p and i % 3 == 0:
            p -= 1
        prefixes.append(p)
    suffixes = [len(keys[0])] + [len(keys[i]) - prefixes[i - 1] for i in range(1, len(keys))]
    body = _varints(prefixes) + _varints(suffixes)
    if scp is not None:
        body += _varints(scp)
    body += keys[0] + b"".join(keys[i][prefixes[i - 1] :] for i in range(1, len(keys)))
    return body


# keys from a small alphabet that includes NUL, so shared prefixes, keys that are prefixes of
# others and keys ending in 0x00 are all common
_alphabet = st.sampled_from([b"\x00", b"\x01", b"a", b"b", b"\xff"])
_key = st.lists(_alphabet, max_size=12).map(b"".join)
_keysets = st.lists(_key, min_size=2, max_size=120, unique=True).map(sorted)


@given(_keysets, st.binary(max_size=20), st.booleans())
@SETTINGS
def test_valid_key_columns_decode_identically(keys: list[bytes], common: bytes, maximal: bool) -> None:
    keys = [common + k for k in keys]
    out = _same(_key_columns(keys, maximal=maximal), len(keys), False)
    assert out is not None and out[0] == "ok" and out[2] == keys


@given(_keysets, st.data())
@SETTINGS
def test_interior_key_columns_decode_identically(keys: list[bytes], data: st.DataObject) -> None:
    scp = [data.draw(st.integers(0, len(k) + 1)) for k in keys]  # len + 1: rejected
    _same(_key_columns(keys, scp), len(keys), True)


@given(
    st.integers(2, 80),
    st.data(),
)
@SETTINGS
def test_corrupt_key_columns_fail_identically(n: int, data: st.DataObject) -> None:
    """Arbitrary prefix/suffix columns: prefixes past the previous key, descending, equal or
    over-long keys, truncated bytes -- both paths give the same first error or the same keys."""
    prefixes = data.draw(st.lists(st.integers(0, 6), min_size=n - 1, max_size=n - 1))
    suffixes = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    total = sum(suffixes)
    blob = data.draw(st.binary(min_size=max(0, total - 2), max_size=total + 2).filter(lambda b: b))
    interior = data.draw(st.booleans())
    scp = data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)) if interior else None
    body = _varints(prefixes) + _varints(suffixes) + (_varints(scp) if scp else b"") + blob
    limit = data.draw(st.sampled_from([BIG, 4 * n, 2 * n]))
    _same(body, n, interior, limit)


def test_sorted_random_prefixes_decode_identically() -> None:
    """Prefix-compressed runs that nearly always hold: valid ones and single corruptions."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(48, 400))
        keys = sorted({bytes(rng.integers(0, 4, int(rng.integers(1, 9))).astype(np.uint8)) for _ in range(n)})
        body = bytearray(_key_columns(keys))
        out = _same(bytes(body), len(keys), False)
        assert out is not None and out[0] == "ok" and out[2] == keys
        # one byte changed anywhere in the columns or key bytes
        pos = int(rng.integers(0, len(body)))
        body[pos] = int(rng.integers(0, 256))
        _same(bytes(body), len(keys), False)


@pytest.mark.parametrize(
    "keys",
    [
        [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"a", b"a\x00", b"a\x00\x00", b"b"],  # NUL endings
        [b"k%05d" % i for i in range(300)],
        [b"params.layer%06d.w%d" % (i * 7919 % 10**6, i) for i in range(500)],
    ],
)
def test_known_key_sets(keys: list[bytes]) -> None:
    keys = sorted(keys)
    for maximal in (True, False):
        out = _same(_key_columns(keys, maximal=maximal), len(keys), False)
        assert out is not None and out[2] == keys


def test_named_rejections() -> None:
    n = 60
    keys = [b"key%03d" % i for i in range(n)]
    good = _key_columns(keys)
    assert _same(good, n, False)[0] == "ok"
    # descending pair
    swapped = sorted(keys)
    swapped[30], swapped[31] = swapped[31], swapped[30]
    assert "not strictly increasing at entry 31" in _same(_key_columns(swapped), n, False)[1]
    # a duplicate (suffix length 0)
    dup = keys[:30] + [keys[29]] + keys[31:]
    assert "not strictly increasing at entry 30" in _same(_key_columns(dup), n, False)[1]
    # a key equal to its predecessor plus trailing NUL is greater; minus one is not
    ok = sorted(keys[:-2] + [b"key999", b"key999\x00"])
    assert _same(_key_columns(ok), n, False)[0] == "ok"
    bad = keys[:-2] + [b"key999\x00", b"key999"]
    assert "not strictly increasing at entry 59" in _same(_key_columns(bad), n, False)[1]
    # a prefix length past the previous key
    prefixes = [3] * (n - 1)
    prefixes[10] = 9
    body = _varints(prefixes) + _varints([6] + [3] * (n - 1)) + b"x" * (6 + 3 * (n - 1))
    assert "key 11: prefix length 9 exceeds" in _same(body, n, False)[1]
    # a key longer than MAX_KEY_LENGTH, built from two long runs
    body = _varints([60_000] + [0] * (n - 2)) + _varints([60_000, 10_000] + [1] * (n - 2))
    body += b"a" * 70_000 + bytes(range(1, n - 1))
    assert f"exceeds {MAX_KEY_LENGTH}" in _same(body, n, False)[1]


def test_many_shared_columns_fall_back_to_the_loop() -> None:
    """Keys that share long, varying prefixes with their neighbours cost one pass per column."""
    keys = [b"%s%03d" % (b"x" * (i % 50), i) for i in range(100)]
    keys.sort()
    body = _key_columns(keys)
    with mock.patch.object(btree, "_FREE_FILL_COLUMNS", 8):
        assert _run(btree._read_keys_numpy, body, len(keys), False) is None
        assert _run(btree._read_keys, body, len(keys), False) == _run(btree._read_keys_loop, body, len(keys), False)
    assert _run(btree._read_keys_numpy, body, len(keys), False) == _run(btree._read_keys_loop, body, len(keys), False)


def test_sparse_matrix_falls_back_to_the_loop() -> None:
    """One long key among many short ones: the matrix would be mostly padding."""
    keys = sorted([b"%03d" % i for i in range(200)] + [b"z" * 5000])
    body = _key_columns(keys)
    assert _run(btree._read_keys_numpy, body, len(keys), False) is None
    out = _same(body, len(keys), False)
    assert out == _run(btree._read_keys_loop, body, len(keys), False)
    assert isinstance(out, tuple) and out[2] == keys


def test_long_common_prefix_is_held_once() -> None:
    """The NumPy path also returns PrefixedKeys when repeating the prefix would cost too much."""
    prefix = b"p" * 60_000
    keys = [prefix + b"%04d" % i for i in range(100)]
    out = _same(_key_columns(keys), len(keys), False, limit=1 << 16)
    assert isinstance(out, tuple) and out[1] == "PrefixedKeys" and out[3] == prefix + b"00" and out[2] == keys
    node = decode_btree_node(encode_leaf_node(keys, [b""] * len(keys), None), max_body=1 << 16)
    assert isinstance(node.keys, PrefixedKeys) and list(node.keys) == keys


# ----------------------------------------------------------------------------- values
_files = [DataFileId(b"", b"d/a"), DataFileId(b"b/", b"d/b")]
_value = st.one_of(
    st.binary(max_size=40),
    st.builds(IndirectDataReference, st.sampled_from(_files), st.integers(0, 1 << 62), st.integers(0, 1 << 40)),
)


def _decode_both(blob: bytes) -> tuple[Any, Any]:
    def one() -> object:
        try:
            node = decode_btree_node(blob, max_body=BIG, path="n")
        except CorruptionError as e:
            return ("error", str(e))
        assert isinstance(node, LeafNode)
        return ("ok", list(node.keys), list(node.values))

    with mock.patch.object(btree, "_VECTOR_ENTRIES", 2):
        vec = one()
    with mock.patch.object(btree, "_VECTOR_ENTRIES", 1 << 30):
        loop = one()
    return vec, loop


@given(st.lists(_value, min_size=48, max_size=150))
@SETTINGS
def test_leaf_values_decode_identically(values: list[bytes | IndirectDataReference]) -> None:
    keys = [b"k%04d" % i for i in range(len(values))]
    vec, loop = _decode_both(encode_leaf_node(keys, values, None))
    assert vec == loop == ("ok", keys, values)


def _leaf_body(n: int, lengths: list[int], kinds: bytes, fids: list[int], offsets: list[int], tail: bytes) -> bytes:
    keys = [b"k%04d" % i for i in range(n)]
    body = bytearray([0])
    encode_data_file_table(body, sorted(_files))
    body += _varints([n]) + _key_columns(keys)
    body += _varints(lengths) + kinds + _varints(fids) + _varints(offsets) + tail
    return encode_envelope(BTREE_NODE_MAGIC, bytes(body), None)


def test_leaf_value_rejections_match() -> None:
    n = 64
    kinds = bytes([0, 1] * (n // 2))
    m = n // 2
    ok = _leaf_body(n, [5] * n, kinds, [1] * m, [7] * m, b"v" * 5 * m)
    vec, loop = _decode_both(ok)
    assert vec == loop and vec[0] == "ok"
    cases = {
        "unknown value kind": _leaf_body(n, [5] * n, kinds[:-1] + b"\x02", [1] * m, [7] * m, b"v" * 5 * m),
        "exceeds 1048576": _leaf_body(n, [5] * (n - 2) + [2 << 20, 5], kinds, [1] * m, [7] * m, b"v" * 5 * m),
        "truncated inline values": _leaf_body(n, [5] * n, kinds, [1] * m, [7] * m, b"v" * (5 * m - 1)),
        "value reference overflows": _leaf_body(
            n, [5] * (n - 1) + [(1 << 62) + 1], kinds, [1] * m, [7] * (m - 1) + [1 << 62], b"v" * 5 * m
        ),
        "data file index": _leaf_body(n, [5] * n, kinds, [1] * (m - 1) + [2], [7] * m, b"v" * 5 * m),
        "trailing": _leaf_body(n, [5] * n, kinds, [1] * m, [7] * m, b"v" * (5 * m + 1)),
    }
    for what, blob in cases.items():
        vec, loop = _decode_both(blob)
        assert vec == loop, what
        assert vec[0] == "error" and what in vec[1], (what, vec)


def test_values_released_body_after_build() -> None:
    keys = [b"k%04d" % i for i in range(100)]
    values: list[bytes | IndirectDataReference] = [b"x%d" % i for i in range(100)]
    node = decode_btree_node(encode_leaf_node(keys, values, None), max_body=BIG)
    assert isinstance(node, LeafNode)
    assert node.values[3] == b"x3" and isinstance(node.values[3], bytes)
    assert node.values._inline is None  # type: ignore[attr-defined]
    assert list(node.values) == values


# ----------------------------------------------------------------------------- varints
@given(st.lists(st.integers(0, (1 << 63) - 1), min_size=0, max_size=400), st.binary(max_size=12))
@SETTINGS
def test_varint_array_matches_varint_column(values: list[int], tail: bytes) -> None:
    data = _varints(values) + tail
    a, b = Reader(data), Reader(data)
    assert a.varint_array(len(values)).tolist() == b.varint_column(len(values))
    assert a.pos == b.pos


@given(st.binary(min_size=128, max_size=600), st.integers(128, 300), st.sampled_from([127, 1 << 20, (1 << 63) - 1]))
@SETTINGS
def test_varint_array_errors_match(data: bytes, n: int, limit: int) -> None:
    def run(fn):  # type: ignore[no-untyped-def]
        r = Reader(data, path="x")
        try:
            return list(fn(r)), r.pos
        except CorruptionError as e:
            return str(e)

    assert run(lambda r: r.varint_array(n, limit).tolist()) == run(lambda r: r.varint_column(n, limit))


# ----------------------------------------------------------------------------- listing
def _tree_store(items: dict[bytes, bytes], fanout: int = 4) -> ocdbt_py.OcdbtStore:
    db = DbFiles()
    tree = build_tree(db, items, fanout=fanout)
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, tree)]))
    return ocdbt_py.open(MemoryStore(db.as_dict()))


@pytest.mark.parametrize("fanout", [4, 64])
@pytest.mark.parametrize("vector", [2, 1 << 30])
def test_list_matches_entries_over_ranges(fanout: int, vector: int) -> None:
    """With either decoding path; non-root nodes' keys are relative to a prefix."""
    items = {b"a/%05d/%s" % (i, b"x" * (i % 7)): b"%d" % i for i in range(3000)}
    with mock.patch.object(btree, "_VECTOR_ENTRIES", vector):
        _check_listing(_tree_store(items, fanout), items)


def _check_listing(s: ocdbt_py.OcdbtStore, items: dict[bytes, bytes]) -> None:
    keys = sorted(items)
    assert list(s.list()) == keys
    for lo, hi in [(b"a/00100", b"a/00200"), (b"", b"a/0"), (b"a/02999", None), (b"b", None)]:
        want = [k for k in keys if k >= lo and (hi is None or k < hi)]
        assert list(iterate_keys(s._reader, s._root(), lo, hi)) == want
        assert [k for k, _ in iterate(s._reader, s._root(), lo, hi)] == want
    assert list(s.list(prefix=b"a/0012")) == [k for k in keys if k.startswith(b"a/0012")]


def test_list_is_lazy() -> None:
    s = _tree_store({b"k%d" % i: b"v" for i in range(10)})
    calls: list[object] = []
    real = s._reader.btree_node

    def spy(*a: object) -> object:
        calls.append(a)
        return real(*a)  # type: ignore[arg-type]

    with mock.patch.object(s._reader, "btree_node", spy):
        it = s.list()
        assert calls == []
        assert next(it) == b"k0"
        assert len(calls) == 1


def test_interior_nodes_decode_identically() -> None:
    keys = [b"c%05d" % i for i in range(200)]
    scp = [len(k) // 2 for k in keys]
    children = [BtreeChild(IndirectDataReference(_files[i % 2], i, 10), Statistics(1, 2, 3)) for i in range(200)]
    blob = encode_interior_node(3, keys, scp, children, 0)
    with mock.patch.object(btree, "_VECTOR_ENTRIES", 2):
        node = decode_btree_node(blob, max_body=BIG)
    with mock.patch.object(btree, "_VECTOR_ENTRIES", 1 << 30):
        assert decode_btree_node(blob, max_body=BIG) == node
    assert isinstance(node, InteriorNode)
    assert list(node.keys) == keys and node.subtree_prefix_lengths == scp
