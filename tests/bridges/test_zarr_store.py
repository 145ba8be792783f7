"""zarr-python's own store test suite (``zarr.testing.store.StoreTests``) against OcdbtZarrStore,
plus what the suite does not cover: version time travel, grouped commits, an empty directory,
byte ranges through the coalescing reader, zarr-python arrays end to end."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest  # noqa: E402
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype  # noqa: E402
from zarr.testing.store import StoreTests  # noqa: E402

import ocdbt_py  # noqa: E402
from ocdbt_py.bridges import OcdbtZarrStore  # noqa: E402


class TestOcdbtZarrStore(StoreTests[OcdbtZarrStore, cpu.Buffer]):
    """The whole suite; its sync-method tests run too (the store implements them)."""

    store_cls = OcdbtZarrStore
    buffer_cls = cpu.Buffer

    async def set(self, store: OcdbtZarrStore, key: str, value: Buffer) -> None:
        # Through the wrapped ocdbt_py handle, not the store's own methods.
        store.db.put(key.encode(), value.to_bytes())

    async def get(self, store: OcdbtZarrStore, key: str) -> Buffer:
        data = store.db.get(key.encode())
        assert data is not None, key
        return self.buffer_cls.from_bytes(data)

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"url": str(tmp_path / "db"), "read_only": False}

    def test_store_repr(self, store: OcdbtZarrStore) -> None:
        assert repr(store) == f"OcdbtZarrStore({store.url!r}, read_only=False)"

    def test_store_supports_writes(self, store: OcdbtZarrStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: OcdbtZarrStore) -> None:
        assert store.supports_listing


# -- beyond the suite ------------------------------------------------------------------------

def _buf(b: bytes) -> Buffer:
    return cpu.Buffer.from_bytes(b)


async def test_empty_directory_is_an_empty_database(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for ro in (True, False):
        store = await OcdbtZarrStore.open(str(tmp_path / "empty"), read_only=ro)
        assert await store.is_empty("")
        assert await store.get("zarr.json", default_buffer_prototype()) is None
        assert [k async for k in store.list()] == []
    w = await OcdbtZarrStore.open(str(tmp_path / "empty"))
    await w.set("a", _buf(b"1"))
    assert ocdbt_py.open(str(tmp_path / "empty")).get(b"a") == b"1"


async def test_concurrent_sets_are_grouped_into_few_commits(tmp_path: Path) -> None:
    store = await OcdbtZarrStore.open(str(tmp_path / "db"))
    await store.set("first", _buf(b"x"))
    g0 = store.db.generation
    await asyncio.gather(*(store.set(f"c/{i}", _buf(bytes([i]) * 100)) for i in range(64)))
    g1 = store.db.generation
    assert 1 <= g1 - g0 < 64  # grouped: fewer commits than writes
    db = ocdbt_py.open(str(tmp_path / "db"))
    assert all(db.get(f"c/{i}".encode()) == bytes([i]) * 100 for i in range(64))
    await store._set_many([(f"m/{i}", _buf(b"m")) for i in range(10)])
    assert store.db.generation == g1 + 1  # one commit
    await store.delete_dir("m")
    assert store.db.generation == g1 + 2
    assert [k async for k in store.list_prefix("m/")] == []


async def test_version_time_travel_is_read_only(tmp_path: Path) -> None:
    url = str(tmp_path / "db")
    store = await OcdbtZarrStore.open(url)
    await store.set("k", _buf(b"old"))
    gen = store.db.generation
    await store.set("k", _buf(b"new"))
    old = OcdbtZarrStore(url, version=gen)
    assert old.read_only
    assert (await old.get("k", default_buffer_prototype())).to_bytes() == b"old"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="read-only"):
        await old.set("k", _buf(b"x"))
    with pytest.raises(ValueError):
        old.with_read_only(False)
    assert pickle.loads(pickle.dumps(old)) == old
    assert old != OcdbtZarrStore(url, read_only=True)


async def test_byte_ranges_and_partial_values(tmp_path: Path) -> None:
    url = str(tmp_path / "db")
    # Values above the inline limit live in data files: ranges go through the coalescing reader.
    data = bytes(range(256)) * 64
    store = await OcdbtZarrStore.open(url)
    await store._set_many([("big", _buf(data)), ("small", _buf(b"abcdef"))])
    assert next(store.db.entries(b"big")).location is not None
    proto = default_buffer_prototype()
    cases = [(RangeByteRequest(10, 5000), data[10:5000]), (OffsetByteRequest(16000), data[16000:]),
             (SuffixByteRequest(7), data[-7:]), (SuffixByteRequest(0), b""), (None, data)]
    for req, want in cases:
        got = await store.get("big", proto, byte_range=req)
        assert got is not None and got.to_bytes() == want, req
    got_many = await store.get_partial_values(
        proto, [("big", RangeByteRequest(0, 3)), ("missing", None), ("small", SuffixByteRequest(2)),
                ("big", OffsetByteRequest(len(data) - 1))])
    assert [None if g is None else g.to_bytes() for g in got_many] == [data[:3], None, b"ef", data[-1:]]
    assert await store.getsize("big") == len(data)
    assert await store.getsize_prefix("") == len(data) + 6


def test_zarr_python_arrays_round_trip_and_pickle(tmp_path: Path) -> None:
    url = str(tmp_path / "db")
    store = OcdbtZarrStore(url)
    a = zarr.create_array(store, name="g/a", shape=(40, 30), chunks=(10, 10), shards=(20, 30), dtype="int32",
                          compressors=zarr.codecs.ZstdCodec(level=3))
    want = np.arange(1200, dtype="int32").reshape(40, 30)
    a[:] = want
    again = zarr.open_array(pickle.loads(pickle.dumps(OcdbtZarrStore(url, read_only=True))), path="g/a", mode="r")
    np.testing.assert_array_equal(again[:], want)
    np.testing.assert_array_equal(again[5:17, 3:29], want[5:17, 3:29])
    assert store.db.transaction() is not None
    assert sorted(zarr.open_group(OcdbtZarrStore(url, read_only=True), mode="r").keys()) == ["g"]


def test_sync_writes_from_many_threads_group_and_need_no_pool(tmp_path: Path) -> None:
    """set_sync/delete_sync commit on the calling thread when no commit runs (so callers on
    ocdbt-py's own io pool cannot starve it) and join a running commit otherwise."""
    from ocdbt_py import pools

    store = OcdbtZarrStore(str(tmp_path / "db"))
    store.set_sync("first", _buf(b"0"))
    g0 = store.db.generation
    n = 48
    list(pools.shared("io").map(lambda i: store.set_sync(f"k/{i}", _buf(str(i).encode())), range(n)))
    assert all(store.db.get(f"k/{i}".encode()) == str(i).encode() for i in range(n))
    assert 1 <= store.db.generation - g0 <= n
    store.delete_sync("k/0")
    assert store.get_sync("k/0") is None and store.get_sync("k/1") is not None


async def test_concurrent_gets_are_batched_and_each_gets_its_own_answer(tmp_path: Path) -> None:
    store = await OcdbtZarrStore.open(str(tmp_path / "db"))
    vals = {f"c/{i}": bytes([i]) * (200 + i) for i in range(30)}
    await store._set_many([(k, _buf(v)) for k, v in vals.items()])
    proto = default_buffer_prototype()
    reqs: list[tuple[str, Any]] = [(k, None) for k in vals] + [
        ("c/3", RangeByteRequest(5, 9)), ("missing", None), ("c/4", SuffixByteRequest(3)),
        ("c/5", OffsetByteRequest(200))]
    got = await asyncio.gather(*(store.get(k, proto, byte_range=r) for k, r in reqs))
    want = [*vals.values(), vals["c/3"][5:9], None, vals["c/4"][-3:], vals["c/5"][200:]]
    assert [None if g is None else g.to_bytes() for g in got] == want
    assert not store._pending and not store._batches
    # a malformed request fails alone, and the store keeps working
    with pytest.raises(TypeError):
        await asyncio.gather(store.get("c/1", proto), store.get("c/2", proto, byte_range=(0, 1)))  # type: ignore[arg-type]
    assert (await store.get("c/1", proto)).to_bytes() == vals["c/1"]  # type: ignore[union-attr]
