"""Arrays written by zarr-python 2.18 (v2), zarr-python 3 (v2 and v3) and buffers encoded by
numcodecs, read with zarr3 and compared element for element, dtype and shape with what the
writer's own reader returned (``conformance/fixtures/zarr_peers/``, made by its
``make_fixtures.py``; no peer needed to run these).

String arrays: zarr3 returns NumPy ``StringDType`` for ``vlen-utf8`` (as zarr-python 3 does);
zarr-python 2 returns object arrays of ``str`` there, which we count as the same type.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr3
from zarr3.codecs import FILTERS, compressor_from_v2

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "zarr_peers"
WRITERS = ("zarr2_18", "zarr3_v2", "zarr3_v3")


def _cases() -> list[Any]:
    out = []
    for w in WRITERS:
        manifest = json.loads((ROOT / w / "manifest.json").read_text())
        for name, info in sorted(manifest["cases"].items()):
            if "skipped" not in info:
                out.append(pytest.param(w, name, id=f"{w}-{name}"))
    return out


def _expected(writer: str, name: str) -> np.ndarray:
    npy = ROOT / writer / "_expected" / f"{name}.npy"
    if npy.exists():
        return np.load(npy, allow_pickle=False)
    doc = json.loads((ROOT / writer / "_expected" / f"{name}.json").read_text(encoding="utf-8"))
    values = [base64.b64decode(v["b64"]) if isinstance(v, dict) and set(v) == {"b64"} else v for v in doc["values"]]
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    if doc["dtype"] == "StringDType":
        return arr.astype(np.dtypes.StringDType()).reshape(doc["shape"])
    return arr.reshape(doc["shape"])


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype.kind in "OT" or got.dtype.kind in "OT":
        if want.dtype.kind == "T" or got.dtype.kind == "T":
            assert got.dtype.kind == "T", got.dtype  # str elements: StringDType
            assert all(isinstance(x, str) for x in want.reshape(-1).tolist())
        else:
            assert got.dtype == want.dtype
        assert got.reshape(-1).tolist() == want.reshape(-1).tolist()
        return
    assert got.dtype == want.dtype.newbyteorder("="), (got.dtype, want.dtype)
    want_native = want.astype(got.dtype)
    assert got.tobytes() == want_native.tobytes()  # bit-exact (NaN payloads, -0.0)


@pytest.mark.parametrize("writer, name", _cases())
def test_read_peer_array(writer: str, name: str) -> None:
    a = zarr3.open(str(ROOT / writer / name))
    assert_same(a[...], _expected(writer, name))
    # a strided selection goes through the partial-chunk path
    assert_same(a[1::2, ::3], _expected(writer, name)[1::2, ::3])


def test_matrix_is_complete() -> None:
    """Every case the writers could write is read (skips are the writers' own limits)."""
    for w in WRITERS:
        m = json.loads((ROOT / w / "manifest.json").read_text())
        skipped = {k for k, v in m["cases"].items() if "skipped" in v}
        assert skipped <= {"obj_json2", "obj_categorize"}, (w, skipped)
        assert len(m["cases"]) >= 37


NUMCODECS = json.loads((ROOT / "numcodecs" / "manifest.json").read_text())["buffers"]
INPUTS = np.load(ROOT / "numcodecs" / "inputs.npz")


def _ours(config: dict[str, Any], itemsize: int) -> Any:
    cid = config["id"]
    if cid in FILTERS and cid != "shuffle":
        return FILTERS[cid].from_config(config, "filter")
    return compressor_from_v2(config, itemsize)


@pytest.mark.parametrize("key", sorted(NUMCODECS))
def test_decode_numcodecs_buffers(key: str) -> None:
    """Buffers numcodecs encoded itself, decoded by our implementation of each codec."""
    info = NUMCODECS[key]
    enc = (ROOT / "numcodecs" / f"{key}.enc").read_bytes()
    want = np.load(ROOT / "numcodecs" / f"{key}.npy", allow_pickle=False)
    src = INPUTS[info["input"]]
    codec = _ours(info["config"], src.dtype.itemsize)
    if isinstance(codec, zarr3.codecs.Filter):
        got = np.asarray(codec.decode(np.frombuffer(enc, np.uint8)))
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        again = np.asarray(codec.decode(np.asarray(codec.encode(src)).reshape(-1).view(np.uint8)))
        assert again.tobytes() == want.tobytes()  # our encoding decodes to the same values
    else:
        got = codec.resolve(zarr3.codecs.ChunkSpec((src.size,), zarr3.dtypes.data_type_from_numpy(src.dtype)), "c")
        out = bytes(got.decode(enc, len(want.tobytes()), len(want.tobytes())))
        assert out == want.tobytes()


OBJECT_BUFFERS = json.loads((ROOT / "numcodecs" / "manifest.json").read_text())["object_buffers"]


def _unjson(v: Any) -> Any:
    return base64.b64decode(v["b64"]) if isinstance(v, dict) and set(v) == {"b64"} else v


@pytest.mark.parametrize("key", sorted(OBJECT_BUFFERS))
def test_decode_numcodecs_object_codecs(key: str) -> None:
    info = OBJECT_BUFFERS[key]
    enc = (ROOT / "numcodecs" / f"{key}.enc").read_bytes()
    flt = FILTERS[info["config"]["id"]].from_config(info["config"], "filters[0]")
    want = [_unjson(v) for v in info["values"]]
    got = flt.decode(np.frombuffer(enc, np.uint8))
    assert got.reshape(-1).tolist() == want
    assert flt.decode(flt.encode(got)).reshape(-1).tolist() == want
    numcodecs = pytest.importorskip("numcodecs")
    src = np.empty(len(want), dtype=object)
    src[:] = want
    theirs = numcodecs.get_codec(dict(info["config"])).decode(bytes(np.asarray(flt.encode(src))))
    assert np.asarray(theirs).reshape(-1).tolist() == want


@pytest.mark.parametrize("key", sorted(NUMCODECS))
def test_numcodecs_decodes_our_encoding(key: str) -> None:
    numcodecs = pytest.importorskip("numcodecs")
    info = NUMCODECS[key]
    src = INPUTS[info["input"]]
    codec = _ours(info["config"], src.dtype.itemsize)
    peer = numcodecs.get_codec(dict(info["config"]))
    if isinstance(codec, zarr3.codecs.Filter):
        enc = np.asarray(codec.encode(src))
        assert np.asarray(peer.encode(src)).tobytes() == enc.tobytes()
    else:
        spec = zarr3.codecs.ChunkSpec((src.size,), zarr3.dtypes.data_type_from_numpy(src.dtype))
        enc = bytes(codec.resolve(spec, "c").encode(src.tobytes()))
        dec = peer.decode(enc)
        assert bytes(np.asarray(dec).reshape(-1).view(np.uint8)) == src.tobytes()
