"""Interoperability with zarr-python 3 (for the dtypes it supports; it has no bfloat16/float8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr3

zarr = pytest.importorskip("zarr")

DTYPES = [
    "bool",
    "int8",
    "uint16",
    "int32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]

V3_CONFIGS: list[dict[str, Any]] = [
    {},
    {"compressor": "zstd"},
    {"compressor": {"name": "gzip", "configuration": {"level": 1}}},
    {"compressor": "blosc"},
    {
        "codecs": [
            {"name": "transpose", "configuration": {"order": [1, 0]}},
            {"name": "bytes", "configuration": {"endian": "big"}},
            "crc32c",
        ]
    },
    {"shards": (4, 6), "compressor": "zstd"},
    {"shards": (4, 6), "index_location": "start"},
    {"chunk_key_encoding": {"name": "v2"}},
    {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}},
]

V2_CONFIGS: list[dict[str, Any]] = [
    {},
    {"compressor": {"id": "zstd", "level": 1}},
    {"compressor": {"id": "zlib", "level": 1}},
    {"compressor": {"id": "gzip", "level": 1}},
    {"compressor": {"id": "bz2", "level": 1}},
    {"compressor": {"id": "lz4"}},
    {"compressor": {"id": "blosc", "cname": "zstd", "shuffle": 2}},
    {"order": "F", "dimension_separator": "/"},
]


def _data(dtype: str, shape: tuple[int, ...] = (7, 9)) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    d = np.dtype(dtype)
    if d.kind in "iu":
        return rng.integers(0, 100, shape).astype(d)
    if d.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(d)
    return rng.standard_normal(shape).astype(d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", range(len(V3_CONFIGS)))
def test_zarr_python_reads_our_v3(tmp_path: Path, dtype: str, cfg: int) -> None:
    ref = _data(dtype)
    a = zarr3.create(str(tmp_path / "a"), shape=ref.shape, dtype=dtype, chunks=(2, 3), fill_value=1, **V3_CONFIGS[cfg])
    a[1:, :] = ref[1:]
    expected = ref.copy()
    expected[0] = 1
    got = zarr.open_array(str(tmp_path / "a"), mode="r")[...]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", range(len(V2_CONFIGS)))
def test_zarr_python_reads_our_v2(tmp_path: Path, dtype: str, cfg: int) -> None:
    ref = _data(dtype)
    a = zarr3.create(
        str(tmp_path / "a"), shape=ref.shape, dtype=dtype, chunks=(2, 3), zarr_format=2, fill_value=0, **V2_CONFIGS[cfg]
    )
    a[...] = ref
    got = zarr.open_array(str(tmp_path / "a"), mode="r", zarr_format=2)[...]
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", ["int16", "float32", "complex128", "bool"])
def test_we_read_zarr_python_v3(tmp_path: Path, dtype: str) -> None:
    ref = _data(dtype)
    z = zarr.create_array(str(tmp_path / "plain"), shape=ref.shape, chunks=(3, 4), dtype=dtype, attributes={"a": 1})
    z[...] = ref
    s = zarr.create_array(
        str(tmp_path / "sharded"),
        shape=ref.shape,
        chunks=(2, 2),
        shards=(4, 4),
        dtype=dtype,
        compressors=[zarr.codecs.ZstdCodec(level=1, checksum=True)],
    )
    s[...] = ref
    for name in ("plain", "sharded"):
        a = zarr3.open(str(tmp_path / name))
        np.testing.assert_array_equal(a[...], ref)
        np.testing.assert_array_equal(a[::-2, 1:8:3], ref[::-2, 1:8:3])
    assert zarr3.open(str(tmp_path / "plain")).attrs == {"a": 1}


@pytest.mark.parametrize("dtype", ["<i4", ">f8", "|u1"])
def test_we_read_zarr_python_v2(tmp_path: Path, dtype: str) -> None:
    ref = _data(np.dtype(dtype).newbyteorder("=").name if dtype != "|u1" else "uint8")
    z = zarr.create_array(
        str(tmp_path / "v2"), shape=ref.shape, chunks=(3, 4), dtype=dtype, zarr_format=2, fill_value=3
    )
    z[...] = ref
    z[6, 8] = 3  # equal to fill: zarr-python may leave chunks out
    ref[6, 8] = 3
    a = zarr3.open(str(tmp_path / "v2"))
    assert a.fill_value == 3
    np.testing.assert_array_equal(a[...], ref)


def test_we_read_zarr_python_groups(tmp_path: Path) -> None:
    g = zarr.open_group(str(tmp_path / "g"), mode="w")
    g.attrs["title"] = "t"
    g.create_array("x", shape=(3,), dtype="i8")[...] = [1, 2, 3]
    g.create_group("sub").create_array("y", shape=(2,), dtype="f4")[...] = [0.5, 1.5]
    G = zarr3.open_group(str(tmp_path / "g"))
    assert G.attrs == {"title": "t"}
    assert G.keys() == ["sub", "x"] == list(G) == sorted(g.keys())
    assert [n for n, _ in G.members()] == sorted(n for n, _ in g.members())
    sub = G["sub"]
    assert isinstance(sub, zarr3.Group)
    y = sub["y"]
    assert isinstance(y, zarr3.Array)
    np.testing.assert_array_equal(y[...], [0.5, 1.5])
