"""String/bytes dtypes, numcodecs filters and codecs written by zarr3 and read by zarr-python 3
(and the reverse for what the fixture matrix does not cover), plus the decoder edge cases
peers produce (blosc trailing bytes, an unavailable blosc compressor)."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr3
from zarr3.codecs import BloscCodec, compressor_from_v2
from zarr3.errors import CodecUnavailableError, CorruptionError, UnsupportedError

zarr = pytest.importorskip("zarr")
warnings.simplefilter("ignore")

STRS = np.array([["", "a", "héllo"], ["日本", "x" * 40, "z"]], dtype=np.dtypes.StringDType())


def _zp(path: Path) -> np.ndarray:
    return zarr.open_array(str(path), mode="r")[...]


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("compressor", [None, "zstd"])
def test_zarr_python_reads_our_strings(tmp_path: Path, fmt: int, compressor: Any) -> None:
    comp: Any = compressor
    if fmt == 2 and compressor:
        comp = {"id": "zstd", "level": 1}
    a = zarr3.create(tmp_path / "s", shape=(3, 3), chunks=(2, 2), dtype=str, zarr_format=fmt, compressor=comp)
    a[0:2, :] = STRS
    got = _zp(tmp_path / "s")
    want = np.array([*STRS.tolist(), ["", "", ""]], dtype=object)
    assert got.reshape(-1).tolist() == want.reshape(-1).tolist()
    assert zarr3.open(tmp_path / "s")[...].tolist() == want.tolist()


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("dtype, values, fill", [
    ("S4", [b"", b"ab", b"a\x00c", b"wxyz"], b"foo"),
    ("<U3", ["", "ab", "日本語", "z"], "q"),
    (object, [b"", b"\x00\x01", b"x" * 30, b"z"], None),
])  # fmt: skip
def test_zarr_python_reads_our_bytes_and_unicode(tmp_path: Path, fmt: int, dtype: Any, values: Any, fill: Any) -> None:
    arr = np.empty(4, dtype=dtype)
    arr[:] = values
    a = zarr3.create(tmp_path / "b", shape=(6,), chunks=(4,), dtype=dtype, zarr_format=fmt, fill_value=fill)
    a[0:4] = arr
    got = _zp(tmp_path / "b")
    assert got[:4].tolist() == arr.tolist()
    ours = zarr3.open(tmp_path / "b")[...]
    assert ours.dtype == got.dtype and ours.tolist() == got.tolist()


V2_FILTERS = [
    ("<i4", [{"id": "delta", "dtype": "<i4"}]),
    ("<i4", [{"id": "delta", "dtype": "<i4", "astype": "<i2"}, {"id": "shuffle", "elementsize": 2}]),
    ("<f8", [{"id": "fixedscaleoffset", "offset": 1, "scale": 100, "dtype": "<f8", "astype": "<i4"}]),
    ("<f8", [{"id": "quantize", "digits": 2, "dtype": "<f8", "astype": "<f4"}]),
    ("<f8", [{"id": "astype", "encode_dtype": "<f4", "decode_dtype": "<f8"}]),
    ("<f4", [{"id": "bitround", "keepbits": 6}]),
    ("|b1", [{"id": "packbits"}]),
]


def _values(dtype: str) -> np.ndarray:
    i = np.arange(40)
    if dtype == "|b1":
        return (i % 3 == 0).reshape(5, 8)
    return ((i - 7) * (0.37 if dtype[1] == "f" else 3)).astype(dtype).reshape(5, 8)


@pytest.mark.parametrize("dtype, filters", V2_FILTERS)
@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_python_reads_our_filters(tmp_path: Path, dtype: str, filters: list[Any], fmt: int) -> None:
    if fmt == 3 and any(f["id"] == "shuffle" for f in filters):
        filters = filters[:1]  # shuffle is a bytes -> bytes codec in v3
    if fmt == 3 and filters[0]["id"] == "quantize":  # zarr-python's v3 quantize ignores astype
        filters = [{k: v for k, v in filters[0].items() if k != "astype"}]
    vals = _values(dtype)
    a = zarr3.create(tmp_path / "f", shape=(5, 8), chunks=(2, 3), dtype=dtype, zarr_format=fmt, filters=filters)
    a[...] = vals
    got = _zp(tmp_path / "f")
    ours = zarr3.open(tmp_path / "f")[...]
    assert ours.dtype == got.dtype.newbyteorder("=")
    np.testing.assert_array_equal(ours, got)
    if filters[0]["id"] in ("delta", "packbits"):  # lossless
        np.testing.assert_array_equal(ours, vals)


def test_v3_numcodecs_metadata_round_trips(tmp_path: Path) -> None:
    from zarr.codecs import numcodecs as zn

    z = zarr.create_array(
        str(tmp_path / "n"), shape=(10,), chunks=(4,), dtype="<f8",
        filters=[zn.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i2")],
        compressors=[zn.LZMA(), zn.CRC32()],
    )  # fmt: skip
    z[...] = np.arange(10) / 10
    a = zarr3.open(tmp_path / "n", mode="r+")
    assert [c["name"] for c in a.metadata.chain.to_json()] == [
        "numcodecs.fixedscaleoffset", "bytes", "numcodecs.lzma", "numcodecs.crc32"
    ]  # fmt: skip
    a[3:5] = [7.0, 8.0]
    np.testing.assert_array_equal(_zp(tmp_path / "n"), np.r_[np.arange(3) / 10, 7.0, 8.0, np.arange(5, 10) / 10])


def _blosc_frame() -> bytes:
    codec = compressor_from_v2({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}, 4)
    assert isinstance(codec, BloscCodec)
    return bytes(codec.encode(np.arange(256, dtype="<i4").tobytes()))


def test_blosc_trailing_bytes_are_ignored_like_zarr_python() -> None:
    """z5py pads blosc chunks; the blosc library (and so zarr-python) reads them."""
    numcodecs = pytest.importorskip("numcodecs")
    padded = _blosc_frame() + b"\0" * 13
    codec = compressor_from_v2({"id": "blosc"}, 4)
    assert codec is not None
    want = bytes(numcodecs.Blosc().decode(padded))
    assert bytes(codec.decode(padded, 1024, 1024)) == want == np.arange(256, dtype="<i4").tobytes()
    with pytest.raises(CorruptionError):  # but a frame longer than the data is corrupt
        codec.decode(_blosc_frame()[:-1], 1024, 1024)


def test_blosc_frame_of_missing_compressor_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snappy frame (no Python blosc binding has snappy) without the [snappy] extra is a
    codec limit naming what to install; with it, a frame relabelled snappy is corrupt."""
    import sys

    frame = bytearray(_blosc_frame())
    frame[2] = (frame[2] & 0x1F) | (2 << 5)  # compressor format 2 = snappy
    codec = compressor_from_v2({"id": "blosc"}, 4)
    assert codec is not None
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "cramjam", None)  # as if not installed
        with pytest.raises(CodecUnavailableError) as ei:
            codec.decode(bytes(frame), 1024, 1024)
    assert "snappy" in str(ei.value) and isinstance(ei.value, UnsupportedError)
    assert "pip install 'ocdbt-py[snappy]'" in str(ei.value)
    pytest.importorskip("cramjam")
    with pytest.raises(CorruptionError):  # its lz4 streams are no snappy
        codec.decode(bytes(frame), 1024, 1024)


def test_vlen_decoding_is_bounded() -> None:
    from zarr3.codecs.vlen_utf8 import decode_strings

    with pytest.raises(CorruptionError):
        decode_strings(struct.pack("<I", 1 << 30) + b"\0" * 8)  # count larger than the data
    with pytest.raises(CorruptionError):
        decode_strings(struct.pack("<II", 1, 1 << 31) + b"abc")  # item past the end
    with pytest.raises(CorruptionError):
        decode_strings(struct.pack("<II", 1, 2) + b"\xff\xfe")  # not UTF-8


def test_pickle_object_codec_is_refused_not_run(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / ".zarray").write_text(
        '{"zarr_format":2,"shape":[2],"chunks":[2],"dtype":"|O","compressor":null,'
        '"fill_value":null,"filters":[{"id":"pickle","protocol":5}],"order":"C"}'
    )
    with pytest.raises(UnsupportedError, match="pickle"):
        zarr3.open(tmp_path / "p")


def test_fill_values_as_zarr_python_writes_them() -> None:
    from zarr3.metadata_v2 import ArrayMetadataV2
    from zarr3.metadata_v3 import ArrayMetadataV3

    base = {"zarr_format": 2, "shape": [2], "chunks": [2], "compressor": None, "filters": None}
    for fill, want in (("", b""), ("Zm9v", b"foo"), ("Zm8", b"fo"), ("Zm9vYmE=", b"fooba")):
        m = ArrayMetadataV2.from_json({**base, "dtype": "|S5", "fill_value": fill})
        assert m.fill_value is not None and m.fill_value[()] == want and m.data_type.dtype == np.dtype("S5")
    v3 = {"zarr_format": 3, "node_type": "array", "shape": [2], "chunk_grid": {"name": "regular",
          "configuration": {"chunk_shape": [2]}}, "codecs": ["bytes"]}  # fmt: skip
    for fill in (0, 1):
        m3 = ArrayMetadataV3.from_json({**v3, "data_type": "bool", "fill_value": fill})
        assert m3.fill_value[()] == bool(fill)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("dtype", ["M8[ns]", "m8[10s]", ">M8[D]"])
def test_zarr_python_reads_our_datetimes(tmp_path: Path, fmt: int, dtype: str) -> None:
    vals = (np.arange(5, dtype="int64") * 3 - 2).view(np.dtype(dtype).newbyteorder("="))
    fill = np.array(-(1 << 63), "int64").view(vals.dtype)[()]  # NaT
    a = zarr3.create(tmp_path / "t", shape=(7,), chunks=(3,), dtype=dtype, zarr_format=fmt, fill_value=fill)
    a[0:5] = vals
    got = _zp(tmp_path / "t")
    ours = zarr3.open(tmp_path / "t")[...]
    assert ours.dtype == got.dtype.newbyteorder("=") == vals.dtype
    assert ours.view("int64").tolist() == got.astype(ours.dtype).view("int64").tolist()
    assert ours[:5].tolist() == vals.tolist() and np.isnat(ours[5:]).all()


@pytest.mark.parametrize("fmt", [2, 3])
def test_object_bytes_keep_trailing_nuls_and_missing_reads_empty(tmp_path: Path, fmt: int) -> None:
    a = zarr3.create(tmp_path / "o", shape=(5,), chunks=(2,), dtype=object, zarr_format=fmt)
    a[0:3] = [b"a\x00", b"\x00\x00", b"z"]
    a[3] = b"q\x00"
    got = _zp(tmp_path / "o")
    ours = zarr3.open(tmp_path / "o")[...]
    assert ours.tolist() == got.tolist() == [b"a\x00", b"\x00\x00", b"z", b"q\x00", b""]


ZARR2_PYTHON = os.environ.get("ZARR2_PYTHON", "/work/venvs/zarr2/bin/python")
_ZARR2_READ = """
import base64, json, sys, zarr
out = {}
for name in sys.argv[2:]:
    v = zarr.open_array(sys.argv[1] + "/" + name, mode="r")[...]
    vals = v.astype("int64").tolist() if v.dtype.kind in "mM" else v.tolist()
    out[name] = [base64.b64encode(x).decode() if isinstance(x, bytes) else x for x in vals]
print(json.dumps(out))
"""


@pytest.mark.skipif(not os.path.exists(ZARR2_PYTHON), reason="zarr-python 2.18 venv (ZARR2_PYTHON) not present")
def test_zarr_python_2_reads_our_v2_arrays(tmp_path: Path) -> None:
    """zarr-python 2.18 (its own venv, as for the fixtures) reads what zarr3 writes as v2."""
    specs: dict[str, tuple[Any, Any, Any, Any]] = {
        "s": (str, ["a", "héllo", "", "x"], None, None),
        "b": (object, [b"a\x00", b"", b"q", b"\x00"], None, None),
        "S": ("S3", [b"ab", b"", b"zz", b"q"], b"zz", None),
        "U": ("U3", ["ab", "日本", "q", ""], "q", None),
        "M": ("M8[ns]", np.arange(4).astype("M8[ns]"), None, None),
        "d": ("<i4", np.arange(4) * 5, 0, [
            {"id": "delta", "dtype": "<i4", "astype": "<i2"}, {"id": "shuffle", "elementsize": 2},
        ]),
        "q": ("<f8", np.arange(4) * 0.37, 0.0, [{"id": "quantize", "digits": 2, "dtype": "<f8", "astype": "<f4"}]),
        "p": ("|b1", np.arange(4) % 3 == 0, False, [{"id": "packbits"}]),
    }
    ours = {}
    for name, (dtype, values, fill, filters) in specs.items():
        a = zarr3.create(tmp_path / name, shape=(4,), chunks=(3,), dtype=dtype, zarr_format=2,
                         fill_value=fill, filters=filters, compressor={"id": "lzma"})  # fmt: skip
        a[...] = np.asarray(values, dtype=a.dtype) if dtype not in (str, object) else values
        v = zarr3.open(tmp_path / name)[...]
        vals = v.astype("int64").tolist() if v.dtype.kind in "mM" else v.tolist()
        ours[name] = [base64.b64encode(x).decode() if isinstance(x, bytes) else x for x in vals]
    res = subprocess.run([ZARR2_PYTHON, "-c", _ZARR2_READ, str(tmp_path), *specs], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert json.loads(res.stdout) == ours


@pytest.mark.parametrize("fmt", [2, 3])
def test_nan_attributes_as_zarr_python_writes_them(tmp_path: Path, fmt: int) -> None:
    """Python's json writes bare NaN/Infinity literals in attributes; zarr-python reads them."""
    z = zarr.create_array(str(tmp_path / "a"), shape=(2,), dtype="f4", zarr_format=fmt,
                          attributes={"x": float("nan"), "y": [float("-inf"), 1]})  # fmt: skip
    z[...] = [1, 2]
    a = zarr3.open(tmp_path / "a")
    assert np.isnan(a.attrs["x"]) and a.attrs["y"] == [float("-inf"), 1]
    assert a[...].tolist() == [1.0, 2.0]
    g = zarr.open_group(str(tmp_path / "g"), mode="w", zarr_format=fmt)
    g.attrs["v"] = float("inf")
    assert zarr3.open_group(tmp_path / "g").attrs == {"v": float("inf")}


def test_v2_null_fill_datetimes_read_as_nat_like_zarr_python(tmp_path: Path) -> None:
    z = zarr.create_array(str(tmp_path / "t"), shape=(5,), chunks=(2,), dtype="m8[ms]", zarr_format=2,
                          fill_value=None)  # fmt: skip
    z[0:2] = np.array([1, 2], "m8[ms]")
    want = _zp(tmp_path / "t")
    got = zarr3.open(tmp_path / "t")[...]
    assert got.view("int64").tolist() == want.view("int64").tolist()
    assert np.isnat(got[2:]).all()
