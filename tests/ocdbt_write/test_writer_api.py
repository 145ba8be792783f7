"""The writing API: commits, transactions, conditions, config, layout rules and bad input."""

from __future__ import annotations

import io
import os
import threading
import tracemalloc
from pathlib import Path

import pytest

import ocdbt_py
from ocdbt_py.errors import (
    ConditionFailedError,
    InvalidKeyError,
    NotFoundError,
    OcdbtError,
    ReadOnlyError,
    UnsupportedError,
)
from ocdbt_py.format.config import MANIFEST_KIND_NUMBERED
from ocdbt_py.kvstore import LocalStore, MemoryStore
from tests.ocdbt_write.helpers import assert_verified, data_files


def test_open_creates_nothing_until_the_first_commit(tmp_path: Path) -> None:
    path = tmp_path / "db"
    db = ocdbt_py.open(path, mode="a")
    assert not path.exists()
    assert db.generation == 0 and len(db) == 0 and list(db.list()) == [] and db.versions() == []
    assert not db.read_only
    assert db.put(b"k", b"v") == 2  # generation 1 is the initial empty tree
    gens = db.versions()
    assert [(v.generation, v.num_keys) for v in gens] == [(1, 0), (2, 1)]
    assert gens[1].commit_time_ns > gens[0].commit_time_ns
    assert ocdbt_py.open(path)[b"k"] == b"v"
    with pytest.raises(NotFoundError):
        ocdbt_py.open(tmp_path / "other", mode="r+")
    assert ocdbt_py.open(path, mode="r+").get(b"k") == b"v"


def test_assume_config_skips_the_empty_generation(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a", config={"assume_config": True})
    assert db.put(b"k", b"v") == 1
    assert [v.generation for v in db.versions()] == [1]


def test_put_delete_delete_range_and_generations(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a")
    g = db.put("text key", b"1")
    assert db.get(b"text key") == b"1"
    assert db.delete(b"absent") == g + 1  # deleting an absent key is still a commit
    db[b"a"] = b"x"
    db[b"b"] = b"y"
    del db[b"a"]
    assert list(db.list()) == [b"b", b"text key"]
    g = db.generation
    assert db.delete_range(b"c", b"d") == g  # removes nothing: no new generation
    assert db.delete_range(b"b", None) == g + 1
    assert len(db) == 0
    assert db.commit() == db.generation
    assert_verified(tmp_path)


def test_transaction_is_atomic(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a")
    db.put(b"keep", b"0")
    before = db.generation
    with pytest.raises(RuntimeError), db.transaction() as t:
        t.put(b"a", b"1")
        t.delete(b"keep")
        raise RuntimeError("boom")
    assert t.closed and t.generation is None
    assert db.generation == before and dict(db.items()) == {b"keep": b"0"}
    with db.transaction() as t:
        t.put(b"a", b"1")
        t[b"b"] = b"2"
        assert t.get(b"a") == b"1" and t[b"keep"] == b"0"
        t.delete_range(b"a", b"b")
        assert t.get(b"a") is None
        del t[b"keep"]
        assert len(t) > 0
    assert t.generation == before + 1 == db.generation
    assert dict(db.items()) == {b"b": b"2"}
    with pytest.raises(OcdbtError):
        t.put(b"late", b"x")
    t2 = db.transaction()
    t2.put(b"z", b"9")
    t2.abort()
    assert db.get(b"z") is None
    t3 = db.transaction()
    t3.put(b"z", b"9")
    assert t3.commit() == db.generation and db[b"z"] == b"9"


def test_conditions(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a", config={"max_inline_value_bytes": 4})
    db.put(b"k", b"old value")  # out of line
    db.put(b"k", b"new value", if_equal=b"old value")
    with pytest.raises(ConditionFailedError):
        db.put(b"k", b"x", if_equal=b"old value")
    with pytest.raises(ConditionFailedError):
        db.put(b"k", b"x", if_equal=None)
    db.put(b"fresh", b"1", if_equal=None)
    db.delete(b"fresh", if_equal=b"1")
    assert db.get(b"fresh") is None and db[b"k"] == b"new value"
    # read-modify-write: a concurrent change between read and commit is detected
    other = ocdbt_py.open(tmp_path, mode="a")
    t = db.transaction()
    assert t.get(b"k") == b"new value"
    t.put(b"k", b"derived")
    other.put(b"k", b"concurrent")
    with pytest.raises(ConditionFailedError):
        t.commit()
    # ... but an unconditional transaction is re-applied on top of the concurrent commit
    t = db.transaction()
    t.put(b"other", b"1")
    other.put(b"k", b"concurrent 2")
    t.commit()
    db.refresh()
    assert db[b"k"] == b"concurrent 2" and db[b"other"] == b"1"
    with db.transaction() as t:
        t.put(b"q", b"1")
        with pytest.raises(ConditionFailedError):
            t.put(b"q", b"2", if_equal=b"0")  # checked against the transaction's own write
        t.put(b"q", b"2", if_equal=b"1")
    assert db[b"q"] == b"2"


def test_bad_input(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a")
    with pytest.raises(InvalidKeyError):
        db.put(b"x" * 65536, b"v")
    with pytest.raises(InvalidKeyError):
        db.put(12, b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        db.put(b"k", "not bytes")
    with pytest.raises(TypeError):
        db.put(b"k", b"v", if_equal=3)
    db.put(b"x" * 65535, b"max key")
    assert db[b"x" * 65535] == b"max key"
    ro = ocdbt_py.open(tmp_path)
    assert ro.read_only
    for call in (lambda: ro.put(b"k", b"v"), lambda: ro.delete(b"k"), lambda: ro.delete_range(),
                 lambda: ro.transaction(), lambda: ro.commit()):
        with pytest.raises(ReadOnlyError):
            call()
    with pytest.raises(ReadOnlyError):
        db.at(1).put(b"k", b"v")
    with pytest.raises(UnsupportedError):
        ocdbt_py.open(tmp_path, mode="a", version=1)
    with pytest.raises(ValueError):
        ocdbt_py.open(tmp_path, mode="w")
    with pytest.raises(ReadOnlyError):
        ocdbt_py.open(LocalStore(tmp_path, read_only=True), mode="a")
    with pytest.raises(UnsupportedError):
        ocdbt_py.open(f"memory://{tmp_path.name}", mode="a")  # fsspec: no conditional writes


@pytest.mark.parametrize("bad", [
    {"max_inline_value_bytes": -1}, {"max_inline_value_bytes": (1 << 20) + 1},
    {"version_tree_arity_log2": 0}, {"version_tree_arity_log2": 17}, {"manifest_kind": "x"},
    {"compression": {"id": "gzip"}}, {"compression": {"id": "zstd", "level": 23}}, {"uuid": "xyz"},
    {"nonsense": 1}, {"value_data_prefix": "../x"}, {"btree_node_data_prefix": "manifest.x"},
    {"target_data_file_size": -5}, {"max_decoded_node_bytes": True},
])
def test_bad_config(tmp_path: Path, bad: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises((ValueError, TypeError)):
        ocdbt_py.open(tmp_path, mode="a", config=bad)


def test_config_is_stored_and_enforced(tmp_path: Path) -> None:
    cfg = {"uuid": "ab" * 16, "manifest_kind": "numbered", "max_inline_value_bytes": 7,
           "max_decoded_node_bytes": 12345, "version_tree_arity_log2": 3,
           "compression": {"id": "zstd", "level": 5}}
    db = ocdbt_py.open(tmp_path, mode="a", config=cfg)
    db.put(b"k", b"v")
    c = ocdbt_py.open(tmp_path).config
    assert c.uuid == bytes.fromhex("ab" * 16) and c.manifest_kind == MANIFEST_KIND_NUMBERED
    assert (c.max_inline_value_bytes, c.max_decoded_node_bytes, c.version_tree_arity_log2,
            c.compression_level) == (7, 12345, 3, 5)
    # reopening honours the stored config; a conflicting constraint fails clearly
    again = ocdbt_py.open(tmp_path, mode="a")
    again.put(b"k2", b"v")
    assert again.config == c
    ocdbt_py.open(tmp_path, mode="a", config={"max_inline_value_bytes": 7})
    with pytest.raises(ConditionFailedError, match="max_inline_value_bytes"):
        ocdbt_py.open(tmp_path, mode="a", config={"max_inline_value_bytes": 8})
    with pytest.raises(ConditionFailedError, match="compression"):
        ocdbt_py.open(tmp_path, mode="a", config={"compression": None})


def test_defaults_match_tensorstore(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a")
    db.put(b"k", b"v")
    c = ocdbt_py.open(tmp_path).config
    assert (c.manifest_kind, c.max_inline_value_bytes, c.max_decoded_node_bytes,
            c.version_tree_arity_log2, c.compression_level) == (0, 100, 8 << 20, 4, 0)


def test_inline_threshold_and_empty_values(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a", config={"max_inline_value_bytes": 10})
    with db.transaction() as t:
        t.put(b"at", b"x" * 10)
        t.put(b"over", b"x" * 11)
        t.put(b"empty", b"")
    loc = {e.key: e.location for e in db.entries()}
    assert loc[b"at"] is None and loc[b"empty"] is None and loc[b"over"] is not None
    db0 = ocdbt_py.open(tmp_path / "zero", mode="a", config={"max_inline_value_bytes": 0})
    with db0.transaction() as t:
        t.put(b"empty", b"")
        t.put(b"one", b"1")
    loc = {e.key: e.location for e in db0.entries()}
    assert loc[b"empty"] is None and loc[b"one"] is not None
    assert db0[b"empty"] == b""


def test_target_data_file_size_and_padding(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a", config={"target_data_file_size": 1000, "max_inline_value_bytes": 0})
    with db.transaction() as t:
        for i in range(10):
            t.put(b"k%d" % i, b"v" * 300)
    sizes = sorted(p.stat().st_size for p in data_files(tmp_path))
    assert sizes.count(1200) == 2  # four 300-byte values reach the target
    assert_verified(tmp_path)
    big = ocdbt_py.open(tmp_path / "big", mode="a")
    big.put(b"big", os.urandom((4 << 20) + 1))
    (f,) = data_files(tmp_path / "big")
    assert f.stat().st_size % 4096 == 0 and f.stat().st_size > (4 << 20)
    big.put(b"small", b"s" * 500)
    assert any(p.stat().st_size % 4096 for p in data_files(tmp_path / "big"))


def test_data_file_prefixes(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a", config={
        "value_data_prefix": "v/", "btree_node_data_prefix": "n/x-", "version_tree_node_data_prefix": "",
        "version_tree_arity_log2": 1, "max_inline_value_bytes": 1})
    for i in range(5):
        db.put(b"k%d" % i, b"value %d" % i)
    names = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert any(n.startswith("v/") for n in names) and any(n.startswith("n/x-") for n in names)
    assert any(len(n) == 32 for n in names)  # version nodes at the root, no prefix
    assert_verified(tmp_path)


def test_large_values_are_not_copied(tmp_path: Path) -> None:
    value = os.urandom(48 << 20)
    db = ocdbt_py.open(tmp_path, mode="a")
    tracemalloc.start()
    try:
        db.put(b"big", value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (4 << 20), f"committing a 48 MiB value allocated {peak} bytes"
    assert db.get(b"big") == value
    # a binary stream is read in chunks and never joined
    db.put(b"streamed", io.BytesIO(value))
    assert db.get(b"streamed") == value
    view = memoryview(bytearray(b"abc" * 100))
    db.put(b"view", view)
    assert db[b"view"] == b"abc" * 100


def test_memory_store_backend() -> None:
    kv = MemoryStore()
    db = ocdbt_py.open(kv, mode="a", config={"manifest_kind": "numbered"})
    for i in range(140):
        db.put(b"k%d" % (i % 10), b"%d" % i)
    numbered = [k for k in kv.list("manifest.0")]
    assert len(numbered) == 129 and numbered[-1] == f"manifest.{141:016x}"
    assert ocdbt_py.open(kv).get(b"k9") == b"139"
    assert ocdbt_py.open(kv, version=50).get(b"k7") == b"47"


@pytest.mark.parametrize("arity", [1, 2, 3])
def test_version_tree_growth(tmp_path: Path, arity: int) -> None:
    db = ocdbt_py.open(tmp_path, mode="a", config={"version_tree_arity_log2": arity})
    for i in range(70):
        db.put(b"k", b"%d" % i)
    assert [v.generation for v in db.versions()] == list(range(1, 72))
    for g in (1, 2, 17, 33, 64, 65, 70, 71):
        assert ocdbt_py.open(tmp_path, version=g).get(b"k") == (None if g == 1 else b"%d" % (g - 2))
    m = db.manifest
    assert 1 <= len(m.versions) <= 1 << arity
    assert_verified(tmp_path)


def test_threads_share_one_store(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a")
    errors: list[BaseException] = []
    gens: list[int] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        try:
            for i in range(15):
                g = db.put(b"t%d/%d" % (n, i), b"v")
                with lock:
                    gens.append(g)
                assert db.get(b"t%d/%d" % (n, i)) == b"v"
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(gens)) == 60
    assert len(ocdbt_py.open(tmp_path)) == 60
    assert_verified(tmp_path)


def test_writer_recovers_after_failed_commit(tmp_path: Path) -> None:
    from ocdbt_py.testing.faults import FaultyStore, InjectedFault

    base = LocalStore(tmp_path)
    probe = FaultyStore(base, ops=["set_if"])
    db = ocdbt_py.open(probe, mode="a")
    db.put(b"a", b"1")
    probe.fail_at = len(probe.log)  # the next manifest write fails
    with pytest.raises(InjectedFault):
        db.put(b"b", b"2")
    assert db.get(b"b") is None
    db.put(b"c", b"3")
    assert dict(ocdbt_py.open(tmp_path).items()) == {b"a": b"1", b"c": b"3"}
    assert_verified(tmp_path)
