"""Fuzzing the OCDBT decoders and the read path.

Random bytes and single-byte corruptions of real manifests and nodes (TensorStore-written
golden fixtures plus objects from our encoders) must give :class:`CorruptionError` -- never
another exception, a hang or a huge allocation.  Corruptions are tried both with the CRC left
alone (every one must be caught) and with the CRC recomputed, so the body decoders and the
zstd layer see the damage.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import struct
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ocdbt_py
from ocdbt_py.errors import CorruptionError, OcdbtError
from ocdbt_py.format.btree import decode_btree_node, encode_leaf_node
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
from ocdbt_py.format.envelope import (
    BTREE_NODE_MAGIC,
    MANIFEST_MAGIC,
    VERSION_NODE_MAGIC,
    crc32c,
    decode_envelope,
    encode_envelope,
)
from ocdbt_py.format.manifest import decode_manifest, encode_manifest
from ocdbt_py.format.version_tree import decode_version_tree_node
from ocdbt_py.kvstore import MemoryStore
from tests import peak_rss
from tests.ocdbt.ocdbt_craft import (
    RAW,
    DbFiles,
    Tree,
    build_tree,
    build_version_tree,
    generation,
    single_manifest,
)

pytestmark = pytest.mark.timeout(300)

FIXTURES = Path(__file__).resolve().parents[2] / "conformance" / "fixtures" / "ocdbt"
NODE_LIMIT = 8 << 20
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------ corpus
@dataclasses.dataclass
class Sample:
    """One encoded object and how to decode it."""

    name: str
    kind: str  # "manifest", "btree" or "version"
    data: bytes
    arity: int = 4

    @property
    def magic(self) -> int:
        return {"manifest": MANIFEST_MAGIC, "btree": BTREE_NODE_MAGIC, "version": VERSION_NODE_MAGIC}[self.kind]

    def decode(self, data: bytes) -> Any:
        if self.kind == "manifest":
            return decode_manifest(data)
        if self.kind == "btree":
            return decode_btree_node(data, max_body=NODE_LIMIT)
        return decode_version_tree_node(data, arity_log2=self.arity)


def _fixture_samples() -> Iterator[Sample]:
    for exp in sorted(FIXTURES.glob("*.expected.json")):
        name = exp.name[: -len(".expected.json")]
        root = FIXTURES / name
        oracle = json.loads(exp.read_text())
        arity = oracle["config"]["version_tree_arity_log2"]
        for m in oracle["manifest_files"]:
            yield Sample(f"{name}/{m}", "manifest", (root / m).read_bytes(), arity)
        for kind, key in (("btree", "btree_nodes"), ("version", "version_nodes")):
            for n in oracle.get(key, []):
                _, base, rel, off, length = n["location"].split(":")
                data = (root / (base + rel)).read_bytes()[int(off) : int(off) + int(length)]
                yield Sample(f"{name}/{n['location']}", kind, data, arity)


def _blob(files: dict[str, bytes], ref: IndirectDataReference) -> bytes:
    return files[ref.file.path.decode()][ref.offset : ref.offset + ref.length]


def _crafted_samples() -> Iterator[Sample]:
    for level in (None, 3):
        cfg = dataclasses.replace(RAW, compression_level=level, version_tree_arity_log2=1)
        db = DbFiles()
        items = {b"": b"", b"a": b"x" * 150, b"ab": b"y", b"b\x00": b"z" * 3, b"\xff": b"w" * 7000}
        trees = [build_tree(db, dict(list(items.items())[:g]), fanout=2, zstd_level=level) for g in range(1, 6)]
        versions = [generation(g, t) for g, t in enumerate(trees, 1)]
        m = build_version_tree(db, cfg, versions)
        tag = "raw" if level is None else "zstd"
        yield Sample(f"crafted-{tag}/manifest", "manifest", encode_manifest(m), 1)
        files = db.as_dict()
        for v in versions:
            assert v.root is not None
            yield Sample(f"crafted-{tag}/root{v.generation_number}", "btree", _blob(files, v.root), 1)
        for r in m.version_nodes:
            yield Sample(f"crafted-{tag}/vnode{r.height}", "version", _blob(files, r.location), 1)


def corpus(limit_per_kind: int = 12, seed: int = 0) -> list[Sample]:
    """A bounded, diverse selection: every crafted object and a sample of fixture objects."""
    rng = random.Random(seed)
    out = list(_crafted_samples())
    by_kind: dict[str, list[Sample]] = {}
    for s in _fixture_samples():
        by_kind.setdefault(s.kind, []).append(s)
    for samples in by_kind.values():
        # keep the largest (zstd streamed frames, deep tables) plus a random spread
        samples.sort(key=lambda s: -len(s.data))
        rest = samples[3:]
        out.extend(samples[:3] + rng.sample(rest, min(limit_per_kind - 3, len(rest))))
    return out


CORPUS = corpus()


def test_corpus_covers_every_kind() -> None:
    kinds = {(s.kind, s.name.startswith("crafted")) for s in CORPUS}
    assert {("manifest", True), ("btree", True), ("version", True)} <= kinds
    if FIXTURES.exists():
        assert {("manifest", False), ("btree", False), ("version", False)} <= kinds
    for s in CORPUS:
        s.decode(s.data)  # every sample decodes before it is damaged


# ------------------------------------------------------------------------------ helpers
@pytest.fixture(autouse=True)
def peak_memory_guard() -> Iterator[None]:
    """No fuzz test may raise the process's peak resident memory by 256 MiB or more."""
    before = peak_rss.start()
    yield
    grown = peak_rss.grown_kib(before)
    assert grown < 256 * 1024, f"peak RSS grew by {grown} KiB"


def only_corruption(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Call ``fn``; True if it raised CorruptionError, False if it succeeded.  Anything else fails,
    and so does a call slower than a few seconds (a hang in the making)."""
    start = time.perf_counter()
    try:
        fn(*args, **kwargs)
    except CorruptionError:
        return True
    finally:
        assert time.perf_counter() - start < 5, "decoding took too long"
    return False


def fix_crc(data: bytes | bytearray) -> bytes:
    b = bytearray(data)
    if len(b) >= 16:
        b[-4:] = crc32c(bytes(b[:-4])).to_bytes(4, "little")
    return bytes(b)


def rewrap(sample: Sample, body: bytes) -> bytes:
    """``body`` in a fresh raw envelope of the sample's kind."""
    return encode_envelope(sample.magic, body, None)


def positions(n: int, limit: int, rng: random.Random) -> list[int]:
    if n <= limit:
        return list(range(n))
    head = list(range(64))  # headers, tables and counts live at the front
    return sorted(set(head + rng.sample(range(64, n), limit - 64)))


# ------------------------------------------------------------------------------ random bytes
@given(st.binary(max_size=600))
@FUZZ
def test_random_bytes(data: bytes) -> None:
    only_corruption(decode_manifest, data)
    only_corruption(decode_btree_node, data, max_body=NODE_LIMIT)
    only_corruption(decode_version_tree_node, data, arity_log2=4)
    for magic in (MANIFEST_MAGIC, BTREE_NODE_MAGIC, VERSION_NODE_MAGIC):
        only_corruption(decode_envelope, data, magic, max_body=NODE_LIMIT)


@given(st.binary(max_size=400), st.sampled_from(["manifest", "btree", "version"]), st.integers(1, 16))
@FUZZ
def test_random_bodies_in_valid_envelopes(body: bytes, kind: str, arity: int) -> None:
    """Random bodies behind a correct envelope reach the body decoders."""
    s = Sample("random", kind, b"", arity)
    only_corruption(s.decode, rewrap(s, body))


@given(st.data())
@FUZZ
def test_random_mutations_of_real_bodies(data: st.DataObject) -> None:
    """Several random byte edits / insertions / deletions of a real body, CRC recomputed."""
    s = data.draw(st.sampled_from(CORPUS))
    body = bytearray(decode_envelope(s.data, s.magic, max_body=64 << 20))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        if not body:
            break
        i = data.draw(st.integers(0, len(body) - 1))
        if op == "set":
            body[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            body[i:i] = data.draw(st.binary(min_size=1, max_size=10))
        elif op == "delete":
            del body[i : i + data.draw(st.integers(1, 8))]
        else:
            del body[i:]
    only_corruption(s.decode, rewrap(s, bytes(body)))


@given(st.integers(0, 255), st.integers(0, 255), st.binary(max_size=300))
@FUZZ
def test_random_zstd_frames(descriptor: int, window: int, rest: bytes) -> None:
    """Random frame headers and blocks behind the zstd magic, in a valid envelope."""
    frame = struct.pack("<I", 0xFD2FB528) + bytes([descriptor, window]) + rest
    only_corruption(decode_btree_node, _zstd_envelope(BTREE_NODE_MAGIC, frame), max_body=1 << 16)
    only_corruption(decode_manifest, _zstd_envelope(MANIFEST_MAGIC, frame))


# ------------------------------------------------------------------------------ single-byte corruption
@pytest.mark.parametrize("sample", CORPUS, ids=lambda s: s.name[-40:])
def test_every_byte_flip_is_caught_by_crc(sample: Sample) -> None:
    """With the stored CRC left alone, every single-byte change must be rejected."""
    rng = random.Random(1)
    data = sample.data
    for i in positions(len(data), 400, rng):
        for x in (0x01, 0xFF):
            bad = bytearray(data)
            bad[i] ^= x
            assert only_corruption(sample.decode, bytes(bad)), (sample.name, i, x)


@pytest.mark.parametrize("sample", CORPUS, ids=lambda s: s.name[-40:])
def test_every_byte_flip_with_crc_recomputed(sample: Sample) -> None:
    """Damage the stored (possibly compressed) bytes and fix the CRC: the zstd layer and the
    decoders must still only raise CorruptionError."""
    rng = random.Random(2)
    data = sample.data
    caught = 0
    tried = 0
    for i in positions(len(data) - 4, 300, rng):
        for x in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[i] ^= x
            tried += 1
            caught += only_corruption(sample.decode, fix_crc(bad))
    assert caught >= 1, (sample.name, tried)  # e.g. flips of the magic or length field


@pytest.mark.parametrize("sample", CORPUS, ids=lambda s: s.name[-40:])
def test_every_body_byte_change_rewrapped(sample: Sample) -> None:
    """Change each byte of the decoded body (several values) and re-wrap it raw."""
    rng = random.Random(3)
    body = bytes(decode_envelope(sample.data, sample.magic, max_body=64 << 20))
    assert sample.decode(rewrap(sample, body)) == sample.decode(sample.data)
    for i in positions(len(body), 500, rng):
        for v in {body[i] ^ 0x01, body[i] ^ 0x80, 0x00, 0xFF, 0x7F}:
            bad = bytearray(body)
            bad[i] = v
            only_corruption(sample.decode, rewrap(sample, bytes(bad)))
    for cut in range(0, len(body), max(1, len(body) // 50)):
        assert only_corruption(sample.decode, rewrap(sample, body[:cut]))


# ------------------------------------------------------------------------------ whole-database fuzz
def _fixture_db(name: str) -> tuple[dict[str, bytes], dict[str, Any]]:
    root = FIXTURES / name
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return files, json.loads((FIXTURES / f"{name}.expected.json").read_text())


def _read_everything(files: dict[str, bytes]) -> None:
    db = ocdbt_py.open(MemoryStore(files))
    for v in db.versions():
        s = db.at(v.generation)
        for _ in s.items():
            pass
        list(s.list(prefix=b"d"))
        s.get(b"dir1/sub2/k0001")
    db.at("2100-01-01T00:00:00Z").get(b"x")


@pytest.mark.skipif(not FIXTURES.exists(), reason="golden fixtures missing")
@pytest.mark.parametrize("name", ["raw_commits", "numbered_arity2", "arity1_many_versions", "zstd_default"])
def test_corrupted_database_reads_raise_only_ocdbt_errors(name: str) -> None:
    """Corrupt one byte of one node body (CRC fixed) and read every version: only OcdbtError."""
    files, oracle = _fixture_db(name)
    rng = random.Random(name)
    locs = [n["location"] for n in oracle.get("btree_nodes", []) + oracle.get("version_nodes", [])]
    magic = {"btreenode": BTREE_NODE_MAGIC, "versionnode": VERSION_NODE_MAGIC}
    failures = 0
    runs = 0
    for loc in rng.sample(locs, min(8, len(locs))):
        kind, base, rel, off_s, len_s = loc.split(":")
        key, off, length = base + rel, int(off_s), int(len_s)
        blob = files[key][off : off + length]
        body = bytes(decode_envelope(blob, magic[kind], max_body=64 << 20))
        for _ in range(6):
            bad = bytearray(body)
            bad[rng.randrange(len(bad))] = rng.randrange(256)
            new = encode_envelope(magic[kind], bytes(bad), None)
            if len(new) != length:
                continue
            damaged = dict(files)
            damaged[key] = files[key][:off] + new + files[key][off + length :]
            runs += 1
            try:
                _read_everything(damaged)
            except OcdbtError:
                failures += 1
    # manifest: corrupt its body
    mkey = oracle["manifest_files"][-1]
    body = bytes(decode_envelope(files[mkey], MANIFEST_MAGIC, max_body=64 << 20))
    for _ in range(20):
        bad = bytearray(body)
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        damaged = dict(files)
        damaged[mkey] = encode_envelope(MANIFEST_MAGIC, bytes(bad), None)
        runs += 1
        try:
            _read_everything(damaged)
        except OcdbtError:
            failures += 1
    assert runs >= 20 and failures >= 1


# ------------------------------------------------------------------------------ allocation bombs
def _peak(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            fn()
        except CorruptionError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _zstd_frame(blocks: list[tuple[int, bytes, int]], *, window_log: int = 17, content: int | None = None) -> bytes:
    """A hand-made zstd frame: blocks are ``(type, payload, size field)``."""
    if content is None:
        out = struct.pack("<I", 0xFD2FB528) + bytes([0x00, (window_log - 10) << 3])
    else:
        out = struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", content)  # single segment, 8-byte size
    for i, (btype, payload, size) in enumerate(blocks):
        bh = (1 if i == len(blocks) - 1 else 0) | (btype << 1) | (size << 3)
        out += bytes([bh & 0xFF, (bh >> 8) & 0xFF, bh >> 16]) + payload
    return out


def _zstd_envelope(magic: int, frame: bytes) -> bytes:
    blob = bytearray(struct.pack(">I", magic) + b"\x00" * 8 + b"\x00\x01") + frame
    struct.pack_into("<Q", blob, 4, len(blob) + 4)
    return bytes(blob) + crc32c(bytes(blob)).to_bytes(4, "little")


def test_zstd_rle_bomb_is_bounded() -> None:
    """8,000 RLE blocks of 128 KiB each claim 1 GiB from 32 KB of input."""
    frame = _zstd_frame([(1, b"x", 1 << 17)] * 8000)
    blob = _zstd_envelope(BTREE_NODE_MAGIC, frame)
    peak = _peak(lambda: decode_btree_node(blob, max_body=1 << 20))
    with pytest.raises(CorruptionError):
        decode_btree_node(blob, max_body=1 << 20)
    assert peak < 8 << 20, peak


def test_zstd_declared_content_size_bomb_is_bounded() -> None:
    frame = _zstd_frame([(1, b"x", 1 << 17)], content=1 << 40)
    blob = _zstd_envelope(MANIFEST_MAGIC, frame)
    assert _peak(lambda: decode_manifest(blob)) < 1 << 20
    with pytest.raises(CorruptionError):
        decode_manifest(blob)


def test_zstd_huge_window_without_content_size() -> None:
    """A streamed frame (no content size) declaring a 2 GiB window is rejected cheaply."""
    frame = _zstd_frame([(0, b"hello", 5)], window_log=31)
    blob = _zstd_envelope(BTREE_NODE_MAGIC, frame)
    with pytest.raises(CorruptionError):
        decode_btree_node(blob, max_body=1 << 20)
    assert _peak(lambda: decode_btree_node(blob, max_body=1 << 20)) < 1 << 20


def test_zstd_streamed_frame_with_128_mib_window_decodes() -> None:
    """zstd level 22 streams frames that declare a 128 MiB window and no content size: legal
    input, decoded with no Python allocation beyond the output (the peak RSS guard checks the
    window libzstd reserves is not touched)."""
    import zstandard

    body = bytes([0, 0, 1, 1]) + b"k" + b"\x00\x00"  # leaf: one key "k", empty inline value
    frame = _zstd_frame([(0, body, len(body))], window_log=27)
    params = zstandard.get_frame_parameters(frame)
    assert params.window_size == 1 << 27 and params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    blob = _zstd_envelope(BTREE_NODE_MAGIC, frame)
    assert decode_btree_node(blob, max_body=1 << 20).keys == [b"k"]
    assert _peak(functools.partial(decode_btree_node, blob, max_body=1 << 20)) < 1 << 20


def _varints(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _key_bomb(n: int) -> bytes:
    """A leaf whose keys are 60,000 ``a`` plus two increasing bytes: tiny on disk, 60 KB each."""
    prefixes: list[int] = []
    suffixes = [60_002]
    key_bytes = bytearray(b"a" * 60_000 + b"\x01\x01")
    for i in range(1, n):
        hi, lo = i // 255 + 1, i % 255 + 1
        if hi == (i - 1) // 255 + 1:
            prefixes.append(60_001)
            suffixes.append(1)
            key_bytes.append(lo)
        else:
            prefixes.append(60_000)
            suffixes.append(2)
            key_bytes += bytes([hi, lo])
    body = b"\x00\x00" + _varints([n]) + _varints(prefixes) + _varints(suffixes) + bytes(key_bytes)
    body += b"\x00" * n + b"\x00" * n  # value lengths 0, kinds inline
    return encode_envelope(BTREE_NODE_MAGIC, body, None)


def test_key_prefix_bomb_is_bounded() -> None:
    """40,000 keys of 60 KB each (2.4 GB if materialised) from a 300 KB node."""
    blob = _key_bomb(40_000)
    assert len(blob) < 400_000
    peak = _peak(lambda: decode_btree_node(blob, max_body=NODE_LIMIT))
    assert peak < 32 << 20, peak
    node = decode_btree_node(blob, max_body=NODE_LIMIT)
    assert len(node.keys) == 40_000 and node.keys[-1][:3] == b"aaa" and len(node.keys[-1]) == 60_002


def test_key_bytes_beyond_the_node_limit_are_rejected() -> None:
    """Keys that share less than a node-wide prefix are bounded by the decoded node size."""
    n = 3000
    # first key empty, so nothing is common to all keys; every other key is 60 KB
    prefixes = [0] + [60_000] * (n - 2)
    suffixes = [0, 60_001] + [1] * (n - 2)
    key_bytes = b"a" * 60_000 + b"\x01" + bytes((i % 250) + 2 for i in range(n - 2))
    body = b"\x00\x00" + _varints([n]) + _varints(prefixes) + _varints(suffixes) + key_bytes + b"\x00" * 2 * n
    blob = encode_envelope(BTREE_NODE_MAGIC, body, None)
    with pytest.raises(CorruptionError, match="expand"):
        decode_btree_node(blob, max_body=1 << 20)
    assert _peak(lambda: decode_btree_node(blob, max_body=1 << 20)) < 8 << 20


def test_data_file_table_path_bomb_is_bounded() -> None:
    """Table entries that each reuse a 64,999-byte path prefix (2.6 GB if materialised)."""
    n = 40_000
    body = b"\x00" + _varints([n]) + _varints([64_999] * (n - 1)) + _varints([65_000] + [1] * (n - 1))
    body += _varints([0] * n) + b"p" * 65_000 + bytes(i % 250 + 1 for i in range(n - 1)) + b"\x01\x00\x00\x00"
    blob = encode_envelope(BTREE_NODE_MAGIC, body, None)
    peak = _peak(lambda: decode_btree_node(blob, max_body=NODE_LIMIT))
    assert peak < 32 << 20, peak
    with pytest.raises(CorruptionError, match="expand"):
        decode_btree_node(blob, max_body=NODE_LIMIT)
    # the same long prefix as a shared *base path* is legal and held once
    body = b"\x00" + _varints([n]) + _varints([64_999] * (n - 1)) + _varints([65_000] + [1] * (n - 1))
    body += _varints([64_999] * n) + b"p" * 65_000 + bytes(i % 250 + 1 for i in range(n - 1))
    body += b"\x01\x00\x00\x00"  # one leaf entry: empty key, empty inline value
    blob = encode_envelope(BTREE_NODE_MAGIC, body, None)
    assert _peak(lambda: decode_btree_node(blob, max_body=NODE_LIMIT)) < 32 << 20
    assert decode_btree_node(blob, max_body=NODE_LIMIT).keys == [b""]


def test_huge_counts_are_rejected_before_allocating() -> None:
    cases = [
        b"\x00\x00" + _varints([1 << 20]),  # b+tree entries
        b"\x00" + _varints([1 << 40]),  # data files
    ]
    for body in cases:
        blob = encode_envelope(BTREE_NODE_MAGIC, body + b"\x00" * 64, None)
        assert _peak(functools.partial(decode_btree_node, blob, max_body=NODE_LIMIT)) < 1 << 20
    version = bytes([16, 0, 0]) + _varints([1 << 16]) + b"\x00" * 64  # 65536 versions, arity 16
    blob = encode_envelope(VERSION_NODE_MAGIC, version, None)
    assert _peak(lambda: decode_version_tree_node(blob, arity_log2=16)) < 1 << 20
    with pytest.raises(CorruptionError):
        decode_version_tree_node(blob, arity_log2=16)
    # a manifest whose config claims a 4 GiB node size does not make readers allocate it
    cfg = Config(max_decoded_node_bytes=(1 << 32) - 1, compression_level=None)
    db = DbFiles()
    tree = build_tree(db, {b"k": b"v"})
    db.put("manifest.ocdbt", single_manifest(cfg, [generation(1, tree)]))
    assert dict(ocdbt_py.open(MemoryStore(db.as_dict())).items()) == {b"k": b"v"}


def test_huge_lengths_in_references_are_not_allocated() -> None:
    """A root reference claiming 2**62 bytes, and a value claiming 2**60 bytes."""
    db = DbFiles()
    tree = build_tree(db, {b"k": b"v" * 200})
    assert tree.root is not None
    huge_root = dataclasses.replace(tree, root=tree.root._replace(length=1 << 62))
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, huge_root)]))
    peak = _peak(lambda: ocdbt_py.open(MemoryStore(db.as_dict())).get(b"k"))
    assert peak < 4 << 20
    with pytest.raises(CorruptionError):
        ocdbt_py.open(MemoryStore(db.as_dict())).get(b"k")
    # value reference far beyond its data file
    db2 = DbFiles()
    ref = IndirectDataReference(DataFileId(b"", b"d/values"), 0, 1 << 60)
    db2.append(b"short", "d/values")
    root = db2.append(encode_leaf_node([b"k"], [ref], None), "d/nodes")
    db2.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(root, 0, Statistics(1, 1, 1 << 60)))]))
    store = ocdbt_py.open(MemoryStore(db2.as_dict()))
    assert _peak(lambda: store.get(b"k")) < 4 << 20
    with pytest.raises(CorruptionError):
        store.get(b"k")
    assert store.get(b"k", (0, 3)) == b"sho"
    with pytest.raises(CorruptionError):
        store.get(b"k", (3, 10))
