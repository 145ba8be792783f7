"""Conformance against TensorStore 0.1.86 in both directions, on plain files and inside OCDBT.

For every case TensorStore writes an array (part of it, so some chunks stay missing) and we
read it back bit-exactly; then we write the same array with the same metadata and check that
TensorStore reads it back, that our metadata file is byte-identical to TensorStore's and that
we stored exactly the same set of chunk keys (chunks equal to the fill value skipped alike).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import zarr3

ts = pytest.importorskip("tensorstore")

pytestmark = pytest.mark.tensorstore

ALL_DTYPES = [
    "bool",
    "int2",
    "int4",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float8_e3m4",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
FEW_DTYPES = ["uint8", "float32", "bfloat16", "complex128", "int4"]
SHAPE = [7, 5]


def np_dtype(name: str) -> np.dtype[Any]:
    t = getattr(ml_dtypes, name, None)
    return np.dtype(t if t is not None else name)


def make_data(name: str, shape: list[int], seed: int = 0) -> np.ndarray:
    """Random bit patterns valid for the type (sub-byte types use only their low bits)."""
    dt = np_dtype(name)
    rng = np.random.default_rng(seed)
    if name == "bool":
        return rng.random(shape) > 0.5
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    if name in ("int4", "float4_e2m1fn"):
        raw &= 0x0F
    elif name == "int2":
        raw &= 0x03
    return raw.view(dt).reshape(shape)


def files(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(root)).replace(os.sep, "/")] = p.read_bytes()
    return out


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality (sub-byte integers by value: TensorStore's in-memory int4 bytes are
    sign-extended, ml_dtypes' are not; both mean the same number)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.name in ("int4", "int2", "uint4", "uint2"):
        return bool((a.astype(np.int8) == b.astype(np.int8)).all())
    return a.tobytes() == b.tobytes()


def v3_meta(dtype: str, chunks: list[int], codecs: list[Any] | None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "shape": SHAPE,
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
    }
    if codecs is not None:
        meta["codecs"] = codecs
    meta.update(extra)
    return meta


V3_CODECS: dict[str, list[Any] | None] = {
    "bytes": None,
    "zstd": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1}}],
    "zstd_checksum_crc": [{"name": "bytes"}, {"name": "zstd", "configuration": {"checksum": True}}, {"name": "crc32c"}],
    "big_gzip": [
        {"name": "bytes", "configuration": {"endian": "big"}},
        {"name": "gzip", "configuration": {"level": 1}},
    ],
    "transpose_blosc": [
        {"name": "transpose", "configuration": {"order": "F"}},
        {"name": "bytes"},
        {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 3, "shuffle": "bitshuffle"}},
    ],
    "shard_end": [
        {
            "name": "sharding_indexed",
            "configuration": {"chunk_shape": None, "codecs": [{"name": "bytes"}, {"name": "zstd"}]},
        }
    ],
    "shard_start_multi": [
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": "half",
                "codecs": [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "gzip"}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "big"}}],
                "index_location": "start",
            },
        }
    ],
    "nested_shard": [
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": "half",
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {"chunk_shape": [1, 1], "codecs": [{"name": "bytes"}, {"name": "crc32c"}]},
                    }
                ],
            },
        }
    ],
    "transpose_shard": [
        {"name": "transpose", "configuration": {"order": [1, 0]}},
        {"name": "sharding_indexed", "configuration": {"chunk_shape": "half_t"}},
    ],
}


def resolve_codecs(codecs: list[Any] | None, chunks: list[int]) -> list[Any] | None:
    """Fill the inner chunk shape placeholders for a given outer chunk shape."""
    if codecs is None:
        return None
    out = json.loads(json.dumps(codecs))
    for c in out:
        cfg = c.get("configuration", {})
        if c["name"] == "sharding_indexed":
            if cfg["chunk_shape"] is None:
                cfg["chunk_shape"] = list(chunks)
            elif cfg["chunk_shape"] == "half":
                cfg["chunk_shape"] = [max(1, x // 2) if x % 2 == 0 else x for x in chunks]
            elif cfg["chunk_shape"] == "half_t":
                t = chunks[::-1]
                cfg["chunk_shape"] = [max(1, x // 2) if x % 2 == 0 else x for x in t]
    return out


def roundtrip_v3(tmp_path: Path, dtype: str, chunks: list[int], codecs: list[Any] | None, **meta_extra: Any) -> None:
    data = make_data(dtype, SHAPE)
    codecs = resolve_codecs(codecs, chunks)
    meta = v3_meta(dtype, chunks, codecs, **meta_extra)
    # 1. TensorStore writes (rows 0..4 only), we read
    ts_dir = tmp_path / "ts"
    t = ts.open(
        {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(ts_dir)}, "metadata": meta}, create=True
    ).result()
    t[0:5].write(data[0:5]).result()
    full = t.read().result()
    ours = zarr3.open(str(ts_dir))
    assert same(ours[...], full)
    assert same(ours[1:6:2, ::-1], full[1:6:2, ::-1])
    assert same(ours[6], full[6])
    # 2. we write the same thing, TensorStore reads; identical metadata and chunk keys
    our_dir = tmp_path / "ours"
    arr = zarr3.create(
        str(our_dir),
        shape=SHAPE,
        dtype=dtype,
        chunks=chunks,
        codecs=codecs,
        fill_value=ours.fill_value,
        chunk_key_encoding=meta_extra.get("chunk_key_encoding"),
        attributes=meta_extra.get("attributes"),
        dimension_names=meta_extra.get("dimension_names"),
    )
    arr[0:5] = data[0:5]
    back = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(our_dir)}}).result().read().result()
    assert same(back, full)
    ts_files, our_files = files(ts_dir), files(our_dir)
    assert our_files["zarr.json"] == ts_files["zarr.json"]
    fill = ours.fill_value
    if dtype in ("int4", "int2") and int(np.asarray(fill).astype(np.int8)) < 0:
        # TensorStore holds a negative sub-byte fill value sign-extended (0xfd for -3) but
        # the written values as ml_dtypes bytes (0x0d), so its bitwise "equals fill" test
        # never matches and it stores such chunks anyway; we skip them.  Data is the same.
        return
    assert sorted(our_files) == sorted(ts_files)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("codecs", ["bytes", "zstd", "shard_end"])
@pytest.mark.parametrize("chunks", [[4, 2], [7, 5]])
def test_v3_all_dtypes(tmp_path: Path, dtype: str, codecs: str, chunks: list[int]) -> None:
    roundtrip_v3(tmp_path, dtype, chunks, V3_CODECS[codecs])


@pytest.mark.parametrize("dtype", FEW_DTYPES)
@pytest.mark.parametrize("codecs", sorted(set(V3_CODECS) - {"bytes", "zstd"}))
@pytest.mark.parametrize("chunks", [[4, 2], [2, 6]])
def test_v3_all_codecs(tmp_path: Path, dtype: str, codecs: str, chunks: list[int]) -> None:
    roundtrip_v3(tmp_path, dtype, chunks, V3_CODECS[codecs])


@pytest.mark.parametrize(
    "encoding",
    [
        {"name": "default", "configuration": {"separator": "."}},
        {"name": "v2"},
        {"name": "v2", "configuration": {"separator": "/"}},
    ],
)
def test_v3_chunk_key_encodings(tmp_path: Path, encoding: dict[str, Any]) -> None:
    roundtrip_v3(tmp_path, "int16", [3, 2], V3_CODECS["zstd"], chunk_key_encoding=encoding)


def test_v3_attributes_and_dimension_names(tmp_path: Path) -> None:
    roundtrip_v3(
        tmp_path,
        "float32",
        [4, 4],
        None,
        attributes={"z": [1, 2.5, None], "a": {"ü": "x", "big": 2**64 - 1, "f": 1e15}},
        dimension_names=["x", None],
    )


@pytest.mark.parametrize(
    "dtype, fill",
    [
        ("float32", "NaN"),
        ("float32", "0x7fc00001"),
        ("float32", "-Infinity"),
        ("float32", -0.0),
        ("float32", 0.1),
        ("bfloat16", "0x7fe0"),
        ("bfloat16", "NaN"),
        ("float16", "0x7e01"),
        ("float64", 1e300),
        ("float8_e4m3fn", "NaN"),
        ("float8_e5m2", "Infinity"),
        ("float8_e8m0fnu", 4.0),
        ("complex64", ["NaN", 1.0]),
        ("complex128", [1.5, "-Infinity"]),
        ("int64", -(2**63)),
        ("uint64", 2**64 - 1),
        ("int4", -3),
        ("int4", 5),
        ("bool", True),
    ],
)
def test_v3_fill_values(tmp_path: Path, dtype: str, fill: Any) -> None:
    roundtrip_v3(tmp_path, dtype, [4, 2], V3_CODECS["zstd"], fill_value=fill)


def test_v3_schema_nan_fill_written_like_tensorstore(tmp_path: Path) -> None:
    """TensorStore turns a double NaN fill into bfloat16 bits 0x7fe0; we keep those bits."""
    d = tmp_path / "a"
    ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(d)},
            "schema": {
                "dtype": "bfloat16",
                "domain": {"shape": [4]},
                "chunk_layout": {"chunk": {"shape": [2]}},
                "fill_value": float("nan"),
            },
        },
        create=True,
    ).result()
    a = zarr3.open(str(d))
    assert np.asarray(a.fill_value).view(np.uint16) == 0x7FE0
    assert a.metadata.to_bytes() == (d / "zarr.json").read_bytes()
    assert same(a[...], np.full(4, a.fill_value))


def test_v3_zero_dim(tmp_path: Path) -> None:
    d = tmp_path / "z"
    t = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(d)},
            "metadata": {
                "shape": [],
                "data_type": "float64",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": []}},
            },
        },
        create=True,
    ).result()
    t.write(np.float64(3.25)).result()
    assert (d / "c").exists()
    assert zarr3.open(str(d))[()] == 3.25
    o = zarr3.create(str(tmp_path / "o"), shape=(), dtype="float64")
    o[...] = 2.5
    assert (
        ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "o")}})
        .result()
        .read()
        .result()
        == 2.5
    )
    assert (tmp_path / "o" / "zarr.json").read_bytes() == (d / "zarr.json").read_bytes()


def test_v3_write_empty_chunks_matches_store_data_equal_to_fill_value(tmp_path: Path) -> None:
    meta = v3_meta("uint8", [2, 2], resolve_codecs(V3_CODECS["shard_start_multi"], [4, 4]))
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [4, 4]
    d = tmp_path / "ts"
    t = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(d)},
            "metadata": meta,
            "store_data_equal_to_fill_value": True,
        },
        create=True,
    ).result()
    t.write(np.zeros(SHAPE, np.uint8)).result()
    a = zarr3.create(
        str(tmp_path / "o"), shape=SHAPE, dtype="uint8", chunks=[4, 4], codecs=meta["codecs"], write_empty_chunks=True
    )
    a[...] = 0
    assert files(tmp_path / "o") == files(d)


# -- zarr v2 ------------------------------------------------------------------------------
V2_DTYPES = {
    "bool": "|b1",
    "int8": "|i1",
    "uint8": "|u1",
    "int16": "<i2",
    "uint16": ">u2",
    "int32": ">i4",
    "uint32": "<u4",
    "int64": "<i8",
    "uint64": ">u8",
    "float16": "<f2",
    "float32": ">f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": ">c16",
    "bfloat16": "bfloat16",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e4m3b11fnuz": "float8_e4m3b11fnuz",
    "float8_e3m4": "float8_e3m4",
    "float8_e8m0fnu": "float8_e8m0fnu",
    "int4": "int4",
    "int2": "int2",
    "float4_e2m1fn": "float4_e2m1fn",
}
V2_COMPRESSORS: dict[str, Any] = {
    "none": None,
    "zstd": {"id": "zstd", "level": 1},
    "zlib": {"id": "zlib", "level": 1},
    "gzip": {"id": "gzip", "level": 1},
    "bz2": {"id": "bz2", "level": 1},
    "blosc": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": -1, "blocksize": 0},
}


def roundtrip_v2(
    tmp_path: Path, dtype: str, chunks: list[int], compressor: Any, order: str = "C", sep: str = ".", fill: Any = None
) -> None:
    stored = V2_DTYPES[dtype]
    data = make_data(dtype, SHAPE)
    meta = {
        "shape": SHAPE,
        "chunks": chunks,
        "dtype": stored,
        "compressor": compressor,
        "order": order,
        "dimension_separator": sep,
        "fill_value": fill,
    }
    ts_dir = tmp_path / "ts"
    t = ts.open(
        {"driver": "zarr", "kvstore": {"driver": "file", "path": str(ts_dir)}, "metadata": meta}, create=True
    ).result()
    t[0:5].write(data[0:5]).result()
    full = t.read().result()
    ours = zarr3.open(str(ts_dir))
    assert ours.zarr_format == 2
    assert same(ours[...], full)
    assert same(ours[::-3, 1:4], full[::-3, 1:4])
    our_dir = tmp_path / "ours"
    np_stored = np.dtype(stored) if stored[0] in "<>|" else dtype
    arr = zarr3.create(
        str(our_dir),
        shape=SHAPE,
        dtype=np_stored,
        chunks=chunks,
        zarr_format=2,
        compressor=compressor,
        order=order,
        dimension_separator=sep,
        fill_value=ours.fill_value,
    )
    arr[0:5] = data[0:5]
    back = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(our_dir)}}).result().read().result()
    assert same(back, full)
    ts_files, our_files = files(ts_dir), files(our_dir)
    assert our_files[".zarray"] == ts_files[".zarray"]
    assert sorted(our_files) == sorted(ts_files)


@pytest.mark.parametrize("dtype", sorted(V2_DTYPES))
@pytest.mark.parametrize("compressor", ["none", "zstd"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_v2_all_dtypes(tmp_path: Path, dtype: str, compressor: str, order: str) -> None:
    roundtrip_v2(tmp_path, dtype, [4, 2], V2_COMPRESSORS[compressor], order)


@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64", "bfloat16"])
@pytest.mark.parametrize("compressor", sorted(V2_COMPRESSORS))
@pytest.mark.parametrize("sep", [".", "/"])
def test_v2_all_compressors(tmp_path: Path, dtype: str, compressor: str, sep: str) -> None:
    if compressor == "blosc":
        pytest.importorskip("blosc")
    roundtrip_v2(tmp_path, dtype, [3, 5], V2_COMPRESSORS[compressor], "C", sep)


@pytest.mark.parametrize(
    "dtype, fill",
    [
        ("float32", "NaN"),
        ("float64", "-Infinity"),
        ("int32", -5),
        ("bool", True),
        ("complex64", [1.0, "NaN"]),
        ("bfloat16", 1.5),
        ("float4_e2m1fn", "Aw=="),
    ],
)
def test_v2_fill_values(tmp_path: Path, dtype: str, fill: Any) -> None:
    roundtrip_v2(tmp_path, dtype, [4, 2], V2_COMPRESSORS["zstd"], fill=fill)


def test_v2_zero_dim(tmp_path: Path) -> None:
    d = tmp_path / "z"
    t = ts.open(
        {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": str(d)},
            "metadata": {"shape": [], "chunks": [], "dtype": "<i8", "compressor": {"id": "zstd", "level": 1}},
        },
        create=True,
    ).result()
    t.write(np.int64(-9)).result()
    assert (d / "0").exists()
    assert zarr3.open(str(d))[()] == -9
    o = zarr3.create(str(tmp_path / "o"), shape=(), dtype="<i8", zarr_format=2, compressor={"id": "zstd", "level": 1})
    o[...] = -9
    assert files(tmp_path / "o") == files(d)


# -- inside OCDBT (TensorStore writes, we read through ocdbt_py) -----------------------------
def _ocdbt_open(path: Path) -> Any:
    try:
        from ocdbt_py.store import open as ocdbt_open
    except ImportError:  # pragma: no cover - until the OCDBT reader lands
        pytest.skip("ocdbt_py.store is not available")
    return ocdbt_open(str(path))


@pytest.mark.parametrize("driver", ["zarr3", "zarr"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float8_e4m3fn", "complex64"])
def test_read_inside_ocdbt(tmp_path: Path, driver: str, dtype: str) -> None:
    data = make_data(dtype, SHAPE)
    specs: dict[str, dict[str, Any]] = {}
    if driver == "zarr3":
        specs["params.sharded"] = v3_meta(dtype, [4, 4], resolve_codecs(V3_CODECS["shard_end"], [4, 4]))
        specs["params.multi"] = v3_meta(dtype, [4, 4], resolve_codecs(V3_CODECS["shard_start_multi"], [4, 4]))
        specs["plain"] = v3_meta(dtype, [3, 2], V3_CODECS["zstd"])
    else:
        specs["params.v2"] = {
            "shape": SHAPE,
            "chunks": [4, 2],
            "dtype": V2_DTYPES[dtype],
            "compressor": {"id": "zstd", "level": 1},
        }
    for name, meta in specs.items():
        t = ts.open(
            {
                "driver": driver,
                "kvstore": {"driver": "ocdbt", "base": f"file://{tmp_path}/", "path": f"{name}/"},
                "metadata": meta,
            },
            create=True,
        ).result()
        t[1:6].write(data[1:6]).result()
    db = _ocdbt_open(tmp_path)
    for name in specs:
        t = ts.open(
            {"driver": driver, "kvstore": {"driver": "ocdbt", "base": f"file://{tmp_path}/", "path": f"{name}/"}}
        ).result()
        full = t.read().result()
        a = zarr3.open(db, name)
        assert same(a[...], full), name
        assert same(a[2:7:2, ::-2], full[2:7:2, ::-2]), name


def test_read_inside_ocdbt_missing_chunk_strict(tmp_path: Path) -> None:
    meta = {"shape": [4, 4], "chunks": [2, 2], "dtype": "<f4", "compressor": {"id": "zstd", "level": 1}}
    t = ts.open(
        {
            "driver": "zarr",
            "kvstore": {"driver": "ocdbt", "base": f"file://{tmp_path}/", "path": "p/"},
            "metadata": meta,
        },
        create=True,
    ).result()
    t[0:2, :].write(np.ones((2, 4), np.float32)).result()
    db = _ocdbt_open(tmp_path)
    np.testing.assert_array_equal(zarr3.open(db, "p")[2:], 0)
    with pytest.raises(zarr3.ChunkNotFoundError):
        zarr3.open(db, "p", fill_missing=False)[2:]
    np.testing.assert_array_equal(zarr3.open(db, "p", fill_missing=False)[:2], 1)


def test_v2_structured_dtype(tmp_path: Path) -> None:
    """TensorStore's zarr driver opens one field at a time; we read and write whole records."""
    dtype = [["a", "<i4"], ["b", ">f8", [2]], ["c", "|b1"], ["d", "bfloat16"]]
    meta = {"shape": [5, 3], "chunks": [2, 2], "dtype": dtype, "compressor": {"id": "zstd", "level": 1}}
    d = tmp_path / "ts"
    kv = {"driver": "file", "path": str(d)}
    ta = ts.open({"driver": "zarr", "kvstore": kv, "field": "a", "metadata": meta}, create=True).result()
    ta[1:4].write(np.arange(9, dtype=np.int32).reshape(3, 3)).result()
    tb = ts.open({"driver": "zarr", "kvstore": kv, "field": "b"}).result()
    tb[2, 1].write(np.array([1.5, -2.5])).result()
    ours = zarr3.open(str(d))
    got = ours[...]
    for name in ("a", "b", "c", "d"):
        field = ts.open({"driver": "zarr", "kvstore": kv, "field": name}).result().read().result()
        assert same(got[name], np.asarray(field)), name
    o = tmp_path / "ours"
    arr = zarr3.create(
        str(o),
        shape=(5, 3),
        dtype=ours.metadata.stored_dtype,
        chunks=(2, 2),  # type: ignore[union-attr]
        zarr_format=2,
        compressor={"id": "zstd", "level": 1},
    )
    arr[...] = got
    assert (o / ".zarray").read_bytes() == (d / ".zarray").read_bytes()
    for name in ("a", "b", "c", "d"):
        field = (
            ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(o)}, "field": name})
            .result()
            .read()
            .result()
        )
        assert same(np.asarray(field), got[name]), name
