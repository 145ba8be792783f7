"""Array API: create/open/read/write, chunk fetching, fill values, groups, errors."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import pytest

import zarr3
from ocdbt_py.errors import CorruptionError, ReadOnlyError
from ocdbt_py.kvstore import KvStore, LocalStore, MemoryStore, ReadRequest
from ocdbt_py.kvstore.base import normalize_request
from zarr3.errors import ArrayNotFoundError, ChunkNotFoundError, MetadataError, NodeExistsError


class CountingStore(MemoryStore):
    """A MemoryStore that records every read request (key, byte range)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, object]] = []
        self._rl = threading.Lock()

    def get(self, key: str, byte_range=None):  # type: ignore[no-untyped-def]
        with self._rl:
            self.reads.append((key, byte_range))
        return super().get(key, byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        return [self.get(*normalize_request(r)) for r in requests]

    def chunk_reads(self) -> list[tuple[str, object]]:
        return [r for r in self.reads if not r[0].rsplit("/", 1)[-1].startswith((".z", "zarr.json"))]


def _data(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    return (np.arange(int(np.prod(shape))) % 251).reshape(shape).astype(dtype)


SELECTIONS = [
    Ellipsis,
    (slice(None),),
    0,
    -1,
    (3, 4),
    (slice(1, 6), slice(2, 9)),
    (slice(None, None, 2), slice(1, None, 3)),
    (slice(None, None, -1), slice(None)),
    (slice(8, 1, -3), slice(None, None, -2)),
    (Ellipsis, 5),
    (None, slice(2, 4), None, 1),
    (slice(3, 3), slice(None)),
    (slice(100, 200), slice(None)),
    (slice(-3, None), slice(-4, -1)),
    (np.int64(2), slice(None, None, 7)),
]


@pytest.mark.parametrize("fmt, sharded", [(2, False), (3, False), (3, True)])
def test_selections_match_numpy(fmt: int, sharded: bool) -> None:
    store = MemoryStore()
    ref = _data((9, 11))
    kwargs = {"shards": (6, 4)} if sharded else {}
    a = zarr3.create(
        store,
        "a",
        shape=(9, 11),
        dtype="float32",
        chunks=(3, 2),
        zarr_format=fmt,
        compressor="zstd" if fmt == 3 else {"id": "zstd"},
        **kwargs,
    )
    a[...] = ref
    b = zarr3.open(store, "a")
    for sel in SELECTIONS:
        expected = ref[sel]
        got = b[sel]
        assert got.shape == expected.shape, sel
        np.testing.assert_array_equal(got, expected, err_msg=str(sel))
    np.testing.assert_array_equal(np.asarray(b), ref)
    assert len(b) == 9


def test_read_into_out() -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(5, 6), dtype="int16", chunks=(2, 4))
    ref = _data((5, 6), "int16")
    a[...] = ref
    out = np.zeros((3, 6), np.int16)
    assert a.read((slice(0, 5, 2), slice(None)), out=out) is out
    np.testing.assert_array_equal(out, ref[::2])
    out2 = np.zeros(6, np.int16)
    a.read(4, out=out2)
    np.testing.assert_array_equal(out2, ref[4])
    with pytest.raises(ValueError):
        a.read(out=np.zeros((5, 6), np.int32))
    with pytest.raises(ValueError):
        a.read(out=np.zeros((5, 5), np.int16))


def test_only_touched_chunks_are_fetched() -> None:
    store = CountingStore()
    a = zarr3.create(store, shape=(100, 100), dtype="uint8", chunks=(10, 10))
    a[...] = 1
    store.reads.clear()
    a[15:25, 95]
    assert sorted(k for k, _ in store.chunk_reads()) == ["c/1/9", "c/2/9"]
    store.reads.clear()
    a[::50, ::50]
    assert sorted(k for k, _ in store.chunk_reads()) == ["c/0/0", "c/0/5", "c/5/0", "c/5/5"]


def test_sharded_reads_fetch_index_then_needed_inner_chunks_only() -> None:
    store = CountingStore()
    a = zarr3.create(store, shape=(16, 16), dtype="float32", chunks=(2, 2), shards=(8, 8), compressor="zstd")
    ref = _data((16, 16))
    a[...] = ref
    store.reads.clear()
    np.testing.assert_array_equal(a[3, 5:7], ref[3, 5:7])
    reads = store.chunk_reads()
    # shard c/0/0: the 68-byte suffix index, then the two inner chunks (1,2) and (1,3)
    assert reads[0] == ("c/0/0", (-(16 * 16 + 4), None))
    ranged = reads[1:]
    assert len(ranged) == 2 and all(k == "c/0/0" and r is not None and r[1] is not None for k, r in ranged)
    shard = store.get("c/0/0")
    assert shard is not None
    total = sum(r[1] - r[0] for _, r in ranged)  # type: ignore[index, operator]
    assert total < len(shard) / 8


def test_full_shard_read_is_one_request() -> None:
    store = CountingStore()
    a = zarr3.create(store, shape=(16, 16), dtype="float32", chunks=(2, 2), shards=(8, 8))
    a[...] = _data((16, 16))
    store.reads.clear()
    a[0:8, 8:16]
    assert store.chunk_reads() == [("c/0/1", None)]
    store.reads.clear()
    a[...]
    assert sorted(store.chunk_reads()) == [(f"c/{i}/{j}", None) for i in range(2) for j in range(2)]


def test_edge_shards_count_only_in_bounds_inner_chunks() -> None:
    store = CountingStore()
    a = zarr3.create(store, shape=(10, 10), dtype="int32", chunks=(2, 2), shards=(8, 8), fill_value=-1)
    ref = _data((10, 10), "int32")
    a[...] = ref
    store.reads.clear()
    np.testing.assert_array_equal(a[8:10, 0:10], ref[8:10])
    assert sorted(store.chunk_reads()) == [("c/1/0", None), ("c/1/1", None)]
    np.testing.assert_array_equal(zarr3.open(store)[...], ref)


@pytest.mark.parametrize("fmt", [2, 3])
def test_missing_chunks_read_as_fill_or_error(fmt: int) -> None:
    store = MemoryStore()
    fill = 7 if fmt == 3 else None
    a = zarr3.create(store, "x", shape=(4, 4), dtype="int32", chunks=(2, 2), zarr_format=fmt, fill_value=fill)
    a[0:2, 0:2] = 1
    expected = np.full((4, 4), 7 if fmt == 3 else 0, np.int32)
    expected[0:2, 0:2] = 1
    np.testing.assert_array_equal(zarr3.open(store, "x")[...], expected)
    strict = zarr3.open(store, "x", fill_missing=False)
    np.testing.assert_array_equal(strict[0:2, 0:2], 1)
    with pytest.raises(ChunkNotFoundError) as ei:
        strict[...]
    assert ei.value.key.endswith(("c/0/1", "0.1"))


def test_missing_inner_chunk_with_fill_missing_false() -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(4, 4), dtype="int32", chunks=(2, 2), shards=(4, 4))
    a[0:2, 0:2] = 5  # other inner chunks stay fill (0) and are not stored
    np.testing.assert_array_equal(zarr3.open(store)[2:, 2:], 0)
    with pytest.raises(ChunkNotFoundError):
        zarr3.open(store, fill_missing=False)[...]
    with pytest.raises(ChunkNotFoundError):
        zarr3.open(store, fill_missing=False)[3, 3]
    assert zarr3.open(store, fill_missing=False)[1, 1] == 5


def test_chunks_equal_to_fill_are_not_stored() -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(4, 4), dtype="float32", chunks=(2, 2), fill_value=np.nan)
    data = np.full((4, 4), np.nan, np.float32)
    data[0, 0] = 1
    a[...] = data
    assert sorted(store.list()) == ["c/0/0", "zarr.json"]
    a[0, 0] = np.nan  # now fill again: deleted
    assert sorted(store.list()) == ["zarr.json"]
    b = zarr3.open(store, mode="r+", write_empty_chunks=True)
    b[...] = np.nan
    assert len([k for k in store.list() if k.startswith("c/")]) == 4
    # -0.0 is not the fill value 0.0 (bitwise comparison, like TensorStore)
    s2 = MemoryStore()
    c = zarr3.create(s2, shape=(2,), dtype="float32", chunks=(2,))
    c[...] = -0.0
    assert "c/0" in list(s2.list())


def test_v2_null_fill_stores_every_chunk() -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(4,), dtype="<f4", chunks=(2,), zarr_format=2)
    a[...] = 0
    assert sorted(store.list()) == [".zarray", "0", "1"]
    assert a.fill_value is None


def test_sharded_write_empty_and_partial() -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(6, 6), dtype="uint8", chunks=(2, 2), shards=(4, 4))
    a[...] = 0
    assert sorted(store.list()) == ["zarr.json"]
    a[0, 0] = 1
    shard = store.get("c/0/0")
    assert shard is not None
    index = np.frombuffer(shard[-68:-4], "<u8").reshape(4, 2)
    # only inner chunk (0,0) is stored, like TensorStore's partial-write probe
    assert index[0].tolist() == [0, 4] and (index[1:] == 2**64 - 1).all()
    a[5, 5] = 9
    ref = np.zeros((6, 6), np.uint8)
    ref[0, 0] = 1
    ref[5, 5] = 9
    np.testing.assert_array_equal(zarr3.open(store)[...], ref)
    a[0, 0] = 0
    assert "c/0/0" not in list(store.list())


def test_partial_writes_read_modify_write() -> None:
    rng = np.random.default_rng(3)
    for kwargs in ({}, {"shards": (4, 6)}, {"zarr_format": 2, "order": "F"}):
        store = MemoryStore()
        a = zarr3.create(store, shape=(9, 13), dtype="int64", chunks=(2, 3), **kwargs)  # type: ignore[arg-type]
        ref = np.zeros((9, 13), np.int64)
        for _ in range(25):
            r0, r1 = sorted(rng.integers(0, 10, 2))
            c0, c1 = sorted(rng.integers(0, 14, 2))
            step = int(rng.integers(1, 3))
            val = rng.integers(-100, 100, size=ref[r0:r1:step, c0:c1].shape)
            a[r0:r1:step, c0:c1] = val
            ref[r0:r1:step, c0:c1] = val
        np.testing.assert_array_equal(zarr3.open(store)[...], ref)


def test_scalar_broadcast_and_casting_writes() -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(3, 4), dtype="bfloat16", chunks=(2, 2))
    a[...] = 1.5
    a[1] = [1, 2, 3, 4]
    a[0, ::-1] = np.arange(4.0)
    ref = np.full((3, 4), 1.5, ml_dtypes.bfloat16)
    ref[1] = [1, 2, 3, 4]
    ref[0, ::-1] = np.arange(4.0)
    np.testing.assert_array_equal(a[...].astype(np.float32), ref.astype(np.float32))
    with pytest.raises(ValueError, match="broadcast"):
        a[0] = np.zeros(5)


def test_zero_dimensional_arrays() -> None:
    store = MemoryStore()
    a = zarr3.create(store, "s3", shape=(), dtype="float64")
    a[...] = 3.5
    assert "s3/c" in list(store.list())
    assert zarr3.open(store, "s3")[()] == 3.5
    b = zarr3.create(store, "s2", shape=(), dtype="<i8", zarr_format=2)
    b[()] = 7
    assert "s2/0" in list(store.list())
    assert zarr3.open(store, "s2")[...] == 7
    assert zarr3.open(store, "s2")[...].shape == ()


@pytest.mark.parametrize(
    "encoding, expected",
    [
        ({"name": "default"}, "c/1/0"),
        ({"name": "default", "configuration": {"separator": "."}}, "c.1.0"),
        ({"name": "v2"}, "1.0"),
        ({"name": "v2", "configuration": {"separator": "/"}}, "1/0"),
    ],
)
def test_chunk_key_encodings(encoding: dict, expected: str) -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(4, 2), dtype="uint8", chunks=(2, 2), chunk_key_encoding=encoding)
    a[2:4] = 1
    assert [k for k in store.list() if k != "zarr.json"] == [expected]
    np.testing.assert_array_equal(zarr3.open(store)[...], [[0, 0], [0, 0], [1, 1], [1, 1]])


def test_v2_dimension_separator_order_and_endianness() -> None:
    store = MemoryStore()
    ref = _data((5, 3), ">i2")
    a = zarr3.create(store, shape=(5, 3), dtype=">i2", chunks=(2, 3), zarr_format=2, order="F", dimension_separator="/")
    a[...] = ref
    assert b'"dtype":">i2"' in (store.get(".zarray") or b"")
    assert b'"order":"F"' in (store.get(".zarray") or b"")
    chunk = store.get("1/0")
    assert chunk is not None
    # Fortran-order, big-endian bytes of rows 2..3
    assert chunk == np.asfortranarray(ref[2:4].astype(">i2")).tobytes(order="F")
    b = zarr3.open(store)
    assert b.dtype == np.dtype("int16")
    np.testing.assert_array_equal(b[...], ref)


def test_corrupt_chunk_size_is_an_error_not_a_reshape() -> None:
    store = MemoryStore()
    a = zarr3.create(store, shape=(4, 4), dtype="float32", chunks=(2, 2))
    a[...] = 1
    store.set("c/0/1", b"\0" * 12)
    with pytest.raises(CorruptionError):
        zarr3.open(store)[...]
    np.testing.assert_array_equal(zarr3.open(store)[2:, :], 1)


def test_shard_index_pointing_past_shard_via_ranges() -> None:
    import crc32c

    store = MemoryStore()
    a = zarr3.create(store, shape=(8, 8), dtype="uint8", chunks=(2, 2), shards=(8, 8))
    a[...] = _data((8, 8), "uint8")
    shard = bytearray(store.get("c/0/0") or b"")
    nidx = 16 * 16
    index = np.frombuffer(bytes(shard[-nidx - 4 : -4]), "<u8").copy().reshape(-1, 2)
    index[5, 0] = len(shard) + 100
    shard[-nidx - 4 : -4] = index.tobytes()
    shard[-4:] = crc32c.crc32c(bytes(shard[-nidx - 4 : -4])).to_bytes(4, "little")
    store.set("c/0/0", bytes(shard))
    b = zarr3.open(store)
    with pytest.raises(CorruptionError, match="past|points"):
        b[2, 2]  # inner chunk 5 = (1, 1): read by byte range
    with pytest.raises(CorruptionError, match="past"):
        b[...]  # whole shard read
    np.testing.assert_array_equal(b[0:2, 0:2], _data((8, 8), "uint8")[0:2, 0:2])


def test_modes_and_existence() -> None:
    store = MemoryStore()
    with pytest.raises(ArrayNotFoundError):
        zarr3.open(store, "nothing")
    zarr3.create(store, "a", shape=(2,), dtype="int8")
    with pytest.raises(NodeExistsError):
        zarr3.create(store, "a", shape=(2,), dtype="int8")
    a = zarr3.create(store, "a", shape=(3,), dtype="int16", overwrite=True)
    assert a.shape == (3,)
    r = zarr3.open(store, "a")
    assert r.read_only
    with pytest.raises(ReadOnlyError):
        r[0] = 1
    with pytest.raises(ValueError):
        zarr3.open(store, "a", mode="w")
    w = zarr3.open(store, "a", mode="r+")
    w[...] = [1, 2, 3]
    np.testing.assert_array_equal(zarr3.open(store, "a")[...], [1, 2, 3])


def test_bad_indices() -> None:
    a = zarr3.create(MemoryStore(), shape=(3, 4), dtype="int8")
    for sel in [
        (0, 0, 0),
        3,
        -4,
        (slice(None), 4),
        [0, 1],
        np.array([True, False, True]),
        (..., ...),
        "x",
        slice(0.5, 2),
    ]:
        with pytest.raises(IndexError):
            a[sel]


def test_attributes_and_properties() -> None:
    store = MemoryStore()
    a = zarr3.create(
        store,
        "x",
        shape=(6, 8),
        dtype="float32",
        chunks=(2, 2),
        shards=(2, 4),
        attributes={"units": "m"},
        dimension_names=["row", None],
        fill_value=1.5,
    )
    assert a.chunks == (2, 2) and a.shards == (2, 4)
    assert a.fill_value == np.float32(1.5)
    assert a.attrs == {"units": "m"}
    assert a.dimension_names == ("row", None)
    assert a.zarr_format == 3 and a.ndim == 2 and a.size == 48 and a.nbytes == 192
    assert a.update_attributes({"b": 2}) == {"units": "m", "b": 2}
    assert zarr3.open(store, "x").attrs == {"units": "m", "b": 2}
    assert "x/" in repr(a)
    v2 = zarr3.create(store, "y", shape=(2,), dtype="int8", zarr_format=2, attributes={"a": 1})
    assert zarr3.open(store, "y").attrs == {"a": 1}
    v2.update_attributes({"c": [1]})
    assert zarr3.open(store, "y").attrs == {"a": 1, "c": [1]}


def test_groups() -> None:
    store = MemoryStore()
    for fmt in (2, 3):
        g = zarr3.create_group(store, f"g{fmt}", zarr_format=fmt, attributes={"k": fmt})
        arr = g.create_array("arr", shape=(3,), dtype="int32")
        arr[...] = [1, 2, 3]
        g.create_group("sub")
        g2 = zarr3.open_group(store, f"g{fmt}")
        assert g2.attrs == {"k": fmt} and g2.zarr_format == fmt
        assert g2.keys() == ["arr", "sub"] == list(g2) and len(g2) == 2
        assert [(n, type(m).__name__) for n, m in g2.members()] == [("arr", "Array"), ("sub", "Group")]
        assert g2.array_keys() == ["arr"] and g2.group_keys() == ["sub"]
        child = g2["arr"]
        assert isinstance(child, zarr3.Array)
        np.testing.assert_array_equal(child[...], [1, 2, 3])
        assert isinstance(g2["sub"], zarr3.Group)
        assert "nope" not in g2
        with pytest.raises(MetadataError):
            zarr3.open(store, f"g{fmt}")
        with pytest.raises(MetadataError):
            zarr3.open_group(store, f"g{fmt}/arr")


def test_local_path_and_fsspec_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = _data((5, 7), "uint16")
    a = zarr3.create(str(tmp_path / "arr"), shape=(5, 7), dtype="uint16", chunks=(2, 3), compressor="gzip")
    a[...] = ref
    assert (tmp_path / "arr" / "c" / "2" / "2").exists()
    np.testing.assert_array_equal(zarr3.open(str(tmp_path), "arr")[...], ref)
    np.testing.assert_array_equal(zarr3.open(LocalStore(tmp_path), "arr")[...], ref)
    np.testing.assert_array_equal(zarr3.open("file://" + str(tmp_path / "arr"))[...], ref)
    url = f"memory://zarr3-test-{uuid.uuid4().hex}/arr"
    m = zarr3.create(url, shape=(5, 7), dtype="uint16", chunks=(2, 3))
    m[...] = ref
    np.testing.assert_array_equal(zarr3.open(url)[1:4, ::2], ref[1:4, ::2])


def test_ocdbt_like_store_uses_as_kvstore() -> None:
    inner = MemoryStore()
    zarr3.create(inner, "p.x", shape=(3,), dtype="int8")[...] = [4, 5, 6]

    class FakeDb:
        def as_kvstore(self) -> KvStore:
            return inner

    np.testing.assert_array_equal(zarr3.open(FakeDb(), "p.x")[...], [4, 5, 6])


def test_many_chunks_parallel_read_write(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    shape = (64, 48)
    ref = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    before = zarr3.num_threads()
    for threads in (1, 3):
        zarr3.set_num_threads(threads)
        try:
            a = zarr3.create(store, f"t{threads}", shape=shape, dtype="float32", chunks=(5, 7), compressor="zstd")
            a[...] = ref
            np.testing.assert_array_equal(zarr3.open(store, f"t{threads}")[...], ref)
            np.testing.assert_array_equal(zarr3.open(store, f"t{threads}")[3:60:4, ::-5], ref[3:60:4, ::-5])
        finally:
            zarr3.set_num_threads(before)


def test_all_chunk_combinations_of_small_grid() -> None:
    """Every sub-rectangle of a 2-D grid with edge chunks reads back exactly."""
    store = MemoryStore()
    ref = _data((5, 4), "int16")
    a = zarr3.create(store, shape=(5, 4), dtype="int16", chunks=(2, 3), shards=(4, 3))
    a[...] = ref
    b = zarr3.open(store)
    for r0, r1, c0, c1 in itertools.product(range(6), range(6), range(5), range(5)):
        if r0 <= r1 and c0 <= c1:
            np.testing.assert_array_equal(b[r0:r1, c0:c1], ref[r0:r1, c0:c1])


def test_v2_structured_dtype_round_trip() -> None:
    store = MemoryStore()
    dt = np.dtype([("a", "<i4"), ("b", ">f8", (2,)), ("c", "|b1"), ("d", "bfloat16")])
    fill = np.zeros((), dt)
    fill["a"] = -1
    a = zarr3.create(store, shape=(5, 3), dtype=dt, chunks=(2, 2), zarr_format=2, fill_value=fill, order="F")
    meta = store.get(".zarray") or b""
    assert b'"dtype":[["a","<i4"],["b",">f8",[2]],["c","|b1"],["d","bfloat16"]]' in meta
    x = np.zeros((5, 3), a.dtype)
    x["a"] = np.arange(15).reshape(5, 3)
    x["b"][..., 1] = 2.5
    x["c"][::2] = True
    x["d"] = 1.5
    a[1:4, :] = x[1:4]
    expected = np.full((5, 3), fill[()], a.dtype)
    expected[1:4] = x[1:4]
    b = zarr3.open(store)
    assert b.dtype.names == ("a", "b", "c", "d")
    assert b[...].tobytes() == expected.tobytes()
    assert b[::-2, 1].tobytes() == expected[::-2, 1].tobytes()
    assert b.fill_value["a"] == -1
    with pytest.raises(MetadataError):
        zarr3.create(MemoryStore(), shape=(2,), dtype=dt)  # v3 has no structured types
    with pytest.raises(MetadataError):
        zarr3.open(
            MemoryStore(
                {
                    ".zarray": (
                        b'{"zarr_format":2,"shape":[2],"chunks":[2],"dtype":[["a","<i4"],["a","<i4"]],'
                        b'"compressor":null,"fill_value":null,"filters":null,"order":"C"}'
                    )
                }
            )
        )


def test_local_fetcher_matches_localstore(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ocdbt_py.kvstore import PrefixStore
    from zarr3.engine.executor import LocalFetcher

    store = LocalStore(tmp_path)
    store.set("p/q/a", bytes(range(200)))
    store.set("p/q/big", bytes(5000))
    (tmp_path / "p" / "q" / "dir").mkdir()
    view = PrefixStore(store, "p/q")
    fetch = LocalFetcher.for_store(view, 1024)
    assert fetch is not None
    for key, rng in [
        ("a", None),
        ("a", (10, 20)),
        ("a", (-5, None)),
        ("a", (150, 400)),
        ("a", (300, 400)),
        ("missing", None),
        ("dir", None),
        ("big", None),
        ("big", (4000, 4100)),
    ]:
        got = fetch(key, rng)
        want = view.get(key, rng)
        assert (None if got is None else bytes(got)) == want, (key, rng)
    assert LocalFetcher.for_store(MemoryStore(), 10) is None


@pytest.mark.parametrize("sharded", [False, True])
def test_local_files_partial_and_full_reads(tmp_path, sharded: bool) -> None:  # type: ignore[no-untyped-def]
    ref = np.random.default_rng(1).standard_normal((40, 30)).astype(np.float32)
    kw = {"shards": (20, 30)} if sharded else {}
    a = zarr3.create(str(tmp_path / "x"), shape=(40, 30), dtype="float32", chunks=(5, 6), compressor="zstd", **kw)
    a[...] = ref
    b = zarr3.open(str(tmp_path / "x"))
    np.testing.assert_array_equal(b[...], ref)
    np.testing.assert_array_equal(b[3:33:4, ::-7], ref[3:33:4, ::-7])
    np.testing.assert_array_equal(b[17], ref[17])


def test_no_fill_value_means_zero_bits() -> None:
    """v2 ``fill_value: null`` reads and pads with zero *bits* (float8_e8m0fnu has no 0.0)."""
    store = MemoryStore()
    a = zarr3.create(store, shape=(3, 3), dtype="float8_e8m0fnu", chunks=(2, 2), zarr_format=2)
    a[0, 0] = 4.0
    got = zarr3.open(store)[...].view(np.uint8)
    assert got[0, 0] == 0x81 and (got.reshape(-1)[1:] == 0).all()
    edge = store.get("1.1")
    assert edge is None
    a[2, 2] = 2.0
    assert store.get("1.1") == bytes([0x80, 0, 0, 0])


class FailingStore(MemoryStore):
    """Fails reads or writes of chunk keys containing ``bad``."""

    def __init__(self, bad: str, on: str) -> None:
        super().__init__()
        self.bad, self.on = bad, on

    def get(self, key, byte_range=None):  # type: ignore[no-untyped-def]
        if self.on == "get" and self.bad in key:
            raise OSError(f"boom reading {key}")
        return super().get(key, byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        return [self.get(*normalize_request(r)) for r in requests]

    def set(self, key, value):  # type: ignore[no-untyped-def]
        if self.on == "set" and self.bad in key:
            raise OSError(f"boom writing {key}")
        super().set(key, value)


@pytest.mark.parametrize("sharded", [False, True])
def test_storage_errors_propagate(sharded: bool) -> None:
    kw = {"shards": (4, 4)} if sharded else {}
    ref = _data((8, 8), "int32") + 1
    w = FailingStore("c/1/1", "set")
    a = zarr3.create(w, shape=(8, 8), dtype="int32", chunks=(2, 2) if sharded else (4, 4), **kw)
    with pytest.raises(OSError, match="boom writing"):
        a[...] = ref
    r = FailingStore("c/0/1", "get")
    b = zarr3.create(r, shape=(8, 8), dtype="int32", chunks=(2, 2) if sharded else (4, 4), **kw)
    b[...] = ref
    with pytest.raises(OSError, match="boom reading"):
        zarr3.open(r)[...]
    np.testing.assert_array_equal(zarr3.open(r)[4:, :4], ref[4:, :4])
