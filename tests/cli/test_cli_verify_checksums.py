"""``ocdbt verify --data`` says what it could check: whether stored values carry a checksum
(Orbax's default saves none), and with checksums it fails naming the array and chunk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ocdbt_py
from ocdbt_py import checkpoint
from ocdbt_py.maintenance.verify_data import NO_CHECKSUM

ROOT = Path(__file__).resolve().parents[2]


def _tree() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"w": rng.standard_normal((32, 64)).astype(np.float32), "b": np.arange(16, dtype=np.int32)}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "ocdbt_py.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)


def _flip(ck: Path, key: str, where: float = 0.5) -> None:
    db = ocdbt_py.open(ck)
    e = next(e for e in db.entries() if e.key.decode() == key)
    assert e.location is not None
    path = ck / e.location.file.path.decode()
    data = bytearray(path.read_bytes())
    data[e.location.offset + int(e.location.length * where)] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("zarr3_", [False, True], ids=["zarr2", "zarr3"])
def test_without_checksums_verify_says_what_it_cannot_see(tmp_path: Path, zarr3_: bool) -> None:
    ck = tmp_path / "ck"
    checkpoint.save(ck, _tree(), use_zarr3=zarr3_)
    _flip(ck, "w/c/0/0" if zarr3_ else "w/0.0")  # a flipped byte in a raw zstd block still decodes
    r = _cli("verify", "--data", ck)
    assert r.returncode == 0, r.stdout + r.stderr
    assert NO_CHECKSUM in r.stdout and "data OK" in r.stdout
    doc = json.loads(_cli("verify", "--data", "--json", ck).stdout)
    assert doc["values_checksummed"] is False and doc["data"]["values_checksummed"] is False
    assert doc["data"]["checksummed_chunks"] == 0 and doc["data"]["chunks"] >= 2
    assert json.loads(_cli("verify", "--json", ck).stdout)["values_checksummed"] is None  # not looked at


@pytest.mark.parametrize("zarr3_", [False, True], ids=["zarr2", "zarr3"])
def test_with_checksums_verify_names_array_and_chunk(tmp_path: Path, zarr3_: bool) -> None:
    ck = tmp_path / "ck"
    checkpoint.save(ck, _tree(), use_zarr3=zarr3_, checksum=True)
    r = _cli("verify", "--data", ck)
    assert r.returncode == 0 and NO_CHECKSUM not in r.stdout, r.stdout + r.stderr
    assert "every chunk carries a checksum" in r.stdout
    assert json.loads(_cli("verify", "--data", "--json", ck).stdout)["values_checksummed"] is True
    chunk = "c/0/0" if zarr3_ else "0.0"
    _flip(ck, f"w/{chunk}")
    r = _cli("verify", "--data", ck)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("FAILED: ") and "1 chunk does not decode" in lines[0], r.stdout
    assert not any(line.startswith("OK:") for line in lines), r.stdout
    assert f"array w, chunk {chunk}: " in r.stdout and "data FAILED: 1 chunk does not decode" in r.stdout
    assert "stored bytes" not in r.stdout and ("KiB stored" in r.stdout or " B stored" in r.stdout)


@pytest.mark.parametrize("checksum", [False, True], ids=["default", "checksum"])
def test_stats_and_info_say_whether_values_are_checksummed(tmp_path: Path, checksum: bool) -> None:
    ck = tmp_path / "ck"
    checkpoint.save(ck, _tree(), checksum=checksum)
    stats = _cli("stats", ck)
    assert stats.returncode == 0, stats.stderr
    info = _cli("info", ck)
    assert info.returncode == 0, info.stderr
    doc = json.loads(_cli("info", ck, "--json").stdout)
    assert doc["values_checksummed"] is checksum and doc["checksum_sample"]["sampled"] == 2
    per_tensor = json.loads(_cli("stats", ck, "--json").stdout)
    assert {v["checksummed"] for v in per_tensor.values()} == {checksum}
    if checksum:
        assert "every stored chunk carries a checksum" in stats.stdout
        assert "values checksummed:      yes (" in info.stdout, info.stdout
    else:
        assert NO_CHECKSUM in stats.stdout.splitlines()[-1] and "checksum=True" in stats.stdout
        assert "values checksummed:      no: " + NO_CHECKSUM in info.stdout, info.stdout
