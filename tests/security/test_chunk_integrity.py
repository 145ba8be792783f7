"""Hole 7: silent chunk corruption.

The chunk formats carry no value checksum by default (OCDBT checksums only its own nodes), so
a flipped byte inside a stored chunk decodes to different values.  ``save(checksum=True)``
writes Zarr v2 zstd frames with their content checksum and, with ``use_zarr3``, the
``crc32c`` codec after each chunk; restores then fail loudly on a flipped byte, and ``verify(data=True)`` /
``ocdbt verify --data`` name the damaged chunk.  TensorStore, Orbax and zarr-python/numcodecs
still read what we write.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import crc32c
import numpy as np
import pytest
import zstandard

import ocdbt_py
from ocdbt_py import checkpoint
from ocdbt_py.errors import CorruptionError
from ocdbt_py.maintenance.verify_data import verify_data

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def tree() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "noise": rng.standard_normal((64, 256)).astype(np.float32),  # incompressible: raw zstd blocks
        "ramp": np.arange(4096, dtype=np.int32).reshape(64, 64),
        "small": np.ones(3, np.float16),
    }


def chunk_locations(ck: Path) -> dict[str, tuple[Path, int, int]]:
    """``key -> (data file, offset, length)`` of every out-of-line value in the item database."""
    db = ocdbt_py.open(ck)
    out = {}
    for e in db.entries():
        if e.location is not None:
            out[e.key.decode()] = (ck / e.location.file.path.decode(), e.location.offset, e.location.length)
    return out


def flip(ck: Path, key_part: str, where: float = 0.5) -> str:
    locs = chunk_locations(ck)
    key = next(k for k in sorted(locs) if key_part in k and not k.endswith((".zarray", "zarr.json")))
    path, off, n = locs[key]
    data = bytearray(path.read_bytes())
    data[off + int(n * where)] ^= 0x10
    path.write_bytes(bytes(data))
    return key


@pytest.mark.parametrize("zarr3_", [False, True], ids=["zarr2", "zarr3"])
def test_without_checksum_a_flip_is_silent(tmp_path: Path, zarr3_: bool) -> None:
    """The hole itself: a flipped byte in a raw zstd block restores different values."""
    ck = tmp_path / "ck"
    want = tree()
    checkpoint.save(ck, want, use_zarr3=zarr3_)
    flip(ck, "noise", 0.5)
    got = checkpoint.restore(ck)
    assert not np.array_equal(got["noise"], want["noise"])


@pytest.mark.parametrize("zarr3_", [False, True], ids=["zarr2", "zarr3"])
@pytest.mark.parametrize("where", [0.02, 0.5, 0.97])
def test_with_checksum_a_flip_is_an_error(tmp_path: Path, zarr3_: bool, where: float) -> None:
    ck = tmp_path / "ck"
    want = tree()
    checkpoint.save(ck, want, use_zarr3=zarr3_, checksum=True)
    got = checkpoint.restore(ck)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)
    key = flip(ck, "noise", where)
    with pytest.raises(CorruptionError):
        checkpoint.restore(ck)
    report = verify_data(ck)
    assert not report.ok and [p.key for p in report.problems] == [key], report.format()
    assert report.chunks >= 3


def test_checksum_frames_and_codecs_are_written(tmp_path: Path) -> None:
    for zarr3_ in (False, True):
        ck = tmp_path / f"ck{zarr3_}"
        checkpoint.save(ck, tree(), use_zarr3=zarr3_, checksum=True)
        db = ocdbt_py.open(ck)
        meta_key = "ramp/zarr.json" if zarr3_ else "ramp/.zarray"
        meta = json.loads(db[meta_key.encode()])
        value = db[b"ramp/c/0/0" if zarr3_ else b"ramp/0.0"]
        if zarr3_:
            inner = meta["codecs"][0]["configuration"]["codecs"]
            assert [c["name"] for c in inner] == ["bytes", "zstd", "crc32c"]
            frame = value[: -16 - 4 - 4]  # less the shard index (+ its crc) and the crc32c trailer
            crc = int.from_bytes(value[-16 - 4 - 4: -16 - 4], "little")
            assert crc == crc32c.crc32c(frame)  # the crc32c codec covers the compressed bytes
        else:
            assert meta["compressor"] == {"id": "zstd", "level": 1}  # unchanged for peers
            frame = value
            assert zstandard.get_frame_parameters(frame).has_checksum
        zstandard.ZstdDecompressor().decompress(frame)


def test_checksum_needs_somewhere_to_go(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use_zarr3"):
        checkpoint.save(tmp_path / "ck", tree(), use_compression=False, checksum=True)
    checkpoint.save(tmp_path / "ck3", tree(), use_compression=False, use_zarr3=True, checksum=True)
    report = verify_data(tmp_path / "ck3")
    assert report.ok and report.chunks >= 3
    flip(tmp_path / "ck3", "ramp", 0.5)
    assert [p.key for p in verify_data(tmp_path / "ck3").problems] == ["ramp/c/0/0"]


def test_zarr_python_and_numcodecs_read_checksum_frames(tmp_path: Path) -> None:
    numcodecs = pytest.importorskip("numcodecs")
    ck = tmp_path / "ck"
    want = tree()
    checkpoint.save(ck, want, checksum=True)
    db = ocdbt_py.open(ck)
    raw = numcodecs.Zstd().decode(db[b"ramp/0.0"])
    np.testing.assert_array_equal(np.frombuffer(raw, "<i4").reshape(64, 64), want["ramp"])
    bad = bytearray(db[b"noise/0.0"])
    bad[len(bad) // 2] ^= 1
    with pytest.raises(RuntimeError):  # numcodecs' zstd verifies the frame checksum too
        numcodecs.Zstd().decode(bytes(bad))


def _oracle(code: str) -> subprocess.CompletedProcess[str]:
    prog = "import os, sys\nos.environ.setdefault('JAX_PLATFORMS', 'cpu')\n"
    prog += f"sys.path.insert(0, {str(ROOT)!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("zarr3_", [False, True], ids=["zarr2", "zarr3"])
def test_tensorstore_and_orbax_restore_checksummed_saves(tmp_path: Path, zarr3_: bool) -> None:
    pytest.importorskip("tensorstore")
    pytest.importorskip("orbax.checkpoint")
    ck = tmp_path / "ck"
    want = tree()
    checkpoint.save(ck, want, use_zarr3=zarr3_, checksum=True)
    np.savez(tmp_path / "want.npz", **want)
    bad = tmp_path / "bad"
    checkpoint.save(bad, want, use_zarr3=zarr3_, checksum=True)
    flip(bad, "noise", 0.5)
    r = _oracle(f"""
        import numpy as np, tensorstore as ts, orbax.checkpoint as ocp
        want = dict(np.load({str(tmp_path / 'want.npz')!r}))
        got = ocp.PyTreeCheckpointer().restore({str(ck)!r})
        for k, v in want.items():
            np.testing.assert_array_equal(np.asarray(got[k]), v)
        driver = "zarr3" if {zarr3_} else "zarr"
        for k, v in want.items():
            a = ts.open({{"driver": driver, "kvstore": {{"driver": "ocdbt", "base": "file://{ck}/",
                        "path": k + "/"}}}}).result()
            np.testing.assert_array_equal(a.read().result(), v)
        try:
            a = ts.open({{"driver": driver, "kvstore": {{"driver": "ocdbt", "base": "file://{bad}/",
                        "path": "noise/"}}}}).result()
            a.read().result()
            print("TS-READ-DAMAGED")
        except Exception as e:
            print("TS-REFUSED", type(e).__name__)
        print("OK")
    """)
    assert r.returncode == 0 and "OK" in r.stdout, (r.stdout, r.stderr[-3000:])
    assert "TS-REFUSED" in r.stdout, r.stdout  # TensorStore verifies the checksums as well


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "ocdbt_py.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_verify_data(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    checkpoint.save(ck, tree(), use_zarr3=True, checksum=True)
    r = _cli("verify", "--data", str(ck))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data OK" in r.stdout and "3 arrays" in r.stdout
    key = flip(ck, "ramp", 0.3)
    r = _cli("verify", str(ck))  # the structure is fine: only --data looks inside chunks
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli("verify", "--data", str(ck))
    assert r.returncode == 1 and "array ramp, chunk " + key.removeprefix("ramp/") in r.stdout, r.stdout
    assert "crc32c" in r.stdout, r.stdout + r.stderr
    r = _cli("verify", "--data", "--json", str(ck))
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["ok"] is False
    assert [p["key"] for p in doc["data"]["problems"]] == [key]


@pytest.mark.parametrize("zarr3_", [False, True], ids=["zarr2", "zarr3"])
def test_per_parameter_layout_with_checksum(tmp_path: Path, zarr3_: bool) -> None:
    """``use_ocdbt=False``: chunks are files; a flipped byte in one is an error on restore."""
    ck = tmp_path / "ck"
    want = tree()
    checkpoint.save(ck, want, use_zarr3=zarr3_, use_ocdbt=False, checksum=True)
    got = checkpoint.restore(ck)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)
    chunk = next(p for p in sorted((ck / "noise").rglob("*")) if p.is_file() and not p.name.startswith((".", "zarr")))
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptionError):
        checkpoint.restore(ck)
