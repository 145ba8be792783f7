"""Issue 30's last peer cases, read with zarr3 and compared with the peer's own reading.

Fixtures: ``conformance/fixtures/zarr_peers/last_cases/`` (written by zarr-python 3.1 and
TensorStore 0.1.86 through its ``make_fixtures.py``, which documents each case and the edits it
makes); the expected arrays beside them are what zarr-python (or, for snappy blosc frames, which
no Python blosc binding decodes, TensorStore) read.  No peer is needed to run these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr3
from ocdbt_py.kvstore import open_kvstore

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "zarr_peers" / "last_cases"
MANIFEST = json.loads((ROOT / "manifest.json").read_text())["cases"]


def _snappy_available() -> bool:
    try:
        import cramjam  # noqa: F401  (optional: the snappy extra)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reads_as_the_peer_reads(name: str) -> None:
    info: dict[str, Any] = MANIFEST[name]
    if name.startswith("blosc_snappy") and name != "blosc_snappy_raw" and not _snappy_available():
        pytest.skip("snappy blosc frames need the [snappy] extra (cramjam)")
    want = np.load(ROOT / "_expected" / f"{name}.npy", allow_pickle=False)
    kv = open_kvstore(str(ROOT / name), read_only=True)
    a = zarr3.open(kv, info["path"])
    got = a[...]
    assert got.shape == want.shape
    assert got.dtype == want.dtype.newbyteorder("=") or got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


# -- snappy blosc frames with several blocks: hand-built, TensorStore as the oracle ------------
# TensorStore writes each chunk as a single blosc block, so frames with several blocks, split
# streams and short last blocks are built here, following c-blosc 1's layout (documented in
# zarr3/codecs/blosc_frames.py), and TensorStore's blosc (which has snappy) must read back the
# values that went in before ours is compared.
def _shuffle(block: bytes, typesize: int, mode: int) -> bytes:
    a = np.frombuffer(block, dtype=np.uint8)
    n = a.size // typesize
    out = a.copy()
    if mode == 1 and typesize > 1:
        out[: n * typesize] = a[: n * typesize].reshape(n, typesize).T.reshape(-1)
    elif mode == 2 and n % 8 == 0:  # blosc 1 bit-shuffles only blocks of whole groups of 8
        bits = np.unpackbits(a[: n * typesize].reshape(n, typesize, 1), axis=-1, bitorder="little")
        out[: n * typesize] = np.packbits(bits.transpose(1, 2, 0), axis=-1, bitorder="little").reshape(-1)
    return out.tobytes()


def _snappy_frame(data: bytes, typesize: int, blocksize: int, mode: int, split: bool) -> bytes:
    import cramjam

    flags = (2 << 5) | {0: 0, 1: 0x01, 2: 0x04}[mode] | (0 if split else 0x10)
    nblocks = -(-len(data) // blocksize)
    body = bytearray()
    starts = []
    base = 16 + 4 * nblocks
    for j in range(nblocks):
        block = data[j * blocksize:(j + 1) * blocksize]
        shuffled = _shuffle(block, typesize, mode)
        leftover = len(block) < blocksize
        nsplits = typesize if split and typesize <= 16 and len(block) // typesize >= 128 and not leftover else 1
        neblock = len(block) // nsplits
        starts.append(base + len(body))
        for k in range(nsplits):
            part = shuffled[k * neblock:(k + 1) * neblock]
            comp = bytes(cramjam.snappy.compress_raw(part))
            if len(comp) >= neblock:
                comp = part  # incompressible stream: stored raw
            body += len(comp).to_bytes(4, "little") + comp
    cbytes = base + len(body)
    header = bytes([2, 1, flags, typesize]) + b"".join(
        v.to_bytes(4, "little") for v in (len(data), blocksize, cbytes))
    return header + b"".join(s.to_bytes(4, "little") for s in starts) + bytes(body)


@pytest.mark.tensorstore
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["noshuffle", "shuffle", "bitshuffle"])
@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
def test_hand_built_snappy_frames(tmp_path: Path, mode: int, split: bool) -> None:
    ts = pytest.importorskip("tensorstore")
    if not _snappy_available():
        pytest.skip("needs cramjam")
    # 1001 float64 in 2 KiB blocks: 3 whole blocks and a short one of 233 elements (not x8)
    data = np.round(np.sin(np.arange(1001) / 7.0), 2)
    frame = _snappy_frame(data.tobytes(), 8, 2048, mode, split)
    meta = {"zarr_format": 2, "shape": [1001], "chunks": [1001], "dtype": "<f8", "order": "C", "fill_value": 0,
            "filters": None, "compressor": {"id": "blosc", "cname": "snappy", "clevel": 5, "shuffle": mode,
                                           "blocksize": 0}}
    (tmp_path / ".zarray").write_text(json.dumps(meta))
    (tmp_path / "0").write_bytes(frame)
    oracle = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path)}}).result().read().result()
    np.testing.assert_array_equal(oracle, data)  # the construction is blosc's own
    np.testing.assert_array_equal(zarr3.open(open_kvstore(str(tmp_path), read_only=True), "")[...], data)


def test_snappy_without_cramjam_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cramjam", None)  # as if not installed
    with pytest.raises(zarr3.CodecUnavailableError, match=r"pip install 'ocdbt-py\[snappy\]'"):
        zarr3.open(open_kvstore(str(ROOT / "blosc_snappy_shuffle"), read_only=True), "")[...]
    # raw frames need no snappy
    want = np.load(ROOT / "_expected" / "blosc_snappy_raw.npy")
    np.testing.assert_array_equal(zarr3.open(open_kvstore(str(ROOT / "blosc_snappy_raw"), read_only=True), "")[...],
                                  want)


@pytest.mark.parametrize("cut", [3, 16, 20, 40, -1])
def test_damaged_snappy_frames_are_corruption(tmp_path: Path, cut: int) -> None:
    if not _snappy_available():
        pytest.skip("needs cramjam")
    from ocdbt_py.errors import CorruptionError
    from zarr3.codecs.blosc_frames import decode_frame, snappy_decoder

    frame = bytearray(_snappy_frame(np.arange(1001, dtype="<f8").tobytes(), 8, 2048, 1, True))
    if cut >= 0:
        frame[cut] ^= 0xFF  # a header byte, a block offset, a stream length or its data
    else:
        frame[-1] ^= 0xFF
    try:
        out = decode_frame(bytes(frame), 8008, snappy_decoder())
    except CorruptionError:
        return
    assert len(out) == 8008  # a flipped data byte may decode: never to another size
