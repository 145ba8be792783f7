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
