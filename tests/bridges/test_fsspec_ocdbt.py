"""The ``ocdbt`` fsspec protocol, used by the real zarr-python 3 and xarray (and fsspec itself)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import ocdbt_py
from ocdbt_py import checkpoint
from ocdbt_py.bridges import fsspec_ocdbt
from ocdbt_py.bridges.fsspec_ocdbt import OcdbtFileSystem
from ocdbt_py.errors import ReadOnlyError
from tests.objectstores import servers
from tests.objectstores.conftest import s3_server  # noqa: F401 - the session's moto server

zarr = pytest.importorskip("zarr")


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    # The entry point (pyproject [project.entry-points."fsspec.specs"]) is seen once the package
    # is reinstalled; an environment installed before it registers at run time.
    try:
        fsspec.get_filesystem_class("ocdbt")
    except (ValueError, ImportError):
        fsspec_ocdbt.register()
    assert fsspec.get_filesystem_class("ocdbt") is OcdbtFileSystem or fsspec.get_filesystem_class(
        "ocdbt").__name__ == "OcdbtFileSystem"


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {"params": {"w": rng.standard_normal((40, 24)).astype(np.float32),
                       "b": np.arange(24, dtype=np.int32)},
            "step": np.array(7, np.int64)}


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    p = tmp_path / "ckpt"
    checkpoint.save(p, _tree(), chunk_byte_size=16 * 24 * 4)
    return p


def test_fsspec_open_chained_url(ckpt: Path) -> None:
    with fsspec.open(f"ocdbt://params.w/.zarray::file://{ckpt}", "rb") as f:
        raw = f.read()
    meta = json.loads(raw)
    assert meta["shape"] == [40, 24] and meta["zarr_format"] == 2
    with fsspec.open(f"ocdbt://params.w/.zarray::file://{ckpt}", "rb", block_size=4) as f:
        f.seek(2)
        assert f.read(5) == raw[2:7]
    fs, path = fsspec.core.url_to_fs(f"ocdbt://params.w/.zarray::file://{ckpt}")
    assert isinstance(fs, OcdbtFileSystem) and path == "params.w/.zarray"


def test_ls_info_find_and_ranges(ckpt: Path) -> None:
    fs = OcdbtFileSystem(str(ckpt))
    top = fs.ls("", detail=True)
    names = {e["name"]: e["type"] for e in top}
    assert names["params.w"] == "directory" and names["params.b"] == "directory" and names["step"] == "directory"
    chunks = fs.ls("params.w", detail=False)
    keys = [k.decode() for k in ocdbt_py.open(ckpt).list(b"params.w/")]
    assert chunks == keys and "params.w/.zarray" in chunks and len(chunks) > 2
    assert fs.info("params.w")["type"] == "directory"
    info = fs.info("params.w/.zarray")
    assert info["type"] == "file" and info["size"] == len(fs.cat_file("params.w/.zarray"))
    assert set(fs.find("params")) == set() and "params.w/0.0" in fs.find("")
    allf = fs.find("", withdirs=True, detail=True)
    assert allf["params.w"]["type"] == "directory"
    with pytest.raises(FileNotFoundError):
        fs.info("nope")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("params.w/9.9")
    whole = fs.cat_file("params.w/.zarray")
    assert fs.cat_file("params.w/.zarray", 3, 10) == whole[3:10]
    assert fs.cat_file("params.w/.zarray", -5) == whole[-5:]
    assert fs.cat_file("params.w/.zarray", 2, -2) == whole[2:-2]
    # cat_ranges: one batched get_many, errors returned in place
    calls = []
    orig = fs.db.get_many
    fs.db.get_many = lambda reqs: (calls.append(len(list(reqs))) or orig(reqs))  # type: ignore[method-assign]
    reqs = ["params.w/.zarray", "params.b/.zarray", "missing", "params.w/.zarray"]
    got = fs.cat_ranges(reqs, [0, 1, 0, -4], [4, 5, 1, None])
    assert calls == [4]
    assert got[0] == whole[:4] and got[3] == whole[-4:] and isinstance(got[2], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges(reqs, 0, 1, on_error="raise")


@pytest.mark.parametrize("zarr3", [False, True])
def test_zarr_python_opens_array_inside_checkpoint(tmp_path: Path, zarr3: bool) -> None:
    p = tmp_path / "ckpt"
    checkpoint.save(p, _tree(), use_zarr3=zarr3, chunk_byte_size=16 * 24 * 4)
    a = zarr.open_array(f"ocdbt://params.w::file://{p}", mode="r")
    want = _tree()["params"]["w"]
    assert a.shape == (40, 24)
    np.testing.assert_array_equal(a[...], want)
    np.testing.assert_array_equal(a[5:30, 3:9], want[5:30, 3:9])
    assert int(zarr.open_array(f"ocdbt://step::file://{p}", mode="r")[()]) == 7


def test_zarr_over_s3_chained(s3_server: servers.S3Server, tmp_path: Path) -> None:  # noqa: F811
    s3_server.make_bucket("bridges")
    url = "s3://bridges/ckpt/1000/params"
    tree = _tree()
    checkpoint.save(url, tree["params"], storage_options=s3_server.storage_options())
    opts = s3_server.storage_options()
    with fsspec.open(f"ocdbt://w/.zarray::{url}", "rb", s3=opts) as f:
        assert json.loads(f.read())["shape"] == [40, 24]
    a = zarr.open_array(f"ocdbt://w::{url}", mode="r", storage_options={"s3": opts})
    np.testing.assert_array_equal(a[...], tree["params"]["w"])


def test_version_time_travel_and_read_only(tmp_path: Path) -> None:
    db = ocdbt_py.open(tmp_path / "db", mode="a")
    g1 = db.put("a/x", b"one")
    db.put("a/x", b"two")
    fs_now = OcdbtFileSystem(str(tmp_path / "db"))
    fs_old = OcdbtFileSystem(str(tmp_path / "db"), version=g1)
    assert fs_now.cat_file("a/x") == b"two" and fs_old.cat_file("a/x") == b"one"
    with pytest.raises(ReadOnlyError):
        fs_now.pipe_file("a/y", b"z")
    with pytest.raises(ReadOnlyError), fs_now.open("a/y", "wb") as f:
        f.write(b"z")


def test_writable_commits_one_transaction(tmp_path: Path) -> None:
    ocdbt_py.open(tmp_path / "db", mode="a").put("keep", b"k")
    fs = OcdbtFileSystem(str(tmp_path / "db"), mode="a", skip_instance_cache=True)
    gen0 = fs.db.generation
    fs.pipe_file("d/1", b"a")
    fs.pipe_file("d/2", b"bb")
    with fs.open("d/3", "wb") as f:
        f.write(b"ccc")
    fs.rm_file("keep")
    assert fs.cat_file("d/2") == b"bb" and fs.ls("d", detail=False) == ["d/1", "d/2", "d/3"]  # read-your-writes
    other = OcdbtFileSystem(str(tmp_path / "db"), skip_instance_cache=True)
    assert not other.exists("d/1")
    gen = fs.commit()
    assert gen == gen0 + 1
    fresh = ocdbt_py.open(tmp_path / "db")
    assert [k for k in fresh.list()] == [b"d/1", b"d/2", b"d/3"] and fresh.generation == gen


def test_zarr_python_writes_through_protocol(tmp_path: Path) -> None:
    fs = OcdbtFileSystem(str(tmp_path / "db"), mode="a", skip_instance_cache=True)
    from zarr.storage import FsspecStore

    store = FsspecStore(fsspec.implementations.asyn_wrapper.AsyncFileSystemWrapper(fs, asynchronous=True),
                        path="arr")
    z = zarr.create_array(store, shape=(30, 10), chunks=(8, 10), dtype="int16")
    data = np.arange(300, dtype=np.int16).reshape(30, 10)
    z[...] = data
    fs.commit()
    import zarr3

    np.testing.assert_array_equal(zarr3.open(ocdbt_py.open(tmp_path / "db"), "arr")[...], data)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_xarray_dataset_copied_into_ocdbt(tmp_path: Path, zarr_format: int) -> None:
    xr = pytest.importorskip("xarray")
    ds = xr.Dataset(
        {"temp": (("time", "x"), np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32)),
         "flag": (("x",), np.arange(5, dtype=np.int8))},
        coords={"time": np.arange(12), "x": np.linspace(0, 1, 5)},
        attrs={"title": "bridges"},
    )
    plain = tmp_path / "plain.zarr"
    ds.chunk({"time": 4}).to_zarr(plain, zarr_format=zarr_format, consolidated=zarr_format == 2)
    db = ocdbt_py.open(tmp_path / "db", mode="a")
    with db.transaction() as t:
        for root, _, files in os.walk(plain):
            for f in files:
                rel = os.path.relpath(os.path.join(root, f), plain).replace(os.sep, "/")
                t.put(f"ds/{rel}", Path(root, f).read_bytes())
        t.commit()
    back = xr.open_zarr(f"ocdbt://ds::file://{tmp_path / 'db'}", zarr_format=zarr_format,
                        consolidated=zarr_format == 2)
    xr.testing.assert_identical(back.load(), ds)
    assert back.attrs["title"] == "bridges"
