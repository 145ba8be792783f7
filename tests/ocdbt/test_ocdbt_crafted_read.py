"""The read path on databases built with our own encoders (no TensorStore needed).

Legal databases are checked against a dict model (hypothesis); hostile ones must fail with
:class:`CorruptionError` / :class:`NotFoundError` and never touch anything outside the root.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import itertools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ocdbt_py
from ocdbt_py.errors import CorruptionError, InvalidKeyError, NotFoundError
from ocdbt_py.format.btree import BtreeChild, PrefixedKeys, decode_btree_node, encode_interior_node, encode_leaf_node
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest, encode_manifest
from ocdbt_py.format.version_tree import VersionNodeReference
from ocdbt_py.kvstore import KvStore, LocalStore, MemoryStore
from ocdbt_py.kvstore.base import ByteRange, ReadRequest, normalize_request
from ocdbt_py.timeutil import format_nanoseconds
from tests.ocdbt.ocdbt_craft import (
    RAW,
    DbFiles,
    Tree,
    build_tree,
    build_version_tree,
    generation,
    single_manifest,
    write_dir,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class RecordingStore(KvStore):
    """Passes reads to ``base`` and records every key asked for."""

    def __init__(self, base: KvStore):
        self.base = base
        self.keys: list[str] = []
        self.read_only = True

    @property
    def url(self) -> str:
        return self.base.url

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        self.keys.append(key)
        return self.base.get(key, byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        self.keys.extend(k for k, _ in reqs)
        return self.base.get_many(reqs)

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        return self.base.list(prefix, start=start, stop=stop)


def open_files(files: dict[str, bytes]) -> ocdbt_py.OcdbtStore:
    return ocdbt_py.open(MemoryStore(files))


def one_generation_db(items: dict[bytes, bytes], **tree_args: object) -> DbFiles:
    db = DbFiles()
    tree = build_tree(db, items, **tree_args)  # type: ignore[arg-type]
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, tree)]))
    return db


# ------------------------------------------------------------------------------ legal databases vs a model
_key = st.binary(max_size=6) | st.sampled_from([b"", b"a", b"ab", b"abc", b"\xff", b"\xff\xff", b"\x00"])


@given(
    st.dictionaries(_key, st.binary(max_size=40), max_size=60),
    st.integers(2, 5),
    st.sampled_from([0, 4, 100]),
    st.sampled_from([None, 1]),
    st.integers(0, 3),
    st.data(),
)
@SETTINGS
def test_reads_match_model(
    items: dict[bytes, bytes], fanout: int, inline: int, level: int | None, min_height: int, data: st.DataObject
) -> None:
    db = DbFiles()
    tree = build_tree(db, items, fanout=fanout, inline_limit=inline, zstd_level=level, min_height=min_height)
    cfg = dataclasses.replace(RAW, compression_level=level)
    db.put("manifest.ocdbt", single_manifest(cfg, [generation(1, tree)]))
    s = open_files(db.as_dict())
    keys = sorted(items)
    assert list(s.list()) == keys
    assert dict(s.items(batch=3)) == items
    assert [(e.key, e.size) for e in s.entries()] == [(k, len(items[k])) for k in keys]
    assert len(s) == len(items)
    probes = data.draw(st.lists(_key, max_size=10))
    assert s.get_many(probes) == [items.get(k) for k in probes]
    for k in probes:
        assert s.get(k) == items.get(k)
        assert (k in s) == (k in items)
    lo, hi = sorted(data.draw(st.tuples(_key, _key)))
    want = keys[bisect.bisect_left(keys, lo) : bisect.bisect_left(keys, hi)]
    assert list(s.list(start=lo, stop=hi)) == want
    prefix = data.draw(_key)
    assert list(s.list(prefix=prefix)) == [k for k in keys if k.startswith(prefix)]
    assert list(s.list(prefix=prefix, start=lo)) == [k for k in keys if k.startswith(prefix) and k >= lo]
    for k in keys[:5]:
        v = items[k]
        a = data.draw(st.integers(0, len(v) + 2))
        b = data.draw(st.integers(a, len(v) + 5))
        assert s.get(k, (a, b)) == v[a:b]
        assert s.get(k, (a, None)) == v[a:]
        if a:
            assert s.get(k, (-a, None)) == v[-a:]


@given(st.integers(1, 4), st.integers(1, 70), st.sampled_from([None, 2]))
@SETTINGS
def test_version_tree_reads_match_model(arity: int, last: int, level: int | None) -> None:
    cfg = dataclasses.replace(RAW, version_tree_arity_log2=arity, compression_level=level)
    db = DbFiles()
    models = {}
    versions = []
    for g in range(1, last + 1):
        items = {f"k{i:02d}".encode(): f"{g}.{i}".encode() * (i % 3) for i in range(g % 9)}
        models[g] = items
        versions.append(generation(g, build_tree(db, items, fanout=3, zstd_level=level)))
    db.put("manifest.ocdbt", encode_manifest(build_version_tree(db, cfg, versions)))
    s = open_files(db.as_dict())
    assert s.generation == last
    assert [v.generation for v in s.versions()] == list(range(1, last + 1))
    times = [v.commit_time for v in versions]
    for g in sorted({1, last, last // 2 + 1, max(1, last - (1 << arity))}):
        assert dict(s.at(g).items()) == models[g]
        t = times[g - 1]
        assert s.at(format_nanoseconds(t)).generation == g
        assert s.at(format_nanoseconds(t + 999_999_999)).generation == g
        expect_before = g - 1 if g > 1 else None
        if expect_before is None:
            with pytest.raises(NotFoundError):
                s.at(format_nanoseconds(t - 1))
        else:
            assert s.at(format_nanoseconds(t - 1)).generation == expect_before
        when = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=t // 1000)
        assert s.at(when).generation == g
    for bad in (0, last + 1, 1 << 63):
        with pytest.raises(NotFoundError):
            s.at(bad)


def test_version_selectors_reject_bad_types() -> None:
    s = open_files(one_generation_db({b"a": b"1"}).as_dict())
    for bad in (True, 1.5, b"1", None):
        if bad is None:
            assert s.at(1).generation == 1
            continue
        with pytest.raises(TypeError):
            s.at(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.at("yesterday")
    with pytest.raises(NotFoundError):
        s.at(-1)
    with pytest.raises(InvalidKeyError):
        s.get(b"k" * 65536)


def test_long_shared_prefix_keys_are_held_once() -> None:
    """A root leaf whose 5,000 keys share a 2 KB prefix: compact in memory, correct reads."""
    prefix = b"p" * 2000
    items = {prefix + i.to_bytes(2, "big"): i.to_bytes(2, "big") for i in range(5000)}
    db = one_generation_db(items, fanout=10_000)
    files = db.as_dict()
    s = open_files(files)
    ref = s.manifest.latest.root
    assert ref is not None
    node = decode_btree_node(files[ref.file.path.decode()][ref.offset :], max_body=1 << 20)
    assert isinstance(node.keys, PrefixedKeys)
    assert node.keys[0] == prefix + b"\x00\x00" and node.keys[-1] == prefix + (4999).to_bytes(2, "big")
    assert node.keys[1:3] == [prefix + b"\x00\x01", prefix + b"\x00\x02"]
    assert node.keys == sorted(items)
    assert dict(s.items()) == items
    assert s.get(prefix + (1234).to_bytes(2, "big")) == (1234).to_bytes(2, "big")
    assert s.get(prefix) is None
    tail = [prefix + (4998).to_bytes(2, "big"), prefix + (4999).to_bytes(2, "big")]
    assert list(s.list(start=prefix + b"\x13\x86")) == tail


def test_deep_single_child_chain() -> None:
    """Height never shrinks in TensorStore: a root 255 levels (the most a height byte allows)
    above one leaf still reads, without recursion trouble."""
    items = {b"a": b"1", b"b": b"2" * 300}
    s = open_files(one_generation_db(items, min_height=255).as_dict())
    assert s.manifest.latest.root_height == 255
    assert dict(s.items()) == items
    assert s.get(b"b") == b"2" * 300
    assert s.get_many([b"a", b"c"]) == [b"1", None]


# ------------------------------------------------------------------------------ base and transitive paths
def _sub_database(db: DbFiles, prefix: str, items: dict[bytes, bytes]) -> Tree:
    """Build a tree whose files live below ``prefix`` but whose tables name them relative to it."""
    sub = DbFiles()
    tree = build_tree(sub, items, fanout=2, inline_limit=3)
    for name, data in sub.as_dict().items():
        db.put(prefix + name, data)
    assert tree.root is not None
    return dataclasses.replace(
        tree, root=tree.root._replace(file=DataFileId(prefix.encode(), tree.root.file.relative_path))
    )


def test_base_and_transitive_paths() -> None:
    """Nodes reached through ``(base, relative)`` resolve their own tables below ``base``."""
    db = DbFiles()
    left = _sub_database(db, "ocdbt.process_0/", {b"a/1": b"x" * 10, b"a/2": b"y", b"a/3": b"z" * 20})
    inner = DbFiles()
    deep = build_tree(inner, {b"b/1": b"w" * 50, b"b/2": b"v", b"b/3": b""}, fanout=2, inline_limit=3)
    # "outer/" holds a database whose root is reached via base "outer/", which itself refers to
    # "inner/" below it: keys resolve to outer/inner/d/...
    for name, data in inner.as_dict().items():
        db.put("outer/inner/" + name, data)
    assert deep.root is not None
    mid_ref = deep.root._replace(file=DataFileId(b"inner/", deep.root.file.relative_path))
    mid_blob = encode_interior_node(deep.height + 1, [b"b/1"], [0], [BtreeChild(mid_ref, deep.stats)], None)
    mid_loc = DbFiles()
    ref = mid_loc.append(mid_blob, "d/mid")
    db.put("outer/d/mid", mid_loc.as_dict()["d/mid"])
    right = Tree(ref._replace(file=DataFileId(b"outer/", b"d/mid")), deep.height + 1, deep.stats)
    # the root: one child per sub-database, same height via single-child chains
    h = max(left.height, right.height) + 1
    children = []
    for t, first in ((left, b"a/1"), (right, b"b/1")):
        node_ref = t.root
        assert node_ref is not None
        for hh in range(t.height + 1, h):
            blob = encode_interior_node(hh, [first], [0], [BtreeChild(node_ref, t.stats)], None)
            node_ref = db.append(blob, "d/root")
        children.append(BtreeChild(node_ref, t.stats))
    root = db.append(encode_interior_node(h, [b"a/1", b"b/1"], [0, 0], children, None), "d/root")
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(root, h, Statistics(5, 0, 0)))]))
    store = RecordingStore(MemoryStore(db.as_dict()))
    s = ocdbt_py.open(store)
    expected = {b"a/1": b"x" * 10, b"a/2": b"y", b"a/3": b"z" * 20, b"b/1": b"w" * 50, b"b/2": b"v", b"b/3": b""}
    assert dict(s.items()) == expected
    assert s.get(b"b/1") == b"w" * 50
    entries = {e.key: e.location for e in s.entries()}
    assert entries[b"a/1"] is not None and entries[b"a/1"].file.base_path == b"ocdbt.process_0/"
    assert entries[b"b/1"] is not None and entries[b"b/1"].file.base_path == b"outer/inner/"
    assert {"ocdbt.process_0/d/values", "outer/inner/d/values", "outer/inner/d/nodes", "outer/d/mid"} <= set(store.keys)


# ------------------------------------------------------------------------------ hostile data-file paths
HOSTILE = [
    b"../secret",
    b"/etc/passwd",
    b"s3://x/y",
    b"d/../../x",
    b"..",
    b"d/..",
    b"./x",
    b"d//x",
    b"~/x",
    b"C:\\x",
    b"C:/x",
    b"file:///etc/passwd",
    b"d/x\x00y",
    b"\xff\xfe",
    b"",
]


def _check_attack(tmp_path: Path, files: dict[str, bytes], action: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "db"
    write_dir(root, files)
    (tmp_path / "secret").write_bytes(b"TOP SECRET")
    opened: list[str] = []
    real_open = os.open

    def spy(path: str | bytes | os.PathLike[str], *args: object, **kwargs: object) -> int:
        name = os.fsdecode(path)
        if kwargs.get("dir_fd") is not None:  # one component below an already checked directory
            assert "/" not in name and name not in ("..", "."), name
        else:
            opened.append(name)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    store = RecordingStore(LocalStore(root, read_only=True))
    with pytest.raises(CorruptionError):
        s = ocdbt_py.open(store)
        if action == "get":
            s.get(b"k")
        elif action == "items":
            dict(s.items())
        elif action == "versions":
            s.versions()
            s.at(1)
        else:
            raise AssertionError(action)
    real_root = os.path.realpath(root)
    for key in store.keys:
        assert ".." not in key.split("/") and not key.startswith("/") and ":" not in key, key
    for path in opened:
        real = os.path.realpath(path)
        assert real == real_root or real.startswith(real_root + os.sep), path


@pytest.mark.parametrize("path", HOSTILE, ids=lambda p: repr(p)[2:-1] or "empty")
def test_hostile_root_reference(tmp_path: Path, path: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    db = DbFiles()
    tree = build_tree(db, {b"k": b"v"})
    assert tree.root is not None
    bad = tree.root._replace(file=DataFileId(b"", path))
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, dataclasses.replace(tree, root=bad))]))
    _check_attack(tmp_path, db.as_dict(), "get", monkeypatch)


@pytest.mark.parametrize("path", HOSTILE, ids=lambda p: repr(p)[2:-1] or "empty")
def test_hostile_value_reference(tmp_path: Path, path: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    db = DbFiles()
    ref = IndirectDataReference(DataFileId(b"", path), 0, 10)
    root = db.append(encode_leaf_node([b"k"], [ref], None), "d/nodes")
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(root, 0, Statistics(1, 1, 10)))]))
    _check_attack(tmp_path, db.as_dict(), "get", monkeypatch)
    # listing does not read values, so it still works; reading them fails
    s = ocdbt_py.open(tmp_path / "db")
    assert list(s.list()) == [b"k"]
    with pytest.raises(CorruptionError):
        dict(s.items())


@pytest.mark.parametrize(
    "base,rel",
    [(b"../", b"secret"), (b"/", b"etc/passwd"), (b"s3:", b"//x/y"), (b"d/", b"../../x"), (b"..", b"/secret")],
)
def test_hostile_base_paths_in_interior_nodes(
    tmp_path: Path, base: bytes, rel: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = DbFiles()
    leaf = db.append(encode_leaf_node([b"k"], [b"v"], None), "d/nodes")
    child = leaf._replace(file=DataFileId(base, rel))
    root = db.append(encode_interior_node(1, [b"k"], [0], [BtreeChild(child, Statistics(1, 1, 0))], None), "d/nodes")
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(root, 1, Statistics(1, 1, 0)))]))
    _check_attack(tmp_path, db.as_dict(), "items", monkeypatch)


def test_hostile_transitive_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node reached via base ``sub/`` whose own table climbs out with ``../../``."""
    db = DbFiles()
    ref = IndirectDataReference(DataFileId(b"../../", b"secret"), 0, 10)
    leaf_blob = encode_leaf_node([b"k"], [ref], None)
    sub = DbFiles()
    leaf = sub.append(leaf_blob, "d/nodes")
    db.put("sub/d/nodes", sub.as_dict()["d/nodes"])
    child = leaf._replace(file=DataFileId(b"sub/", b"d/nodes"))
    root = db.append(encode_interior_node(1, [b"k"], [0], [BtreeChild(child, Statistics(1, 1, 10))], None), "d/root")
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(root, 1, Statistics(1, 1, 10)))]))
    s = ocdbt_py.open(MemoryStore(db.as_dict()))
    [entry] = list(s.entries())
    assert entry.location is not None and entry.location.file.path == b"sub/../../secret"
    _check_attack(tmp_path, db.as_dict(), "get", monkeypatch)


@pytest.mark.parametrize("path", [b"../secret", b"/etc/passwd", b"s3://x", b"d/../../x"])
def test_hostile_version_node_reference(tmp_path: Path, path: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = dataclasses.replace(RAW, version_tree_arity_log2=1)
    db = DbFiles()
    versions = [generation(g, build_tree(db, {b"k": str(g).encode()})) for g in range(1, 6)]
    m = build_version_tree(db, cfg, versions)
    bad_nodes = tuple(
        dataclasses.replace(r, location=r.location._replace(file=DataFileId(b"", path))) for r in m.version_nodes
    )
    db.put("manifest.ocdbt", encode_manifest(dataclasses.replace(m, version_nodes=bad_nodes)))
    _check_attack(tmp_path, db.as_dict(), "versions", monkeypatch)
    s = ocdbt_py.open(tmp_path / "db")
    assert s.generation == 5 and s.get(b"k") == b"5"  # the inline versions are unaffected


# ------------------------------------------------------------------------------ broken structure
def _two_level(children_keys: list[bytes], leaves: list[dict[bytes, bytes]], same_leaf: bool = False) -> DbFiles:
    db = DbFiles()
    refs = []
    for items in leaves:
        keys = sorted(items)
        refs.append(db.append(encode_leaf_node(keys, [items[k] for k in keys], None), "d/nodes"))
    if same_leaf:
        refs = [refs[0]] * len(children_keys)
    kids = [BtreeChild(r, Statistics(1, r.length, 0)) for r in refs]
    root = db.append(encode_interior_node(1, children_keys, [0] * len(kids), kids, None), "d/nodes")
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(root, 1, Statistics(2, 0, 0)))]))
    return db


def test_child_keys_outside_parent_range() -> None:
    # second leaf holds a key below its parent entry
    s = open_files(_two_level([b"a", b"m"], [{b"a": b"1"}, {b"c": b"2"}]).as_dict())
    with pytest.raises(CorruptionError):
        list(s.list())
    # first leaf holds a key at or above the next entry
    s = open_files(_two_level([b"a", b"m"], [{b"a": b"1", b"z": b"2"}, {b"n": b"3"}]).as_dict())
    with pytest.raises(CorruptionError):
        list(s.list())


def test_shared_subtrees_cannot_make_listing_explode() -> None:
    """Every entry of every level points at the same child: 2**40 paths through 40 nodes."""
    db = DbFiles()
    ref = db.append(encode_leaf_node([b"k"], [b"v"], None), "d/nodes")
    for h in range(1, 41):
        kids = [BtreeChild(ref, Statistics(1, 1, 0))] * 2
        ref = db.append(encode_interior_node(h, [b"k", b"l"], [0, 0], kids, None), "d/nodes")
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(ref, 40, Statistics(2, 0, 0)))]))
    s = open_files(db.as_dict())
    with pytest.raises(CorruptionError):
        list(s.list())
    assert s.get(b"k") == b"v"  # a lookup follows one path


def test_shared_subtrees_with_distinct_prefixes_are_refused() -> None:
    """Shared children under distinct prefixes would give 2**30 keys: a listing stops at the
    second visit of a node (issue 21; tests/security/test_shared_subtrees.py); a lookup
    follows one path and still works."""
    db = DbFiles()
    ref = db.append(encode_leaf_node([b""], [b"v"], None), "d/nodes")
    for h in range(1, 31):
        kids = [BtreeChild(ref, Statistics(1, 1, 0))] * 2
        ref = db.append(encode_interior_node(h, [b"a", b"b"], [1, 1], kids, None), "d/nodes")
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(ref, 30, Statistics(1 << 30, 0, 0)))]))
    s = open_files(db.as_dict())
    with pytest.raises(CorruptionError, match="reached twice"):
        list(itertools.islice(s.list(), 1000))
    assert s.get(b"ab" * 15) == b"v"


@pytest.mark.parametrize("kind", ["height", "self"])
def test_height_mismatch_and_self_reference(kind: str) -> None:
    db = DbFiles()
    leaf = db.append(encode_leaf_node([b"k"], [b"v"], None), "d/nodes")
    if kind == "height":
        # a height-2 root whose child is a leaf
        root = db.append(encode_interior_node(2, [b"k"], [0], [BtreeChild(leaf, Statistics(1, 1, 0))], None), "d/nodes")
        height = 2
    else:
        # a height-1 node whose child is itself (its own future location)
        blob_len = len(encode_interior_node(1, [b"k"], [0], [BtreeChild(leaf, Statistics(1, 1, 0))], None))
        me = IndirectDataReference(leaf.file, leaf.length, blob_len)
        root = db.append(encode_interior_node(1, [b"k"], [0], [BtreeChild(me, Statistics(1, 1, 0))], None), "d/nodes")
        assert root == me
        height = 1
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(root, height, Statistics(1, 1, 0)))]))
    s = open_files(db.as_dict())
    with pytest.raises(CorruptionError):
        s.get(b"k")
    with pytest.raises(CorruptionError):
        list(s.list())
    with pytest.raises(CorruptionError):
        s.get_many([b"k", b"j"])


@pytest.mark.parametrize("damage", ["missing", "truncated", "short value"])
def test_missing_and_truncated_data_files(damage: str) -> None:
    db = one_generation_db({b"a": b"x" * 500, b"b": b"y"}, inline_limit=10)
    files = db.as_dict()
    if damage == "missing":
        del files["d/nodes"]
    elif damage == "truncated":
        files["d/nodes"] = files["d/nodes"][:-3]
    else:
        files["d/values"] = files["d/values"][:100]
    s = open_files(files)
    with pytest.raises(CorruptionError):
        dict(s.items())
    with pytest.raises(CorruptionError):
        s.get(b"a")


def test_version_tree_damage() -> None:
    cfg = dataclasses.replace(RAW, version_tree_arity_log2=1)
    db = DbFiles()
    versions = [generation(g, build_tree(db, {b"k": str(g).encode()})) for g in range(1, 10)]
    m = build_version_tree(db, cfg, versions)
    files = db.as_dict()

    def with_refs(refs: tuple[VersionNodeReference, ...]) -> ocdbt_py.OcdbtStore:
        f = dict(files)
        f["manifest.ocdbt"] = encode_manifest(dataclasses.replace(m, version_nodes=refs))
        return open_files(f)

    assert [v.generation for v in with_refs(m.version_nodes).versions()] == list(range(1, 10))
    top = m.version_nodes[0]
    # wrong last generation, and a reference to a node of another height
    # (claiming no more generations than fit below it, which the manifest decoder checks)
    wrong_gen = dataclasses.replace(top, generation_number=top.generation_number - 1,
                                    num_generations=top.num_generations - 1)
    low = m.version_nodes[1]
    wrong_height = dataclasses.replace(low, location=top.location)
    for refs, damaged, intact in (((wrong_gen,) + m.version_nodes[1:], 1, 5), ((top, wrong_height), 5, 1)):
        s = with_refs(refs)
        assert s.get(b"k") == b"9"
        assert s.at(intact).get(b"k") == str(intact).encode()
        with pytest.raises(CorruptionError):
            s.versions()
        with pytest.raises(CorruptionError):
            s.at(damaged)
    # a cached node does not skip the checks for another reference to it
    s = with_refs(m.version_nodes)
    s.versions()
    s._reader.version_node(top.location, top.height, top.generation_number)
    with pytest.raises(CorruptionError):
        s._reader.version_node(top.location, top.height, top.generation_number - 1)
    with pytest.raises(CorruptionError):
        s._reader.version_node(top.location, top.height - 1, top.generation_number)
    # a version node of another arity
    other = DbFiles()
    versions2 = [generation(g, build_tree(other, {b"k": b"v"})) for g in range(1, 10)]
    m2 = build_version_tree(other, dataclasses.replace(cfg, version_tree_arity_log2=2), versions2)
    f = other.as_dict()
    f["manifest.ocdbt"] = encode_manifest(dataclasses.replace(m2, config=cfg, versions=m2.versions[-1:]))
    with pytest.raises(CorruptionError):
        open_files(f).versions()


# ------------------------------------------------------------------------------ manifests
def test_no_database_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        ocdbt_py.open(tmp_path)
    with pytest.raises(NotFoundError):
        ocdbt_py.open(MemoryStore({"d/x": b"1"}))


def test_numbered_manifests() -> None:
    cfg = dataclasses.replace(RAW, manifest_kind=1)
    config_only = encode_manifest(Manifest(cfg))
    # config written, nothing committed yet: an empty database
    s = open_files({"manifest.ocdbt": config_only})
    assert s.generation == 0 and list(s.list()) == [] and s.versions() == [] and s.get(b"a") is None
    db = DbFiles()
    versions = [generation(g, build_tree(db, {b"k": str(g).encode()})) for g in range(1, 4)]
    files = db.as_dict()
    files["manifest.ocdbt"] = config_only
    for g in range(1, 4):
        files[f"manifest.{g:016x}"] = single_manifest(RAW, versions[:g])
    files["manifest.00000000000000ZZ"] = b"ignored: not hex"
    files["manifest.000000000000009"] = b"ignored: 15 digits"
    files["manifest.0000000000000000"] = b"ignored: generation 0"
    files["manifest.ocdbt.tmp"] = b"ignored"
    s = open_files(files)
    assert s.generation == 3 and s.get(b"k") == b"3"
    assert s.info()["manifest_key"] == "manifest.0000000000000003"
    assert [v.generation for v in s.versions()] == [1, 2, 3]
    # the newest file's name must match its latest generation
    bad = dict(files)
    bad["manifest.0000000000000004"] = single_manifest(RAW, versions[:3])
    with pytest.raises(CorruptionError):
        open_files(bad)
    # and its uuid must match manifest.ocdbt's
    other = dict(files)
    other["manifest.0000000000000003"] = single_manifest(dataclasses.replace(RAW, uuid=b"x" * 16), versions)
    with pytest.raises(CorruptionError):
        open_files(other)


def test_config_only_manifest_in_single_kind_position() -> None:
    """A ``manifest.ocdbt`` of the single kind must hold at least one version."""
    body_cfg = Config(uuid=b"u" * 16, compression_level=None)
    blob = encode_manifest(Manifest(dataclasses.replace(body_cfg, manifest_kind=1)))
    # flip the kind byte to single and fix the CRC: no versions follow the config
    from ocdbt_py.format.envelope import crc32c

    b = bytearray(blob)
    b[14 + 16] = 0
    b[-4:] = crc32c(bytes(b[:-4])).to_bytes(4, "little")
    with pytest.raises(CorruptionError):
        open_files({"manifest.ocdbt": bytes(b)})


def test_as_kvstore_view() -> None:
    items = {b"a/zarr.json": b"{}", b"a/c/0": b"x" * 300, b"a/c/1": b"y", b"b": b"", "\u00fc".encode(): b"u"}
    s = open_files(one_generation_db(items, inline_limit=10).as_dict())
    kv = s.as_kvstore()
    assert list(kv.list()) == sorted(k.decode() for k in items)
    assert list(kv.list("a/c/")) == ["a/c/0", "a/c/1"]
    assert list(kv.list("a/", start="a/c/1")) == ["a/c/1", "a/zarr.json"]
    assert kv.get("a/c/0", (298, None)) == b"xx"
    assert kv.get("\u00fc") == b"u" and kv.get("missing") is None
    assert kv.get_many(["a/c/1", ("a/c/0", (0, 2)), "nope"]) == [b"y", b"xx", None]
    assert kv.read_only


def test_time_zone_offsets_select_the_same_generation() -> None:
    cfg = dataclasses.replace(RAW, version_tree_arity_log2=2)
    db = DbFiles()
    versions = [generation(g, build_tree(db, {b"k": str(g).encode()})) for g in range(1, 8)]
    db.put("manifest.ocdbt", encode_manifest(build_version_tree(db, cfg, versions)))
    s = open_files(db.as_dict())
    t = versions[4].commit_time  # generation 5
    utc = format_nanoseconds(t)
    assert s.at(utc).generation == 5
    # the same instant written with other offsets and precisions
    shifted = dt.datetime.fromtimestamp(t // 10**9, tz=dt.timezone(dt.timedelta(hours=2)))
    assert s.at(shifted.isoformat()).generation == 5
    assert s.at(shifted).generation == 5
    assert s.at(utc.replace("Z", "+00:00")).generation == 5
    assert s.at(utc[:19] + "Z").generation == 5  # whole seconds: commit times are whole seconds here
    assert s.at(format_nanoseconds(t - 1)).generation == 4


def test_oversized_manifest_is_not_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile multi-gigabyte manifest file is read only up to the size limit."""
    import ocdbt_py.read.version_read as version_read

    monkeypatch.setattr(version_read, "_MAX_MANIFEST_FILE", 200)
    files = one_generation_db({b"k": b"v"}).as_dict()
    assert len(files["manifest.ocdbt"]) <= 200
    assert ocdbt_py.open(MemoryStore(files)).get(b"k") == b"v"
    files["manifest.ocdbt"] += b"\x00" * 5000
    calls: list[tuple[str, object]] = []

    class Spy(MemoryStore):
        def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
            data = super().get(key, byte_range)
            calls.append((key, None if data is None else len(data)))
            return data

    with pytest.raises(CorruptionError, match="large"):
        ocdbt_py.open(Spy(files))
    assert calls == [("manifest.ocdbt", 201)]


def test_closing_a_version_view_leaves_the_parent_open() -> None:
    """``with db.at(g) as old:`` must not close the cache and store ``db`` still uses."""
    from ocdbt_py.kvstore import MemoryStore

    class CountingStore(MemoryStore):
        closed = 0

        def close(self) -> None:
            CountingStore.closed += 1

    import ocdbt_py

    kv = CountingStore()
    w = ocdbt_py.open(kv, mode="a")
    w.put(b"a", b"1")
    w.put(b"a", b"2")
    db = ocdbt_py.open(kv)
    with db.at(2) as old:
        assert old.get(b"a") == b"1"
    assert CountingStore.closed == 0
    assert db.get(b"a") == b"2"
    db.close()
    assert CountingStore.closed == 1
