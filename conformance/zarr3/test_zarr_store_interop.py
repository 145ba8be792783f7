"""OcdbtZarrStore between zarr-python and TensorStore, both ways, and inside Orbax checkpoints.

* zarr-python writes v3 arrays (sharded; bytes/transpose/zstd/gzip/blosc/crc32c codecs) through
  the store; TensorStore's ``zarr3`` driver over its ``ocdbt`` kvstore reads them bit-exactly.
* TensorStore writes arrays (zarr3 sharded, zarr v2) into an OCDBT database; zarr-python reads
  them through the store.
* zarr-python opens the arrays of checkpoints Orbax wrote with OCDBT (the committed corpus,
  zarr v2 and zarr3 layouts) through the store, and reads what TensorStore reads there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
ts = pytest.importorskip("tensorstore")

from zarr.codecs import (  # noqa: E402
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    TransposeCodec,
    ZstdCodec,
)

from ocdbt_py.bridges import OcdbtZarrStore  # noqa: E402

pytestmark = pytest.mark.tensorstore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint" / "orbax-0.11.5" / "ckpt"


def _ts_spec(db: Path, path: str, driver: str = "zarr3") -> dict[str, Any]:
    return {"driver": driver, "kvstore": {"driver": "ocdbt", "base": f"file://{db}/", "path": f"{path}/"}}


def _write_with_zarr_python(db: Path) -> dict[str, np.ndarray]:
    store = OcdbtZarrStore(str(db))
    root = zarr.open_group(store, mode="w")
    rng = np.random.default_rng(3)
    arrays: dict[str, np.ndarray] = {}

    # sharded, zstd inside, crc32c index: the layout Orbax and TensorStore use
    a = rng.standard_normal((64, 48)).astype("<f4")
    za = root.create_array("sharded", shape=a.shape, dtype=a.dtype, chunks=(8, 8), shards=(32, 24),
                           compressors=ZstdCodec(level=3), fill_value=0.0)
    za[:] = a
    arrays["sharded"] = a

    # hand-assembled codec chain: transpose + big-endian bytes + gzip + crc32c, partial writes
    b = np.zeros((30, 20), dtype=">i8")
    b[3:27, 5:19] = rng.integers(-(2**40), 2**40, size=(24, 14))
    zb = zarr.create_array(store, name="chained", shape=b.shape, dtype=b.dtype, chunks=(7, 6), fill_value=0,
                           serializer=BytesCodec(endian="big"), filters=[TransposeCodec(order=(1, 0))],
                           compressors=[GzipCodec(level=5), Crc32cCodec()])
    zb[3:27, 5:19] = b[3:27, 5:19]
    arrays["chained"] = b

    # blosc in a shard whose inner chunks use it; an edge shard is partial
    c = rng.integers(0, 255, size=(50, 33), dtype="u1")
    zc = zarr.create_array(store, name="g/blosc", shape=c.shape, dtype=c.dtype, chunks=(10, 11),
                           shards=(20, 33), compressors=BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"))
    zc[:] = c
    arrays["g/blosc"] = c
    return arrays


def test_zarr_python_writes_tensorstore_reads(tmp_path: Path) -> None:
    db = tmp_path / "db"
    arrays = _write_with_zarr_python(db)
    for name, want in arrays.items():
        t = ts.open(_ts_spec(db, name)).result()
        got = t.read().result()
        assert got.dtype == want.dtype.newbyteorder("=") or got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_array_equal(t[5:19, 2:9].read().result(), want[5:19, 2:9], err_msg=name)
    # and the store reads back what it wrote (through a fresh, read-only store)
    ro = OcdbtZarrStore(str(db), read_only=True)
    for name, want in arrays.items():
        np.testing.assert_array_equal(zarr.open_array(ro, path=name, mode="r")[:], want)


def test_tensorstore_writes_zarr_python_reads(tmp_path: Path) -> None:
    db = tmp_path / "db"
    rng = np.random.default_rng(5)
    w = rng.standard_normal((40, 36)).astype(np.float32)
    t = ts.open({
        **_ts_spec(db, "w"),
        "metadata": {
            "shape": list(w.shape), "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [20, 36]}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [10, 12],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                           {"name": "zstd", "configuration": {"level": 1}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            }}],
        },
    }, create=True).result()
    t[:30].write(w[:30]).result()  # the last shard stays missing: fill value
    v = rng.integers(-1000, 1000, size=(17, 5)).astype("<i2")
    t2 = ts.open({**_ts_spec(db, "v2", driver="zarr"),
                  "metadata": {"shape": [17, 5], "chunks": [4, 5], "dtype": "<i2",
                               "compressor": {"id": "zlib", "level": 4}}}, create=True).result()
    t2.write(v).result()

    store = OcdbtZarrStore(str(db), read_only=True)
    want = w.copy()
    want[30:] = 0
    np.testing.assert_array_equal(zarr.open_array(store, path="w", mode="r")[:], want)
    np.testing.assert_array_equal(zarr.open_array(store, path="w", mode="r")[7:33, 5:30], want[7:33, 5:30])
    np.testing.assert_array_equal(zarr.open_array(store, path="v2", mode="r", zarr_format=2)[:], v)


@pytest.mark.orbax
@pytest.mark.parametrize("layout", ["pytree_zarr3", "pytree_ocdbt"])
def test_zarr_python_opens_orbax_checkpoint_arrays(layout: str) -> None:
    """An Orbax (0.11.5) checkpoint saved with OCDBT: its merged root references the
    per-process database's data files; zarr-python reads every array TensorStore reads."""
    root = FIXTURES / layout
    store = OcdbtZarrStore(str(root), read_only=True)
    fmt = 3 if layout.endswith("zarr3") else 2
    names = sorted({k.decode().rsplit("/", 1)[0] for k in store.db.list()
                    if k.endswith(b"/zarr.json") or k.endswith(b"/.zarray")})
    read = 0
    for name in names:
        meta = json.loads(store.db.get(f"{name}/{'zarr.json' if fmt == 3 else '.zarray'}".encode()) or b"{}")
        if "bfloat16" in json.dumps(meta.get("data_type", meta.get("dtype"))):
            continue  # a dtype zarr-python itself does not know (TensorStore's extension)
        got = zarr.open_array(store, path=name, mode="r", zarr_format=fmt)[...]
        spec = _ts_spec(root, name, "zarr3" if fmt == 3 else "zarr")
        want = ts.open(spec).result().read().result()
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)
        read += 1
    assert read >= 5, names
