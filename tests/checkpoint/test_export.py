"""Streaming export to .safetensors and .npz, checked with the safetensors package and NumPy."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ocdbt_py import bridges, checkpoint
from ocdbt_py.checkpoint import export as export_mod
from ocdbt_py.errors import UnsupportedError
from tests.checkpoint.conftest import Corpus

safetensors = pytest.importorskip("safetensors")


ST_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
             "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
             "F64": np.float64, "I64": np.int64, "U64": np.uint64, "F8_E4M3": ml_dtypes.float8_e4m3fn,
             "F8_E5M2": ml_dtypes.float8_e5m2, "C64": np.complex64}


def _st_load(path: Path | bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file with the safetensors package's own (Rust) parser."""
    raw = path if isinstance(path, bytes) else path.read_bytes()
    out = {}
    for name, info in safetensors.deserialize(raw):
        dt = np.dtype(ST_DTYPES[info["dtype"]])
        out[name] = np.frombuffer(bytes(info["data"]), dtype=dt).reshape(info["shape"])
    n = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + n]).get("__metadata__", {})
    return out, meta


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(_flat(v, f"{prefix}.{i}" if prefix else str(i)))
    else:
        out[prefix] = tree
    return out


def test_safetensors_of_every_dtype(orbax_corpus: Corpus, tmp_path: Path) -> None:
    src = orbax_corpus.path("pytree_zarr3_ocdbt")
    tree = checkpoint.restore(src)
    out = tmp_path / "model.safetensors"
    # int4 has no safetensors code: leave it out by renaming it to None
    names = bridges.export_safetensors(src, out, rename=lambda n: None if n == "params.i4" else n)
    got, meta = _st_load(out)
    flat = _flat(tree)
    md = _flat(checkpoint.metadata(src))
    assert set(got) == set(names)
    for name, arr in got.items():
        want = np.asarray(flat[name])  # Python scalars are exported with their stored dtype:
        assert arr.dtype == md[name].dtype and arr.shape == md[name].shape, name
        np.testing.assert_array_equal(arr, want, err_msg=name)
    assert meta["name"] == "hello world" and meta["lst.2"] == "in a list"
    assert "params.layer0.kernel" in got and got["params.layer0.kernel"].shape == (8, 16)
    assert "nothing" not in got and "params.i4" not in got
    # the safetensors numpy loader agrees on the types it knows
    from safetensors.numpy import load_file

    with pytest.raises(Exception):  # noqa: B017 - it lacks BF16 etc., so the whole file is refused
        load_file(str(out))


def test_safetensors_cast_and_rename(orbax_corpus: Corpus, tmp_path: Path) -> None:
    src = orbax_corpus.path("chunked_zarr2")
    out = tmp_path / "cast.safetensors"
    names = bridges.export_safetensors(src, out, dtype="bfloat16", rename={"big": "model.w", "tiny": None})
    assert sorted(names) == ["model.w", "rep"]
    got, _ = _st_load(out)
    full = checkpoint.restore(src)
    assert got["model.w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got["model.w"], full["big"].astype(ml_dtypes.bfloat16))
    from safetensors.numpy import load_file

    f32 = tmp_path / "f32.safetensors"
    bridges.export_safetensors(src, f32)
    loaded = load_file(str(f32))  # a file of standard dtypes loads with the stock loader
    np.testing.assert_array_equal(loaded["big"], full["big"])


def test_safetensors_streams_in_slabs(orbax_corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tiny slab size, large tensors are read in chunk-row slabs, never whole."""
    monkeypatch.setattr(export_mod, "SLAB_BYTES", 64 * 1024)
    src = orbax_corpus.path("chunked_zarr3")
    reads: list[Any] = []
    from ocdbt_py.checkpoint.restore.reader import ArrayReader

    orig = ArrayReader.read_rows

    def spy(self: ArrayReader, requests: Any) -> Any:
        got = orig(self, requests)
        reads.extend((req[0], a.nbytes) for req, a in got)
        return got

    monkeypatch.setattr(ArrayReader, "read_rows", spy)
    out = tmp_path / "slabs.safetensors"
    bridges.export_safetensors(src, out)
    big_reads = [n for p, n in reads if p == "big"]
    md = checkpoint.metadata(src)["big"]
    band = md.chunks[0] * md.shape[1] * 4  # one row of chunks: never split (each chunk decoded once)
    assert band == 128 * 1024
    assert len(big_reads) == md.shape[0] // md.chunks[0] and max(big_reads) == band
    got, _ = _st_load(out)
    monkeypatch.setattr(ArrayReader, "read_rows", orig)
    np.testing.assert_array_equal(got["big"], checkpoint.restore(src)["big"])


def test_safetensors_step_dir_prefixes_item_names(orbax_corpus: Corpus, tmp_path: Path) -> None:
    step = orbax_corpus.path("manager") / orbax_corpus.cases["manager"]["step_dir"]
    buf = io.BytesIO()
    names = bridges.export_safetensors(step, buf)
    assert "params.w" in names and "opt_state.mu.w" in names and "opt_state.count" in names
    got, _ = _st_load(buf.getvalue())
    assert got["opt_state.count"].shape == ()
    only = bridges.export_safetensors(step, tmp_path / "p.safetensors", item="params")
    assert sorted(only) == ["b", "w"]


def test_safetensors_refuses_unsupported_dtype(orbax_corpus: Corpus, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="int4"):
        bridges.export_safetensors(orbax_corpus.path("pytree_zarr3_ocdbt"), tmp_path / "x.safetensors")


def test_npz(orbax_corpus: Corpus, tmp_path: Path) -> None:
    src = orbax_corpus.path("std_zarr2_ocdbt")
    out = tmp_path / "model.npz"
    names = checkpoint.export_npz(src, out)
    tree = _flat(checkpoint.restore(src))
    with np.load(out) as z:
        assert sorted(z.files) == sorted(names)
        for name in names:
            want = np.asarray(tree[name])
            if want.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
                assert z[name].dtype == np.float32
                np.testing.assert_array_equal(z[name], want.astype(np.float32))
            elif want.dtype.name == "int4":
                assert z[name].dtype == np.int8
                np.testing.assert_array_equal(z[name], want.astype(np.int8))
            else:
                assert z[name].dtype == want.dtype
                np.testing.assert_array_equal(z[name], want)
    comp = tmp_path / "c.npz"
    checkpoint.export_npz(src, comp, compress=True, dtype="float16")
    with np.load(comp) as z:
        assert z["params.layer0.kernel"].dtype == np.float16


def test_export_duplicate_names_rejected(orbax_corpus: Corpus, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="two tensors"), warnings.catch_warnings():
        bridges.export_safetensors(orbax_corpus.path("chunked_zarr2"), tmp_path / "d.safetensors",
                                      rename=lambda n: "same")


def test_slabs_follow_shards_with_smaller_inner_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Orbax 0.5 wrote shards of several inner chunks: slabs must follow shard rows."""
    monkeypatch.setattr(export_mod, "SLAB_BYTES", 64)
    src = Path(__file__).resolve().parents[2] / "conformance/fixtures/checkpoint/orbax-0.5.10/ckpt/pytree_zarr3"
    out = tmp_path / "o5.safetensors"
    bridges.export_safetensors(src, out)
    got, _ = _st_load(out)
    np.testing.assert_array_equal(got["params.kernel"], np.arange(32, dtype=np.float32).reshape(4, 8) / 4)
    np.testing.assert_array_equal(got["counts"], np.arange(8, dtype=np.int32))
