"""Issue 32, hole 1: a local chunk read sizes its buffers from the bytes stored, not from the
chunk size the metadata declares.

A 20-byte chunk file under metadata declaring 1 GiB chunks used to cost over 1 GiB (2 GiB
without a compressor) to read one element from a local directory: zarr3's local fetcher
allocated and zero-filled a buffer of the declared encoded size, then a chunk-sized scratch
buffer, before the frame was judged.  Every case here reads one element of such an array in a
child process limited to 1.5 GiB of address space and must fail with our error while its peak
resident memory grows by less than 64 MiB.
"""

from __future__ import annotations

import bz2
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.security.childproc import run_child

pytestmark = pytest.mark.timeout(180)

GIB_F32 = 1 << 28  # float32 elements in 1 GiB
TWENTY = bytes(range(20))

V2_COMPRESSORS: dict[str, Any] = {
    "none": None,
    "zstd": {"id": "zstd", "level": 1},
    "zlib": {"id": "zlib", "level": 1},
    "gzip": {"id": "gzip", "level": 1},
    "bz2": {"id": "bz2", "level": 1},
    "lzma": {"id": "lzma", "format": 1, "check": -1, "preset": None, "filters": None},
    "blosc": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
    "lz4": {"id": "lz4", "acceleration": 1},
}


def _v3(codecs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"zarr_format": 3, "node_type": "array", "shape": [GIB_F32], "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [GIB_F32]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0.0, "codecs": codecs}


BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
V3_CODECS: dict[str, list[dict[str, Any]]] = {
    "bytes": [BYTES],
    "bytes_crc32c": [BYTES, {"name": "crc32c"}],
    "zstd": [BYTES, {"name": "zstd", "configuration": {"level": 3, "checksum": False}}],
    "gzip": [BYTES, {"name": "gzip", "configuration": {"level": 1}}],
    "sharded": [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [GIB_F32], "codecs": [BYTES, {"name": "gzip", "configuration": {"level": 1}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end"}}],
}


def _shard_of_20_bytes() -> bytes:
    """A 20-byte shard: one inner chunk of 4 bytes at offset 0, then its index (16 bytes and a
    CRC-32C): a well-formed index pointing at a chunk far too short for its declared size."""
    import crc32c

    index = struct.pack("<QQ", 0, 4)
    return b"\x1f\x8b\x08\x00" + index + struct.pack("<I", crc32c.crc32c(index))


def make_arrays(root: Path) -> list[str]:
    """One array per case below ``root``, each with a single 20-byte chunk."""
    names = []
    for name, comp in V2_COMPRESSORS.items():
        d = root / f"v2_{name}"
        d.mkdir()
        (d / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": [GIB_F32], "chunks": [GIB_F32], "dtype": "<f4", "compressor": comp,
            "fill_value": 0, "order": "C", "filters": None}))
        (d / "0").write_bytes(TWENTY)
        names.append(d.name)
    # a well-formed bz2 stream (bz2 has no useful bound on its ratio): decodes to 1000 bytes
    d = root / "v2_bz2_valid"
    d.mkdir()
    (d / ".zarray").write_text((root / "v2_bz2" / ".zarray").read_text())
    (d / "0").write_bytes(bz2.compress(bytes(1000)))
    names.append(d.name)
    for name, codecs in V3_CODECS.items():
        d = root / f"v3_{name}"
        (d / "c").mkdir(parents=True)
        (d / "zarr.json").write_text(json.dumps(_v3(codecs)))
        (d / "c" / "0").write_bytes(_shard_of_20_bytes() if name == "sharded" else TWENTY)
        names.append(d.name)
    return names


def test_twenty_byte_chunks_under_1_gib_declared(tmp_path: Path) -> None:
    names = make_arrays(tmp_path)
    got = run_child(f"""
        import zarr3
        for name in {names!r}:
            def case(name=name):
                return zarr3.open({str(tmp_path)!r}, name)[5]
            case.__name__ = name
            measure(case)
    """, limit_mib=1536)
    assert sorted(got) == sorted(names)
    for name, (mib, _secs, outcome) in got.items():
        assert outcome.startswith("CorruptionError"), (name, outcome)
        assert mib < 64, (name, mib, outcome)


def test_a_real_chunk_still_reads(tmp_path: Path) -> None:
    """The same local fetcher reads honest chunks of mixed sizes (its buffer grows)."""
    import numpy as np

    import zarr3

    a = zarr3.create(str(tmp_path / "a"), shape=(300_000,), chunks=(100_000,), dtype="float32",
                     codecs=[BYTES, {"name": "zstd", "configuration": {"level": 1, "checksum": False}}])
    data = np.concatenate([np.zeros(100_000), np.random.default_rng(0).random(200_000)]).astype(np.float32)
    a[...] = data
    np.testing.assert_array_equal(zarr3.open(str(tmp_path / "a"))[...], data)
