"""The level encoder: split points, excluded prefixes and bytes, against simple references."""

from __future__ import annotations

import random

import pytest

from ocdbt_py.format.btree import (
    MAX_NODE_ENTRIES,
    BtreeChild,
    InteriorNode,
    LeafNode,
    decode_btree_node,
    encode_interior_node,
    encode_leaf_node,
)
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
from ocdbt_py.format.reader import put_varint
from ocdbt_py.write.node_encoder import (
    adjacent_prefixes,
    common_prefix_len,
    encode_interior_level,
    encode_leaf_level,
    put_column,
    split_ranges,
)


def _naive_cp(a: bytes, b: bytes) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def _ts_split(est: list[int], cpl: int, min_arity: int, max_bytes: int) -> list[tuple[int, int]]:
    """A literal transcription of TensorStore's split loop (``BtreeNodeEncoder::Finalize``)."""
    n = len(est)
    cum = []
    total = 0
    for e in est:
        total += e
        cum.append(total)
    out = []
    start = 0
    prev = 0

    def size(end: int) -> int:
        return (cum[end - 1] - prev) - (end - start - 1) * cpl

    while start < n:
        ub = size(n)
        nodes = -(-(n - start) // MAX_NODE_ENTRIES)
        if max_bytes:
            nodes = max(nodes, -(-ub // max_bytes))
        target = -(-ub // nodes)
        end = start + 1
        while end < n:
            if end - start >= MAX_NODE_ENTRIES:
                break
            sz = size(end)
            if sz >= target and end >= start + min_arity:
                if sz > max_bytes and end > start + min_arity:
                    end -= 1
                break
            end += 1
        out.append((start, end))
        start = end
        prev = cum[end - 1]
    return out


def test_common_prefix_len() -> None:
    rnd = random.Random(1)
    for _ in range(2000):
        base = rnd.randbytes(rnd.randrange(0, 40))
        a = base + rnd.randbytes(rnd.randrange(0, 5))
        b = base[: rnd.randrange(len(base) + 1)] + rnd.randbytes(rnd.randrange(0, 5))
        assert common_prefix_len(a, b) == _naive_cp(a, b)
    assert common_prefix_len(b"", b"x") == 0
    assert common_prefix_len(b"\x00\x00", b"\x00\x00\x00") == 2
    long = b"\xff" * 65535
    assert common_prefix_len(long, long) == 65535
    assert adjacent_prefixes([b"ab", b"abc", b"b"]) == [0, 2, 0]


@pytest.mark.parametrize("seed", range(40))
def test_split_ranges_matches_tensorstore_loop(seed: int) -> None:
    rnd = random.Random(seed)
    n = rnd.choice([1, 2, 3, 10, 100, 500])
    cpl = rnd.randrange(0, 8)
    est = [16 + cpl + rnd.randrange(0, rnd.choice([10, 100, 2000])) for _ in range(n)]
    for max_bytes in (0, 1, 64, 300, 1000, 8 << 20):
        for min_arity in (1, 2):
            got = split_ranges(est, cpl, min_arity, max_bytes)
            assert got == _ts_split(est, cpl, min_arity, max_bytes)
            assert got[0][0] == 0 and got[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(got, got[1:]))


def test_split_respects_entry_limit() -> None:
    est = [16] * (MAX_NODE_ENTRIES + 5)
    got = split_ranges(est, 0, 1, 0)
    assert max(e - s for s, e in got) <= MAX_NODE_ENTRIES
    assert got == _ts_split(est, 0, 1, 0)


def test_put_column() -> None:
    for vals in ([], [0, 1, 127], [128, 0, 1 << 40, (1 << 64) - 1]):
        out = bytearray()
        put_column(out, vals)
        ref = bytearray()
        for v in vals:
            put_varint(ref, v)
        assert out == ref


def _refs(rnd: random.Random) -> list[IndirectDataReference]:
    files = [DataFileId(b"", b"d/%032x" % rnd.getrandbits(128)) for _ in range(3)]
    files.append(DataFileId(b"sub/", b"d/x"))
    return [IndirectDataReference(rnd.choice(files), rnd.randrange(1 << 40), rnd.randrange(1, 1 << 20))
            for _ in range(20)]


@pytest.mark.parametrize("level", [None, 0, 3])
@pytest.mark.parametrize("seed", range(6))
def test_leaf_level_bytes_equal_format_encoder(seed: int, level: int | None) -> None:
    rnd = random.Random(seed)
    refs = _refs(rnd)
    keys = sorted({b"pre/" + rnd.randbytes(rnd.randrange(0, 6)) for _ in range(rnd.randrange(1, 300))})
    values = [rnd.choice(refs) if rnd.random() < 0.3 else rnd.randbytes(rnd.randrange(0, 50)) for _ in keys]
    written: list[bytes] = []

    def write(b: bytes) -> IndirectDataReference:
        written.append(b)
        return IndirectDataReference(DataFileId(b"", b"d/n"), 0, len(b))

    remembered: list[LeafNode] = []
    for max_bytes, root in ((0, True), (500, True), (200, False)):
        written.clear()
        remembered.clear()
        out = encode_leaf_level(keys, values, zstd_level=level, max_decoded_node_bytes=max_bytes,
                                may_be_root=root, write=write,
                                remember=lambda loc, node: remembered.append(node))  # type: ignore[misc,arg-type]
        assert len(out) == len(written) == len(remembered)
        pos = 0
        for child, data, node in zip(out, written, remembered):
            n = len(node.keys)
            x = child.subtree_prefix_length
            assert [k[x:] for k in keys[pos:pos + n]] == node.keys
            assert encode_leaf_node(node.keys, node.values, level) == data
            decoded = decode_btree_node(data, max_body=1 << 30)
            assert isinstance(decoded, LeafNode) and decoded.keys == node.keys
            assert child.statistics.num_keys == n and child.statistics.num_tree_bytes == len(data)
            assert child.key == (b"" if len(out) == 1 and root else keys[pos])
            if len(out) == 1 and root:
                assert x == 0
            else:
                assert x == _naive_cp(keys[pos], keys[pos + n - 1])
            pos += n
        assert pos == len(keys)


@pytest.mark.parametrize("seed", range(6))
def test_interior_level_bytes_equal_format_encoder(seed: int) -> None:
    rnd = random.Random(seed)
    refs = _refs(rnd)
    keys = sorted({b"a/" + rnd.randbytes(rnd.randrange(1, 5)) for _ in range(rnd.randrange(2, 200))})
    scps = [rnd.randrange(0, len(k) + 1) for k in keys]
    kids = [
        BtreeChild(rnd.choice(refs), Statistics(rnd.randrange(1, 100), rnd.randrange(1, 10**6), rnd.randrange(10**6)))
        for _ in keys
    ]
    written: list[bytes] = []

    def write(b: bytes) -> IndirectDataReference:
        written.append(b)
        return IndirectDataReference(DataFileId(b"", b"d/n"), 0, len(b))

    nodes: list[InteriorNode] = []
    out = encode_interior_level(3, keys, scps, kids, zstd_level=0, max_decoded_node_bytes=700,
                                may_be_root=True, write=write,
                                remember=lambda loc, node: nodes.append(node))  # type: ignore[misc,arg-type]
    pos = 0
    for child, data, node in zip(out, written, nodes):
        n = len(node.keys)
        assert n >= 2 or len(out) == 1
        x = child.subtree_prefix_length
        assert x <= min(scps[pos:pos + n])
        assert encode_interior_node(3, node.keys, node.subtree_prefix_lengths, node.children, 0) == data
        assert child.statistics.num_keys == sum(c.statistics.num_keys for c in kids[pos:pos + n])
        below = sum(c.statistics.num_tree_bytes for c in kids[pos:pos + n])
        assert child.statistics.num_tree_bytes == len(data) + below
        pos += n
    assert pos == len(keys)


def test_vectorized_key_columns_match_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import ocdbt_py.write.node_encoder as ne

    rnd = random.Random(3)
    keys = sorted({b"p/" + rnd.randbytes(rnd.randrange(0, 12)) for _ in range(3000)})
    ref = [0] + [_naive_cp(a, b) for a, b in zip(keys, keys[1:])]
    for block in (50, 64, 200, 8 << 20):  # tiny blocks exercise the block boundaries
        monkeypatch.setattr(ne, "_BLOCK_BYTES", block)
        kc = ne._KeyColumns(keys)
        assert kc.width and kc.cps == ref
        for s, e, x in ((0, 3000, 0), (10, 2500, 2), (5, 100, 2)):
            fast = bytearray()
            kc.encode(fast, s, e, x, None)
            monkeypatch.setattr(ne, "_VECTOR_MIN", 10**9)
            slow = bytearray()
            kc.encode(slow, s, e, x, None)
            monkeypatch.setattr(ne, "_VECTOR_MIN", 64)
            assert fast == slow
    wide = sorted({rnd.randbytes(5) for _ in range(100)} | {b"w" * 5000})
    assert ne._KeyColumns(wide).width == 0  # too wide to pad: the Python path
    assert ne._KeyColumns(wide).cps == [0] + [_naive_cp(a, b) for a, b in zip(wide, wide[1:])]
