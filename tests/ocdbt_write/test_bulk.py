"""One-pass OCDBT databases (per-process and merged root): our reader and TensorStore read them."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

import ocdbt_py
from ocdbt_py.checkpoint.saving.layout_writer import orbax_config
from ocdbt_py.checkpoint.saving.merge import collect_children, rebase, write_root
from ocdbt_py.format.data_file_table import IndirectDataReference
from ocdbt_py.kvstore import LocalStore, MemoryStore, PrefixStore
from ocdbt_py.write.bulk import (
    DataFilePool,
    ValueSink,
    iter_entries,
    store_value,
    write_database,
)


def _values(n: int) -> dict[bytes, bytes]:
    return {f"k{i:05d}/{'x' * (i % 7)}".encode(): os.urandom((i * 37) % 3000) for i in range(n)}


def _write(kv: LocalStore | MemoryStore | PrefixStore, vals: dict[bytes, bytes], *, target: int = 1 << 20,
           node_bytes: int | None = None) -> None:
    pool = DataFilePool(kv, target_size=target)
    entries = {}
    for k, v in vals.items():
        sink = ValueSink(pool, 1024)
        for i in range(0, len(v), 700):  # streamed in pieces
            sink.write(v[i:i + 700])
        entries[k] = sink.finish()
    pool.close()
    cfg = orbax_config()
    if node_bytes is not None:
        cfg = dataclasses.replace(cfg, max_decoded_node_bytes=node_bytes)
    write_database(kv, entries, cfg, target_data_file_size=target)


def test_inline_threshold_and_streaming(tmp_path: Path) -> None:
    kv = LocalStore(str(tmp_path))
    pool = DataFilePool(kv, target_size=0)
    small = store_value(pool, 1024, b"a" * 1024)
    big = store_value(pool, 1024, b"b" * 1025)
    assert small == b"a" * 1024
    assert isinstance(big, IndirectDataReference) and big.length == 1025 and big.offset == 0
    sink = ValueSink(pool, 1024)
    for _ in range(100):
        sink.write(b"c" * 1000)
    ref = sink.finish()
    assert isinstance(ref, IndirectDataReference) and ref.offset == 1025 and ref.length == 100_000
    pool.close()
    assert len(pool.files_written) == 1 and pool.bytes_written == 101_025


def test_data_files_rotate_at_target_size(tmp_path: Path) -> None:
    kv = LocalStore(str(tmp_path))
    pool = DataFilePool(kv, target_size=5000)
    refs = [store_value(pool, 1024, bytes([i]) * 2000) for i in range(10)]
    pool.close()
    assert len({r.file for r in refs}) == 4  # 3 values per file (closed once >= 5000 bytes)
    for r in refs:
        data = (tmp_path / r.file.relative_path.decode()).read_bytes()[r.offset:r.offset + r.length]
        assert len(set(data)) == 1


@pytest.mark.parametrize("node_bytes", [None, 4096])
def test_database_round_trip(tmp_path: Path, node_bytes: int | None) -> None:
    vals = _values(2000)
    _write(LocalStore(str(tmp_path)), vals, node_bytes=node_bytes)
    db = ocdbt_py.open(tmp_path)
    assert [v.generation for v in db.versions()] == [1]
    assert dict(db.items()) == dict(sorted(vals.items()))
    if node_bytes is not None:
        assert db.info()["root_height"] >= 1  # interior nodes were needed
    ts = pytest.importorskip("tensorstore")
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{tmp_path}/"}).result()
    keys = sorted(vals)
    assert sorted(bytes(k) for k in kv.list().result()) == keys
    for k in keys[::97]:
        assert kv.read(k).result().value == vals[k]


def test_merged_root_by_reference(tmp_path: Path) -> None:
    item = LocalStore(str(tmp_path))
    a = {b"a/" + k: v for k, v in list(_values(300).items())}
    b = {b"b/" + k: v for k, v in list(_values(200).items())}
    _write(PrefixStore(item, "ocdbt.process_0"), a)
    _write(PrefixStore(item, "ocdbt.process_1"), b)
    entries = collect_children(item, 3)  # process 2 wrote nothing
    write_root(item, entries, target_data_file_size=1 << 20)
    root = ocdbt_py.open(tmp_path)
    assert dict(root.items()) == dict(sorted({**a, **b}.items()))
    bases = {e.location.file.base_path for e in root.entries() if e.location is not None}
    assert bases == {b"ocdbt.process_0/", b"ocdbt.process_1/"}
    root_files = list((tmp_path / "d").iterdir())
    inline = sum(len(v) for v in {**a, **b}.values() if len(v) <= 1024)
    # only B-tree nodes (holding the small inline values), none of the large values
    assert sum(f.stat().st_size for f in root_files) < inline + (32 << 10)
    ts = pytest.importorskip("tensorstore")
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{tmp_path}/"}).result()
    some = sorted(a)[5]
    assert kv.read(some).result().value == a[some]


def test_iter_entries_and_rebase() -> None:
    kv = MemoryStore()
    vals = _values(50)
    _write(kv, vals)
    got = dict(iter_entries(kv))
    assert set(got) == set(vals)
    rebased = rebase(got, 3)
    for k, v in rebased.items():
        if isinstance(v, IndirectDataReference):
            assert v.file.base_path == b"ocdbt.process_3/"
        else:
            assert v == vals[k]


def test_conflicting_children_are_an_error(tmp_path: Path) -> None:
    item = LocalStore(str(tmp_path))
    _write(PrefixStore(item, "ocdbt.process_0"), {b"x/0": b"1"})
    _write(PrefixStore(item, "ocdbt.process_1"), {b"x/0": b"2"})
    with pytest.raises(ocdbt_py.CorruptionError, match="written by processes 0 and 1"):
        collect_children(item, 2)
