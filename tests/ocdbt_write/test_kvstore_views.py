"""Writable KvStore views: the store's (one commit per write) and a transaction's (one commit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ocdbt_py
from ocdbt_py.errors import ReadOnlyError
from tests.ocdbt_write.helpers import assert_verified


def test_transaction_list_merges_pending_changes(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a")
    with db.transaction() as t:
        for k in (b"a", b"b", b"c", b"d", b"e"):
            t.put(k, k)
    t = db.transaction()
    t.put(b"bb", b"new")
    t.delete(b"c")
    t.delete_range(b"d", b"e")
    t.put(b"z", b"z")
    t.delete(b"absent")
    assert list(t.list()) == [b"a", b"b", b"bb", b"e", b"z"]
    assert list(t.list(start=b"b", stop=b"e")) == [b"b", b"bb"]
    assert list(t.list(prefix=b"b")) == [b"b", b"bb"]
    t.delete_range()
    t.put(b"only", b"1")
    assert list(t.list()) == [b"only"]
    t.abort()


def test_store_kvstore_view_writes(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path, mode="a")
    kv = db.as_kvstore()
    assert not kv.read_only
    kv.set("x/1", b"one")
    kv.set("x/2", bytearray(b"two"))
    kv.delete("x/1")
    assert list(kv.list("x/")) == ["x/2"] and kv.get("x/2") == b"two"
    ro = ocdbt_py.open(tmp_path).as_kvstore()
    assert ro.read_only
    with pytest.raises(ReadOnlyError):
        ro.set("k", b"v")


def test_zarr_array_written_in_one_transaction(tmp_path: Path) -> None:
    zarr3 = pytest.importorskip("zarr3")
    db = ocdbt_py.open(tmp_path, mode="a")
    data = np.arange(12 * 10, dtype="<i4").reshape(12, 10)
    with db.transaction() as t:
        arr = zarr3.create(t.as_kvstore(), "arr", shape=data.shape, dtype="int32", chunks=(5, 4),
                           compressor="zstd")
        arr[...] = data
    # the whole array (metadata and every chunk) is one commit after the empty generation 1
    assert [v.generation for v in db.versions()] == [1, 2] == [1, t.generation]
    assert_verified(tmp_path)
    back = zarr3.open(ocdbt_py.open(tmp_path), "arr")
    assert np.array_equal(back[...], data)
    ts = pytest.importorskip("tensorstore")
    spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{tmp_path}/", "path": "arr/"}}
    assert np.array_equal(ts.open(spec).result().read().result(), data)
