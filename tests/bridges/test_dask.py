"""``bridges.to_dask`` and ``zarr3.Array.to_dask`` computed on a dask.distributed LocalCluster of
two worker processes (tasks carry URLs and options; each worker opens the checkpoint itself)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import zarr3
from ocdbt_py import bridges, checkpoint
from zarr3.engine.dask_blocks import merged_chunks

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                       host="127.0.0.1")
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    return {"params": {"w": rng.standard_normal((96, 40)).astype(np.float32),
                       "e": rng.standard_normal((64, 8)).astype(ml_dtypes.bfloat16),
                       "i": np.arange(1000, dtype=np.int64)},
            "lr": 0.5, "name": "run1"}


def _opened_in_worker() -> int:
    from ocdbt_py.bridges import dask_arrays

    return dask_arrays._open.cache_info().currsize


def test_merged_chunks() -> None:
    assert merged_chunks((100, 40), (10, 40), 4, 10 * 40 * 4 * 3) == ((30, 30, 30, 10), (40,))
    assert merged_chunks((100, 40), (10, 8), 4, 10 * 8 * 4 * 2) == ((10,) * 10, (16, 16, 8))
    assert merged_chunks((), (), 4) == ()
    assert merged_chunks((5,), (2,), 8, 1) == ((2, 2, 1),)


def test_to_dask_reductions_on_workers(tmp_path: Path, client: Any) -> None:
    tree = _tree()
    root = tmp_path / "mgr"
    checkpoint.save(root / "10", tree, chunk_byte_size=16 * 40 * 4)
    checkpoint.save(root / "20", {**tree, "params": {**tree["params"], "w": tree["params"]["w"] * 2}},
                    chunk_byte_size=16 * 40 * 4)
    t = bridges.to_dask(root, block_bytes=32 * 40 * 4)  # latest step: 20
    w = t["params"]["w"]
    assert isinstance(w, da.Array) and w.chunks == ((32, 32, 32), (40,))
    assert t["lr"] == 0.5 and t["name"] == "run1"
    np.testing.assert_allclose(w.sum().compute(), (tree["params"]["w"] * 2).sum(dtype=np.float32), rtol=1e-5)
    # bf16 -> f32 sums and a slice, on the workers
    e32 = t["params"]["e"].astype(np.float32)
    np.testing.assert_allclose(e32.sum(axis=0).compute(), tree["params"]["e"].astype(np.float32).sum(axis=0),
                               rtol=1e-5)
    np.testing.assert_array_equal(t["params"]["i"][100:900:7].compute(), tree["params"]["i"][100:900:7])
    old = bridges.to_dask(root, step=10)
    np.testing.assert_array_equal(old["params"]["w"].compute(), tree["params"]["w"])
    # the work ran in the worker processes, which opened the checkpoint themselves
    pids = client.run(lambda: __import__("os").getpid())
    opened = client.run(_opened_in_worker)
    assert len(pids) == 2 and sum(opened.values()) >= 1


def test_only_computed_blocks_are_read(tmp_path: Path) -> None:
    import dask

    tree = _tree()
    checkpoint.save(tmp_path / "c", tree, chunk_byte_size=16 * 40 * 4)
    w = bridges.to_dask(tmp_path / "c")["params"]["w"]
    from ocdbt_py.checkpoint.restore.reader import ArrayReader

    reads: list[Any] = []
    orig = ArrayReader.read

    def spy(self: ArrayReader, param: str, selection: Any = Ellipsis, **kw: Any) -> Any:
        reads.append(selection)
        return orig(self, param, selection, **kw)

    ArrayReader.read = spy  # type: ignore[method-assign]
    try:
        with dask.config.set(scheduler="synchronous"):
            w = bridges.to_dask(tmp_path / "c", block_bytes=16 * 40 * 4)["params"]["w"]
            got = w[20:30].compute()
    finally:
        ArrayReader.read = orig  # type: ignore[method-assign]
    np.testing.assert_array_equal(got, tree["params"]["w"][20:30])
    rows = np.cumsum((0,) + w.chunks[0])
    touched = sum(1 for a, b in zip(rows[:-1], rows[1:]) if a < 30 and b > 20) * len(w.chunks[1])
    assert len(reads) == touched < w.npartitions


def test_conversion_runs_on_workers(tmp_path: Path, client: Any) -> None:
    """A conversion on the workers: every block of each array, cast bf16/int -> f32, written as
    .npy files by the worker that read it (dask's to_npy_stack), then checked."""
    tree = _tree()
    checkpoint.save(tmp_path / "c", tree, chunk_byte_size=16 * 40 * 4)
    t = bridges.to_dask(tmp_path / "c", block_bytes=16 * 40 * 4)
    before = client.run(lambda: __import__("ocdbt_py.bridges.dask_arrays", fromlist=["x"])._open.cache_info().hits)
    for name in ("w", "e", "i"):
        da.to_npy_stack(str(tmp_path / f"{name}_f32"), t["params"][name].astype(np.float32), axis=0)
    for name in ("w", "e", "i"):
        back = da.from_npy_stack(str(tmp_path / f"{name}_f32")).compute()
        np.testing.assert_array_equal(back, tree["params"][name].astype(np.float32))
    after = client.run(lambda: __import__("ocdbt_py.bridges.dask_arrays", fromlist=["x"])._open.cache_info().hits)
    assert sum(after.values()) > sum(before.values())  # the reads happened in the worker processes


def test_zarr3_array_to_dask(tmp_path: Path, client: Any) -> None:
    a = zarr3.create(str(tmp_path / "z"), shape=(50, 30), dtype="int32", chunks=(10, 30), shards=(20, 30),
                     compressor="zstd")
    data = np.arange(1500, dtype=np.int32).reshape(50, 30)
    a[...] = data
    r = zarr3.open(str(tmp_path / "z"))
    d = r.to_dask(block_bytes=20 * 30 * 4)
    assert d.chunks == ((20, 20, 10), (30,))
    assert int(d.sum().compute()) == int(data.sum())
    # opened from a store object: the array ships with the graph (threads here)
    import dask

    from ocdbt_py.kvstore import LocalStore

    obj = zarr3.open(LocalStore(str(tmp_path)), "z")
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(obj.to_dask()[5:45].compute(), data[5:45])
