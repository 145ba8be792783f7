"""Hole 3: chunk allocation bombs and huge declared arrays.

A 13-byte zstd frame that declares 2 GiB (in an array whose chunks are 2 GiB) must not make
reading one element allocate 2 GiB: the frame is judged by its length first (zstd cannot
expand more than 32768x).  An array declaring 2^40 elements must fail with our error naming
the array and the size, not NumPy's ``MemoryError``.  Each case runs in a child process
under an address-space limit, so a regression fails instead of swapping the machine.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import zarr3
from ocdbt_py.errors import CorruptionError, ResourceError
from ocdbt_py.kvstore import MemoryStore
from zarr3.codecs.zstd import MAX_RATIO, zstd_compress, zstd_decompress

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def bomb_frame(size: int) -> bytes:
    """A zstd frame header declaring ``size`` content bytes and holding no block: 13 bytes."""
    return struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", size)


def run_limited(code: str, limit_mib: int = 1024) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter whose address space is capped at ``limit_mib``."""
    prog = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(ROOT)!r})
        resource.setrlimit(resource.RLIMIT_AS, ({limit_mib} << 20, {limit_mib} << 20))
    """) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=100)


def test_bomb_frame_is_13_bytes() -> None:
    assert len(bomb_frame(2 << 30)) == 13


def test_zstd_ratio_bound_is_sound() -> None:
    """The most compressible input (all zeros, RLE blocks) stays within the bound."""
    for n in (1, 1000, 1 << 20, 64 << 20):
        frame = zstd_compress(bytes(n), 19, False)
        assert n <= MAX_RATIO * len(frame), (n, len(frame))
        assert len(zstd_decompress(frame, n, n)) == n


def test_decode_refuses_impossible_size_before_allocating() -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(CorruptionError, match="cannot decompress|holds only"):
            zstd_decompress(bomb_frame(2 << 30), 2 << 30, 2 << 30)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


V3_META = {
    "zarr_format": 3, "node_type": "array", "shape": [1 << 29], "data_type": "float32",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1 << 29]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                  {"name": "zstd", "configuration": {"level": 3, "checksum": False}}],
}


def test_reading_one_element_of_a_bomb_chunk() -> None:
    """In a child limited to 1 GiB of address space: our error, not MemoryError."""
    r = run_limited(f"""
        import json, struct, zarr3
        from ocdbt_py.errors import CorruptionError
        from ocdbt_py.kvstore import MemoryStore
        frame = struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", 2 << 30)
        store = MemoryStore({{"a/zarr.json": {json.dumps(V3_META)!r}.encode(), "a/c/0": frame}})
        a = zarr3.open(store, "a")
        try:
            a[5]
        except CorruptionError as e:
            print("OK", e)
    """)
    assert r.returncode == 0 and r.stdout.startswith("OK"), (r.stdout, r.stderr[-2000:])
    assert "cannot decompress" in r.stdout


def test_zarr2_bomb_chunk() -> None:
    meta = {"zarr_format": 2, "shape": [1 << 29], "chunks": [1 << 29], "dtype": "<f4",
            "compressor": {"id": "zstd", "level": 1}, "fill_value": 0, "order": "C", "filters": None}
    r = run_limited(f"""
        import json, struct, zarr3
        from ocdbt_py.errors import CorruptionError
        from ocdbt_py.kvstore import MemoryStore
        frame = struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", 2 << 30)
        store = MemoryStore({{"a/.zarray": {json.dumps(meta)!r}.encode(), "a/0": frame}})
        try:
            zarr3.open(store, "a")[7]
        except CorruptionError as e:
            print("OK", e)
    """)
    assert r.returncode == 0 and r.stdout.startswith("OK"), (r.stdout, r.stderr[-2000:])


def test_huge_declared_array_read_is_our_error() -> None:
    meta = dict(V3_META, shape=[1 << 40])
    meta["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": [1 << 20]}}
    store = MemoryStore({"big/zarr.json": json.dumps(meta).encode()})
    a = zarr3.open(store, "big")
    with pytest.raises(ResourceError, match=r"big.*\(1099511627776,\)"):
        a[...]
    assert a[3:5].tolist() == [0.0, 0.0]  # a small read of the same array is fine


def _checkpoint_with_huge_array(path: Path) -> None:
    from ocdbt_py import checkpoint

    checkpoint.save(path, {"w": np.arange(4, dtype=np.float32)})
    import ocdbt_py

    db = ocdbt_py.open(path, mode="a")
    keys = [k for k in db.list() if k.endswith(b"/.zarray") or k.endswith(b"/zarr.json")]
    assert keys
    for k in keys:
        doc = json.loads(db[k])
        doc["shape"] = [1 << 40]
        if "chunks" in doc:
            doc["chunks"] = [1 << 20]
        else:
            doc["chunk_grid"]["configuration"]["chunk_shape"] = [1 << 20]
        db[k] = json.dumps(doc).encode()
    db.close()
    meta = json.loads((path / "_METADATA").read_text())
    (path / "_METADATA").write_text(json.dumps(meta))


def test_restoring_a_2_40_element_array_names_it(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _checkpoint_with_huge_array(ck)
    r = run_limited(f"""
        from ocdbt_py import checkpoint
        from ocdbt_py.errors import OcdbtError
        try:
            checkpoint.restore({str(ck)!r})
        except OcdbtError as e:
            print("OK", type(e).__name__, e)
    """, limit_mib=2048)
    assert r.returncode == 0 and r.stdout.startswith("OK"), (r.stdout, r.stderr[-3000:])
    assert "'w'" in r.stdout and ("1099511627776" in r.stdout or "TiB" in r.stdout), r.stdout
