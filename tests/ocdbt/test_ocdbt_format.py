"""Unit and property tests of the pure OCDBT codecs in :mod:`ocdbt_py.format`."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.btree import (
    BtreeChild,
    InteriorNode,
    LeafNode,
    decode_btree_node,
    encode_interior_node,
    encode_leaf_node,
)
from ocdbt_py.format.config import Config, decode_config, encode_config
from ocdbt_py.format.data_file_table import (
    DataFileId,
    IndirectDataReference,
    Statistics,
    decode_data_file_table,
    encode_data_file_table,
)
from ocdbt_py.format.envelope import (
    BTREE_NODE_MAGIC,
    MANIFEST_MAGIC,
    VERSION_NODE_MAGIC,
    crc32c,
    decode_envelope,
    encode_envelope,
)
from ocdbt_py.format.manifest import Manifest, decode_manifest, encode_manifest
from ocdbt_py.format.reader import Reader, put_u64le, put_varint, varint_size
from ocdbt_py.format.version_tree import (
    BtreeGenerationReference,
    VersionNodeReference,
    VersionTreeNode,
    decode_version_tree_node,
    encode_version_tree_node,
    manifest_version_node_ranges,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BIG = 64 << 20


def varint(v: int) -> bytes:
    out = bytearray()
    put_varint(out, v)
    return bytes(out)


def wrap(magic: int, body: bytes) -> bytes:
    """A raw (uncompressed) envelope around ``body``."""
    return encode_envelope(magic, body, None)


# --------------------------------------------------------------------------- primitives
@given(st.integers(0, (1 << 64) - 1))
@SETTINGS
def test_varint_roundtrip(v: int) -> None:
    enc = varint(v)
    assert len(enc) == varint_size(v)
    r = Reader(enc)
    assert r.varint() == v
    assert r.remaining() == 0


def test_varint_overlong_accepted_and_limits() -> None:
    assert Reader(b"\xe4\x00").varint() == 100  # non-canonical, as riegeli accepts
    assert Reader(b"\xff" * 9 + b"\x01").varint() == (1 << 64) - 1
    with pytest.raises(CorruptionError, match="overflows"):
        Reader(b"\xff" * 9 + b"\x02").varint()
    with pytest.raises(CorruptionError):  # an 11-byte varint
        Reader(b"\x80" * 10 + b"\x00").varint()
    with pytest.raises(CorruptionError, match="truncated"):
        Reader(b"\x80\x80").varint()
    with pytest.raises(CorruptionError, match="exceeds"):
        Reader(varint(1 << 32)).varint32()
    with pytest.raises(CorruptionError):
        Reader(b"").byte()
    with pytest.raises(CorruptionError):
        Reader(b"1234567").u64le()
    with pytest.raises(CorruptionError):
        Reader(b"123").take(4)
    with pytest.raises(CorruptionError):
        Reader(b"\x05\x05\x85").varint_column(3, 4)


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


# --------------------------------------------------------------------------- envelope
@given(st.binary(max_size=9000), st.sampled_from([None, 0, 1, 5]), st.sampled_from([MANIFEST_MAGIC, BTREE_NODE_MAGIC]))
@SETTINGS
def test_envelope_roundtrip(body: bytes, level: int | None, magic: int) -> None:
    enc = encode_envelope(magic, body, level)
    assert struct.unpack(">I", enc[:4])[0] == magic
    assert struct.unpack("<Q", enc[4:12])[0] == len(enc)
    assert bytes(decode_envelope(enc, magic, max_body=len(body))) == body
    if body:
        with pytest.raises(CorruptionError):
            decode_envelope(enc, magic, max_body=len(body) - 1)


def test_envelope_rejections() -> None:
    good = wrap(BTREE_NODE_MAGIC, b"body")

    def patched(pos: int, new: bytes, fix_crc: bool = True) -> bytes:
        b = bytearray(good)
        b[pos : pos + len(new)] = new
        if fix_crc:
            b[-4:] = crc32c(bytes(b[:-4])).to_bytes(4, "little")
        return bytes(b)

    cases = {
        "truncated": good[:15],
        "magic": patched(0, b"\x0c\xdb\x3a\x2a"),
        "length": patched(4, struct.pack("<Q", len(good) + 1)),
        "version": patched(12, b"\x01"),
        "compression": patched(13, b"\x02"),
        "crc": patched(14, b"B", fix_crc=False),
        "extra byte": good[:-4] + b"x" + good[-4:],
    }
    for name, data in cases.items():
        with pytest.raises(CorruptionError):
            decode_envelope(data, BTREE_NODE_MAGIC, max_body=BIG)
        assert name


def test_envelope_zstd_trailing_and_truncated_frames() -> None:
    import zstandard

    frame = zstandard.ZstdCompressor().compress(b"hello world" * 10)
    for payload in (frame + b"\x00", frame[:-1], frame + frame):
        blob = bytearray(12)
        blob += b"\x00\x01" + payload
        struct.pack_into(">I", blob, 0, BTREE_NODE_MAGIC)
        struct.pack_into("<Q", blob, 4, len(blob) + 4)
        blob += crc32c(bytes(blob)).to_bytes(4, "little")
        with pytest.raises(CorruptionError):
            decode_envelope(bytes(blob), BTREE_NODE_MAGIC, max_body=BIG)


def test_decode_known_tensorstore_bytes() -> None:
    """The 26-byte root leaf and 187-byte manifest annotated in the reference notes."""
    leaf = bytes.fromhex("0cdb20de1a00000000000000000000000101610100620a123256")
    node = decode_btree_node(leaf, max_body=BIG)
    assert isinstance(node, LeafNode)
    assert node.keys == [b"a"] and node.values == [b"b"]
    assert encode_leaf_node([b"a"], [b"b"], None) == leaf
    dump = """
        0cdb 3a2a bb00 0000 0000 0000 0000 23a3  204f 5f6c 3b44 7737 3e8f 4f81 bbc2 0064
        8080 8004 0400 0300 0200 2220 0000 0064  2f36 3362 3864 6434 3333 6664 3636 3936
        3636 3439 3533 3766 6435 3730 3363 6266  3362 3762 3637 3031 3739 3963 6138 3034
        3762 3536 3134 3836 6166 3830 3239 6531  3003 0102 0300 0000 0001 02ff ffff ffff
        ffff ffff 0100 9601 ffff ffff ffff ffff  ff01 1a46 0001 0200 1a46 0000 9601 a929
        faa0 5346 ea18 a3a5 20a1 5346 ea18 f118  56a1 5346 ea18 0061 2401 59
    """
    manifest = bytes.fromhex("".join(dump.split()))
    assert len(manifest) == 187
    m = decode_manifest(manifest)
    assert m.config.max_inline_value_bytes == 100
    assert m.config.max_decoded_node_bytes == 8 << 20
    assert m.config.compression_level is None
    assert [v.generation_number for v in m.versions] == [1, 2, 3]
    assert m.versions[0].root is None
    assert m.versions[2].root == IndirectDataReference(
        DataFileId(b"", b"d/b7b6701799ca8047b561486af8029e10"), 150, 70
    )
    assert m.versions[2].statistics == Statistics(2, 70, 150)
    assert m.versions[0].commit_time == 1795324726457543081
    assert encode_manifest(m) == manifest


# --------------------------------------------------------------------------- data file table
_path = st.binary(min_size=0, max_size=12).filter(lambda b: b"\x00" not in b)
_file_ids = st.lists(st.tuples(_path, _path), max_size=8, unique=True).map(
    lambda xs: sorted(DataFileId(b, r) for b, r in xs)
)


@given(_file_ids, st.sampled_from([b"", b"t/", b"ocdbt.process_0/"]))
@SETTINGS
def test_data_file_table_roundtrip(files: list[DataFileId], transitive: bytes) -> None:
    out = bytearray()
    encode_data_file_table(out, files)
    r = Reader(bytes(out))
    got = decode_data_file_table(r, transitive)
    assert r.remaining() == 0
    assert got == [DataFileId(transitive + f.base_path, f.relative_path) for f in files]


def test_data_file_table_rejections() -> None:
    def table(n: int, prefixes: list[int], suffixes: list[int], bases: list[int], data: bytes) -> bytes:
        out = bytearray(varint(n))
        for v in prefixes + suffixes + bases:
            out += varint(v)
        return bytes(out + data)

    bad = [
        table(2, [3], [2, 1], [0, 0], b"abc"),  # prefix longer than the previous path
        table(1, [], [3], [4], b"abc"),  # base path longer than the path
        table(2, [2], [2, 1], [1, 2], b"abc"),  # shared prefix crosses differing base paths
        table(1, [], [5], [0], b"abc"),  # truncated path bytes
        varint(1000) + b"\x00" * 10,  # more files than bytes
    ]
    for data in bad:
        with pytest.raises(CorruptionError):
            decode_data_file_table(Reader(data))
    # a path longer than 65535 - len(transitive)
    long = table(1, [], [10], [0], b"x" * 10)
    decode_data_file_table(Reader(long), b"t" * 65525)
    with pytest.raises(CorruptionError):
        decode_data_file_table(Reader(long), b"t" * 65526)


# --------------------------------------------------------------------------- b+tree nodes
_keys = st.lists(st.binary(max_size=40), min_size=1, max_size=40, unique=True).map(sorted)
_ref = st.builds(
    IndirectDataReference,
    st.sampled_from([DataFileId(b"", b"d/a"), DataFileId(b"", b"d/b"), DataFileId(b"base/", b"d/a")]),
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 30),
)


@given(_keys, st.data(), st.sampled_from([None, 0, 3]))
@SETTINGS
def test_leaf_roundtrip(keys: list[bytes], data: st.DataObject, level: int | None) -> None:
    values = [data.draw(st.one_of(st.binary(max_size=300), _ref)) for _ in keys]
    enc = encode_leaf_node(keys, values, level)
    node = decode_btree_node(enc, max_body=BIG)
    assert isinstance(node, LeafNode)
    assert node.keys == keys
    assert node.values == values
    # transitive paths are prepended to every out-of-line file's base path
    node2 = decode_btree_node(enc, transitive=b"x/", max_body=BIG)
    assert isinstance(node2, LeafNode)
    assert node2.values == [
        v if isinstance(v, bytes) else v._replace(file=DataFileId(b"x/" + v.file.base_path, v.file.relative_path))
        for v in values
    ]


@given(_keys, st.data(), st.integers(1, 255))
@SETTINGS
def test_interior_roundtrip(keys: list[bytes], data: st.DataObject, height: int) -> None:
    scp = [data.draw(st.integers(0, len(k))) for k in keys]
    children = [
        BtreeChild(data.draw(_ref), Statistics(*data.draw(st.tuples(*[st.integers(0, 1 << 62)] * 3))))
        for _ in keys
    ]
    enc = encode_interior_node(height, keys, scp, children, None)
    node = decode_btree_node(enc, max_body=BIG)
    assert node == InteriorNode(height, keys, scp, children)


def test_leaf_boundary_keys_and_values() -> None:
    keys = [b"", b"\x00", b"\x00\x00", b"k" * 65535, b"\xff" * 10]
    values: list[bytes | IndirectDataReference] = [b"", b"\x00", b"v" * 1000, b"", b"x"]
    node = decode_btree_node(encode_leaf_node(keys, values, 0), max_body=BIG)
    assert node.keys == keys and node.values == values  # type: ignore[union-attr]


def _leaf_body(n: int, prefixes: list[int], suffixes: list[int], key_bytes: bytes, tail: bytes) -> bytes:
    body = bytearray(b"\x00\x00")  # height 0, empty data file table
    body += varint(n)
    for v in prefixes + suffixes:
        body += varint(v)
    return bytes(body + key_bytes + tail)


def test_btree_node_rejections() -> None:
    ok_tail = b"\x01\x01\x00\x00xy"  # value lengths 1,1; kinds inline; values x, y
    good = _leaf_body(2, [0], [1, 1], b"ab", ok_tail)
    assert decode_btree_node(wrap(BTREE_NODE_MAGIC, good), max_body=BIG).keys == [b"a", b"b"]
    bad = {
        "empty node": b"\x00\x00\x00",
        "unsorted keys": _leaf_body(2, [0], [1, 1], b"ba", ok_tail),
        "duplicate keys": _leaf_body(2, [0], [1, 1], b"aa", ok_tail),
        "prefix too long": _leaf_body(2, [2], [1, 1], b"ab", ok_tail),
        "key too long": _leaf_body(1, [], [65536], b"", b""),
        "unknown value kind": _leaf_body(2, [0], [1, 1], b"ab", b"\x01\x01\x00\x02xy"),
        "out-of-line without table": _leaf_body(2, [0], [1, 1], b"ab", b"\x01\x01\x00\x01\x00\x00x"),
        "truncated inline values": _leaf_body(2, [0], [1, 1], b"ab", b"\x01\x05\x00\x00xy"),
        "trailing bytes": good + b"!",
        "inline value over 1 MiB": _leaf_body(1, [], [1], b"a", varint((1 << 20) + 1) + b"\x00"),
        "too many entries": b"\x00\x00" + varint((1 << 20) + 1),
        "count beyond body": b"\x00\x00" + varint(1000) + b"\x00" * 10,
    }
    for name, body in bad.items():
        with pytest.raises(CorruptionError):
            decode_btree_node(wrap(BTREE_NODE_MAGIC, body), max_body=BIG)
        assert name
    # interior: data file index out of range; scp longer than the key
    ref = IndirectDataReference(DataFileId(b"", b"d/x"), 0, 10)
    enc = encode_interior_node(1, [b"a"], [0], [BtreeChild(ref, Statistics(1, 1, 0))], None)
    interior = bytearray(decode_envelope(enc, BTREE_NODE_MAGIC, max_body=BIG))
    # layout: height, table(01 03 00 'd/x'), n=1, suffix 1, scp 0, 'a', fid 0, ...
    i = interior.index(b"a", 6)
    for pos, val in ((i - 1, 2), (i + 1, 1)):  # scp 2 > len("a"); file index 1 of 1
        b2 = bytearray(interior)
        b2[pos] = val
        with pytest.raises(CorruptionError):
            decode_btree_node(wrap(BTREE_NODE_MAGIC, bytes(b2)), max_body=BIG)
    with pytest.raises(CorruptionError, match="magic"):
        decode_btree_node(wrap(MANIFEST_MAGIC, bytes(interior)), max_body=BIG)


# --------------------------------------------------------------------------- config, manifest, version tree
@given(
    st.binary(min_size=16, max_size=16),
    st.sampled_from([0, 1]),
    st.integers(0, 1 << 20),
    st.integers(0, (1 << 32) - 1),
    st.integers(1, 16),
    st.one_of(st.none(), st.integers(-(1 << 17), 22)),
)
@SETTINGS
def test_config_roundtrip(uuid: bytes, kind: int, inline: int, node: int, arity: int, level: int | None) -> None:
    cfg = Config(uuid, kind, inline, node, arity, level)
    out = bytearray()
    encode_config(out, cfg)
    r = Reader(bytes(out))
    assert decode_config(r) == cfg
    assert r.remaining() == 0


def test_config_rejections() -> None:
    out = bytearray()
    encode_config(out, Config())
    base = bytes(out)
    # manifest kind 2, arity 0 and 17, compression method 2, zstd level 23
    kind_pos = 16
    arity_pos = 16 + 1 + 1 + 4
    for pos, val in ((kind_pos, 2), (arity_pos, 0), (arity_pos, 17), (arity_pos + 1, 2)):
        b = bytearray(base)
        b[pos] = val
        with pytest.raises(CorruptionError):
            decode_config(Reader(bytes(b)))
    b = bytearray(base)
    b[arity_pos + 2 : arity_pos + 6] = struct.pack("<i", 23)
    with pytest.raises(CorruptionError):
        decode_config(Reader(bytes(b)))


def _gen(g: int, t: int | None = None, root: bool = True) -> BtreeGenerationReference:
    ref = IndirectDataReference(DataFileId(b"", f"d/{g % 3}".encode()), g * 10, 7) if root else None
    stats = Statistics(g, 7, 0) if root else Statistics(0, 0, 0)
    return BtreeGenerationReference(g, ref, 0 if not root else g % 3, stats, t if t is not None else 1000 + g)


@given(st.integers(1, 4), st.integers(1, 200), st.sampled_from([None, 0]))
@SETTINGS
def test_manifest_roundtrip(arity: int, latest: int, level: int | None) -> None:
    cfg = Config(uuid=b"u" * 16, version_tree_arity_log2=arity, compression_level=level)
    first = latest - ((latest - 1) % (1 << arity))
    versions = tuple(_gen(g, root=g != 1) for g in range(first, latest + 1))
    refs = tuple(
        VersionNodeReference(hi, IndirectDataReference(DataFileId(b"", b"d/v"), hi, 50), hi - lo + 1, lo, h)
        for h, lo, hi in reversed(manifest_version_node_ranges(latest, arity))
    )
    m = Manifest(cfg, versions, refs)
    assert decode_manifest(encode_manifest(m)) == m
    numbered = Manifest(dataclasses.replace(cfg, manifest_kind=1))
    assert decode_manifest(encode_manifest(numbered)) == numbered


def test_manifest_rejections() -> None:
    cfg = Config(uuid=b"u" * 16, version_tree_arity_log2=1, compression_level=None)
    loc = IndirectDataReference(DataFileId(b"", b"d/v"), 0, 50)
    bad = [
        # three inline versions with arity 1 (at most two)
        Manifest(cfg, (_gen(1), _gen(2), _gen(3))),
        # versions spanning two leaf buckets
        Manifest(cfg, (_gen(2), _gen(3))),
        # generations not increasing
        Manifest(cfg, (_gen(4), _gen(3))),
        # generation 0
        Manifest(cfg, (_gen(0),)),
        # a version-node reference of a height the latest generation does not allow
        Manifest(cfg, (_gen(5),), (VersionNodeReference(4, loc, 4, 0, 2),)),
        # references out of height order
        Manifest(cfg, (_gen(9),), (VersionNodeReference(8, loc, 4, 0, 1), VersionNodeReference(4, loc, 4, 0, 2))),
        # reference height 0 (leaf nodes are never referenced by the manifest)
        Manifest(cfg, (_gen(5),), (VersionNodeReference(4, loc, 4, 0, 0),)),
        # a missing root with statistics
        Manifest(cfg, (BtreeGenerationReference(1, None, 0, Statistics(1, 0, 0), 5),)),
    ]
    for m in bad:
        with pytest.raises(CorruptionError):
            decode_manifest(encode_manifest(m))


@given(st.integers(1, 4), st.integers(0, 3), st.data())
@SETTINGS
def test_version_node_roundtrip(arity: int, height: int, data: st.DataObject) -> None:
    if height == 0:
        last = data.draw(st.integers(1, 1000)) << arity
        count = data.draw(st.integers(1, 1 << arity))
        node = VersionTreeNode(arity, 0, versions=tuple(_gen(g) for g in range(last - count + 1, last + 1)))
    else:
        stride = 1 << (arity * height)
        bucket = data.draw(st.integers(0, 50))
        slots = data.draw(st.lists(st.integers(1, 1 << arity), min_size=1, max_size=1 << arity, unique=True))
        gens = sorted(((bucket << arity) + s) * stride for s in slots)
        node = VersionTreeNode(
            arity,
            height,
            children=tuple(
                VersionNodeReference(g, IndirectDataReference(DataFileId(b"b/", b"d/v"), g, 9), stride, g, height - 1)
                for g in gens
            ),
        )
    for level in (None, 0):
        enc = encode_version_tree_node(node, level)
        assert decode_version_tree_node(enc, arity_log2=arity) == node
    with pytest.raises(CorruptionError):
        decode_version_tree_node(enc, arity_log2=arity % 4 + 1)


def test_version_node_rejections() -> None:
    loc = IndirectDataReference(DataFileId(b"", b"d/v"), 0, 50)
    bad = [
        # interior child generation not a multiple of the stride
        VersionTreeNode(1, 1, children=(VersionNodeReference(3, loc, 2, 0, 0),)),
        # two children in the same bucket / children spanning parent buckets
        VersionTreeNode(2, 1, children=(VersionNodeReference(4, loc, 4, 0, 0), VersionNodeReference(20, loc, 4, 0, 0))),
        # num_generations above the stride
        VersionTreeNode(1, 1, children=(VersionNodeReference(2, loc, 3, 0, 0),)),
        # a height above 63 // arity - 1
        VersionTreeNode(16, 3, children=(VersionNodeReference(1 << 48, loc, 1, 0, 2),)),
        # leaf generations across two buckets
        VersionTreeNode(1, 0, versions=(_gen(2), _gen(3))),
    ]
    for node in bad:
        with pytest.raises(CorruptionError):
            decode_version_tree_node(encode_version_tree_node(node, None), arity_log2=node.arity_log2)
    empty_interior = bytearray([1, 1, 0, 0])  # arity 1, height 1, no files, no children
    with pytest.raises(CorruptionError):
        decode_version_tree_node(wrap(VERSION_NODE_MAGIC, bytes(empty_interior)), arity_log2=1)


def test_version_leaf_entry_minimum_size() -> None:
    """A leaf version node with one-byte columns is 16 bytes per entry (regression)."""
    body = bytearray([1, 0])  # arity 1, height 0
    encode_data_file_table(body, [DataFileId(b"", b"d/x")])
    body += varint(2)
    for col in ([1, 2], [0, 0], [0, 0], [0, 0], [5, 5], [1, 1], [5, 5], [0, 0]):
        for v in col:
            body += varint(v)
    for t in (10, 11):
        put_u64le(body, t)
    node = decode_version_tree_node(wrap(VERSION_NODE_MAGIC, bytes(body)), arity_log2=1)
    assert [v.generation_number for v in node.versions] == [1, 2]
