"""``metadata()`` of a 100k-parameter checkpoint: a fixed number of requests (not one per leaf),
and the same answer as for the local directory; and the column scan it relies on
(``OcdbtStore.entry_columns``) against the per-entry ``entries()``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.store import open as open_db
from tests.checkpoint.conftest import subprocess_env

HERE = Path(__file__).resolve().parent


def _tree(n: int) -> dict[str, dict[str, np.ndarray]]:
    return {f"layer{k}": {f"w{i}": np.full((i % 3 + 1,), k * 100 + i, np.float32) for i in range(100)}
            for k in range(n // 100)}


def test_metadata_of_100k_leaves_takes_no_per_leaf_requests(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(HERE / "_metadata_scaling_worker.py"), str(tmp_path)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    small, big = r["1000"], r["100000"]
    # the same requests whatever the number of leaves: listing, small files, manifest, B+tree
    assert big["requests"] <= small["requests"] + 2, (small, big)
    assert big["requests"] <= 20 and big["depth"] <= 10, big
    assert big["depth"] <= small["depth"] + 1
    assert (big["layers"], big["per_layer"]) == (1000, [100])
    shape, dtype, _, stored, nstored, path = big["sample"]
    assert (shape, dtype, nstored, path) == ([3], "float32", 1, ["layer7", "w5"]) and stored > 0
    assert big["last"][0] == [1]
    # and the same answer through the counting store as from the local directory
    assert big["same_as_local"] and small["same_as_local"]
    # _METADATA read by the specialised scanner, every LeafMetadata field as from the generic parser
    assert big["scanner_taken"] and big["scanner_same"] and big["leaves"] == 100_000, big


@pytest.fixture(scope="module")
def mid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("md") / "ck20k"
    checkpoint.save(str(path), _tree(20_000), sync=False)
    return path


def test_entry_columns_agree_with_entries(mid: Path) -> None:
    db = open_db(str(mid))
    entries = list(db.entries())
    cols = list(db.entry_columns())
    keys = [k for c in cols for k in c.keys]
    sizes = [s for c in cols for s in c.sizes]
    assert keys == [e.key for e in entries]
    assert sizes == [e.size for e in entries]
    got = [v for c in cols for v in c.inline(range(len(c.keys)))]
    assert got == [e.inline for e in entries]
    # a sub-range (start inside a leaf) keeps positions relative to the run
    lo, hi = entries[1234].key, entries[34321].key
    sub = list(db.entry_columns(start=lo, stop=hi))
    assert [k for c in sub for k in c.keys] == [e.key for e in entries[1234:34321]]
    assert [v for c in sub for v in c.inline(range(len(c.keys)))] == [e.inline for e in entries[1234:34321]]

