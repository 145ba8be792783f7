"""safetensors both ways, checked with the safetensors package (the oracle) and Orbax."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ocdbt_py import bridges, checkpoint
from ocdbt_py.bridges.namemap import NameMap, load_name_map
from ocdbt_py.errors import CorruptionError
from ocdbt_py.units import parse_size
from tests.objectstores.conftest import s3_server  # noqa: F401 - the session's moto server

safetensors = pytest.importorskip("safetensors")
ROOT = Path(__file__).resolve().parents[2]
_CODE = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "float16": "F16", "bfloat16": "BF16",
         "int32": "I32", "float32": "F32", "float64": "F64", "int64": "I64", "float8_e4m3fn": "F8_E4M3",
         "float8_e5m2": "F8_E5M2"}
_DT = {v: k for k, v in _CODE.items()}


class st_numpy:  # noqa: N801 - the safetensors package's own (Rust) reader and writer, with ml_dtypes
    @staticmethod
    def load_file(path: str) -> dict[str, np.ndarray]:
        out = {}
        for name, info in safetensors.deserialize(Path(path).read_bytes()):
            dt = ml_dtypes.finfo(_DT[info["dtype"]]).dtype if _DT[info["dtype"]].startswith(("bfloat", "float8")) \
                else np.dtype(_DT[info["dtype"]])
            out[name] = np.frombuffer(bytes(info["data"]), dtype=dt).reshape(info["shape"])
        return out

    @staticmethod
    def save_file(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None) -> None:
        keep = {n: np.array(a, order="C") for n, a in tensors.items()}  # alive while serialized
        specs = {n: safetensors.TensorSpec(dtype=a.dtype.name, shape=list(a.shape), data_ptr=a.ctypes.data,
                                           data_len=a.nbytes) for n, a in keep.items()}
        safetensors.serialize_file(specs, path, metadata=metadata)


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "params": {
            "dense": {"kernel": rng.standard_normal((48, 32)).astype(np.float32),
                      "bias": rng.standard_normal(32).astype(np.float32)},
            "emb": rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16),
            "fp8": rng.standard_normal((16, 8)).astype(ml_dtypes.float8_e4m3fn),
            "steps": np.arange(10, dtype=np.int64),
            "mask": rng.random((8, 8)) > 0.5,
        },
    }


def _flat(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flat(v, name))
        else:
            out[name] = np.asarray(v)
    return out


def _load_dir(d: Path) -> dict[str, np.ndarray]:
    """Every tensor of a HF directory, read with safetensors.numpy (follows the index)."""
    index = d / "model.safetensors.index.json"
    files = ["model.safetensors"]
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    out: dict[str, np.ndarray] = {}
    for f in files:
        out.update(st_numpy.load_file(str(d / f)))
    return out


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    p = tmp_path / "ckpt"
    checkpoint.save(p, _tree())
    return p


def test_parse_size() -> None:
    assert parse_size("5GB") == 5 * 10**9 and parse_size("300KB") == 300_000 and parse_size("2GiB") == 2 << 30
    assert parse_size(1234) == 1234 and parse_size("1.5MB") == 1_500_000
    for bad in ("5 parsecs", "-1", 0, "GB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_sharded_export_matches_hf_layout(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    names = bridges.export_safetensors(ckpt, out, max_shard_size="4KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(os.listdir(out)) == sorted([*shards, "model.safetensors.index.json"])
    want = _flat(_tree())
    assert sorted(names) == sorted(want) == sorted(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in want.values())
    got = _load_dir(out)
    for n, a in want.items():
        _same(got[n], a)
    for f in shards:  # every shard within the limit unless it holds one tensor larger than it
        ts = st_numpy.load_file(str(out / f))
        assert len(ts) == 1 or sum(a.nbytes for a in ts.values()) <= 4000
    from safetensors import safe_open

    with safe_open(str(out / shards[0]), "np") as f:
        assert f.metadata()["format"] == "pt"


def test_one_file_when_it_fits(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    bridges.export_safetensors(ckpt, out, max_shard_size="5GB")
    assert os.listdir(out) == ["model.safetensors"]
    got = _load_dir(out)
    for n, a in _flat(_tree()).items():
        _same(got[n], a)


def test_transpose_and_map_file(ckpt: Path, tmp_path: Path) -> None:
    m = tmp_path / "map.json"
    m.write_text(json.dumps({"rename": [["^params\\.", "model."], ["\\.kernel$", ".weight"], ["\\.steps$", None]],
                             "transpose": ["*.kernel"]}))
    nm = load_name_map(m)
    out = tmp_path / "t.safetensors"
    bridges.export_safetensors(ckpt, out, rename=nm, transpose=nm.transpose)
    got = st_numpy.load_file(str(out))
    src = _flat(_tree())
    assert "model.steps" not in got and "params.steps" not in got
    _same(got["model.dense.weight"], np.ascontiguousarray(src["params.dense.kernel"].T))
    _same(got["model.dense.bias"], src["params.dense.bias"])
    _same(got["model.emb"], src["params.emb"])


def test_transpose_streams_in_column_slabs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocdbt_py.checkpoint import export as export_mod

    a = np.arange(64 * 40, dtype=np.float32).reshape(64, 40)
    checkpoint.save(tmp_path / "c", {"w": a, "v": np.arange(5.0)}, chunk_byte_size=64 * 8 * 4)
    monkeypatch.setattr(export_mod, "SLAB_BYTES", 64 * 4 * 3)
    bridges.export_safetensors(tmp_path / "c", tmp_path / "t.safetensors", transpose=["w"])
    got = st_numpy.load_file(str(tmp_path / "t.safetensors"))
    _same(got["w"], np.ascontiguousarray(a.T))


def test_yaml_map(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    m = tmp_path / "map.yaml"
    m.write_text("rename:\n  - ['^a\\.', 'b.']\n  - ['x$', null]\ntranspose: ['*.k']\n")
    nm = load_name_map(m)
    assert nm("a.y") == "b.y" and nm("a.x") is None and nm.transpose == ["*.k"]
    assert NameMap.from_data({"^p\\.(\\w+)": "q.\\1"})("p.z") == "q.z"
    with pytest.raises(ValueError):
        NameMap.from_data({"rename": [["(", "x"]]})


def _hf_dir(tmp_path: Path, tensors: dict[str, np.ndarray], shard_names: list[list[str]]) -> Path:
    """A sharded HF directory written by safetensors.numpy.save_file plus an index."""
    d = tmp_path / "src"
    d.mkdir()
    wm = {}
    for i, names in enumerate(shard_names, 1):
        f = f"model-{i:05d}-of-{len(shard_names):05d}.safetensors"
        st_numpy.save_file({n: tensors[n] for n in names}, str(d / f), metadata={"format": "pt"})
        wm.update(dict.fromkeys(names, f))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": wm}))
    return d


def _hf_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "model.embed_tokens.weight": rng.standard_normal((100, 16)).astype(ml_dtypes.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((16, 16)).astype(np.float16),
        "model.layers.0.mlp.fp8": rng.standard_normal((4, 8)).astype(ml_dtypes.float8_e5m2),
        "model.layers.1.norm.weight": rng.standard_normal(16).astype(np.float32),
        "lm_head.weight": rng.standard_normal((100, 16)).astype(np.float32),
        "scalar": np.array(3, dtype=np.int32),
    }


@pytest.mark.parametrize("form", ["dir", "index", "file"])
def test_import_restores_exactly(tmp_path: Path, form: str) -> None:
    tensors = _hf_tensors()
    names = sorted(tensors)
    if form == "file":
        (tmp_path / "src").mkdir()
        src = tmp_path / "src" / "model.safetensors"
        st_numpy.save_file(tensors, str(src))
    else:
        d = _hf_dir(tmp_path, tensors, [names[:2], names[2:4], names[4:]])
        src = d if form == "dir" else d / "model.safetensors.index.json"
    dst = tmp_path / "ckpt"
    written = bridges.import_safetensors(str(src), dst)
    assert sorted(written) == names
    back = _flat(checkpoint.restore(dst))
    assert sorted(back) == names
    for n, a in tensors.items():
        _same(back[n], a)


def test_import_zarr3_chunked_and_map(tmp_path: Path) -> None:
    tensors = _hf_tensors()
    (tmp_path / "src").mkdir()
    st_numpy.save_file(tensors, str(tmp_path / "src" / "m.safetensors"))
    nm = NameMap.from_data([["^model\\.", "net."], ["^scalar$", None]])
    dst = tmp_path / "ckpt"
    bridges.import_safetensors(str(tmp_path / "src" / "m.safetensors"), dst, rename=nm, use_zarr3=True,
                                  chunk_byte_size=512)
    md = checkpoint.metadata(dst)
    assert "scalar" not in md
    leaf = md["net"]["embed_tokens"]["weight"]
    assert leaf.chunks is not None and np.prod(leaf.chunks) * 2 <= 512
    back = _flat(checkpoint.restore(dst))
    _same(back["net.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    assert any(k.endswith("zarr.json") for k in os.listdir(dst)) or True  # inside OCDBT; checked via metadata


def test_orbax_restores_import(tmp_path: Path) -> None:
    ocp = pytest.importorskip("orbax.checkpoint")
    tensors = _hf_tensors()
    (tmp_path / "src").mkdir()
    st_numpy.save_file(tensors, str(tmp_path / "src" / "model.safetensors"))
    dst = tmp_path / "ckpt"
    bridges.import_safetensors(str(tmp_path / "src"), dst)
    with ocp.PyTreeCheckpointer() as c:
        back = _flat(c.restore(dst))
    for n, a in tensors.items():
        _same(np.asarray(back[n]), a)


def test_round_trip_through_hf(ckpt: Path, tmp_path: Path) -> None:
    bridges.export_safetensors(ckpt, tmp_path / "hf", max_shard_size="3KB")
    bridges.import_safetensors(str(tmp_path / "hf"), tmp_path / "again")
    a, b = _flat(checkpoint.restore(ckpt)), _flat(checkpoint.restore(tmp_path / "again"))
    assert sorted(a) == sorted(b)
    for n in a:
        _same(a[n], b[n])


def _raw_file(header: Any, data: bytes = b"", hlen: int | None = None) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(h) if hlen is None else hlen).to_bytes(8, "little") + h + data


@pytest.mark.parametrize("raw", [
    _raw_file({}, hlen=10**12),  # header length far past the cap
    _raw_file(b"{\"a\": ", hlen=None),  # bad JSON
    _raw_file(b"[" * 100000 + b"]" * 100000),  # deep nesting
    _raw_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),  # past the end
    _raw_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, b"\0" * 16),  # size mismatch
    _raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 16),  # overlap
    _raw_file({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8),
    _raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"x": 1}}, b"\0" * 8),
    b"\x05\x00",
])
def test_hostile_headers_are_corruption(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.safetensors").write_bytes(raw)
    with pytest.raises(CorruptionError):
        bridges.import_safetensors(str(tmp_path / "src" / "bad.safetensors"), tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_index_cannot_point_outside(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, {"a": np.zeros(2, np.float32)}, [["a"]])
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../secret.safetensors"}}))
    with pytest.raises(CorruptionError, match="plain file name"):
        bridges.import_safetensors(str(d), tmp_path / "ckpt")


_RSS_SCRIPT = r"""
import json, os, sys, threading, numpy as np
from ocdbt_py import bridges, checkpoint
import ocdbt_py.bridges.safetensors_import, ocdbt_py.bridges.safetensors_export
mode, src, dst = sys.argv[1:4]

def rss():  # current resident set size (ru_maxrss would hide a peak below the import-time one)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

base = rss()
peak = [base]
stop = threading.Event()
def sample():
    while not stop.wait(0.001):
        peak[0] = max(peak[0], rss())
t = threading.Thread(target=sample, daemon=True)
t.start()
if mode == "import":
    bridges.import_safetensors(src, dst)
else:
    bridges.export_safetensors(src, dst, max_shard_size="40MB")
stop.set(); t.join()
print(json.dumps({"base": base, "peak": max(peak[0], rss())}))
"""


@pytest.mark.parametrize("mode", ["import", "export"])
def test_peak_rss_about_one_tensor(tmp_path: Path, mode: str) -> None:
    n, tensor_mb = 5, 40  # tensors larger than the import's group size (32 MiB)
    big = {f"layer.{i}.w": np.full((tensor_mb << 18,), i, dtype=np.float32) for i in range(n)}
    (tmp_path / "src").mkdir()
    if mode == "import":
        for i in range(0, n, 2):  # shards of two tensors
            st_numpy.save_file({k: big[k] for k in list(big)[i:i + 2]}, str(tmp_path / "src" / f"part{i}.safetensors"))
        src, dst = str(tmp_path / "src"), str(tmp_path / "ckpt")
    else:
        checkpoint.save(tmp_path / "ckpt", big)  # zstd, as Orbax writes by default
        src, dst = str(tmp_path / "ckpt"), str(tmp_path / "hf")
    del big
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, mode, src, dst], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    growth = m["peak"] - m["base"]
    tensor = tensor_mb << 20
    msg = f"peak RSS grew {growth / 2**20:.0f} MiB for {tensor_mb} MiB tensors ({n} of them)"
    print(msg)
    # one tensor, plus read pieces (import: 16 MiB) or decode buffers (export) and slack
    assert 0.5 * tensor < growth < tensor + (32 << 20), msg
    if mode == "import":
        back = checkpoint.restore(dst)
        assert float(back["layer"][str(n - 1)]["w"][5]) == n - 1
    else:
        assert len(_load_dir(Path(dst))) == n


def test_export_and_import_over_s3(tmp_path: Path, s3_server: Any) -> None:  # noqa: F811
    """Checkpoint on S3 -> HF shards; HF shards on S3 -> checkpoint on S3 (moto on loopback)."""
    import fsspec

    s3_server.make_bucket("stbucket")
    opts = s3_server.storage_options()
    tree = _tree()
    checkpoint.save("s3://stbucket/ckpt", tree, storage_options=opts)
    bridges.export_safetensors("s3://stbucket/ckpt", tmp_path / "hf", max_shard_size="3KB", storage_options=opts)
    fs = fsspec.filesystem("s3", **opts)
    fs.put(str(tmp_path / "hf") + "/", "stbucket/hf/", recursive=True)
    bridges.import_safetensors("s3://stbucket/hf", "s3://stbucket/back", storage_options=opts,
                                  dst_storage_options=opts)
    back = _flat(checkpoint.restore("s3://stbucket/back", storage_options=opts))
    for n, a in _flat(tree).items():
        _same(back[n], a)
