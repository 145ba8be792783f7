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



def _mixed_db(tmp_path: Path) -> object:
    db = open_db(str(tmp_path / "mixed"), mode="a")
    with db.transaction() as t:
        for i in range(3000):  # inline (small) and out-of-line (large) values interleaved
            t.put(f"k{i:05d}", bytes([i % 251]) * (7 if i % 3 else 300 + i))
    return open_db(str(tmp_path / "mixed"))


def _expected_locations(entries: list) -> list:
    return [(e.key, None if e.location is None else e.location.file, 0 if e.location is None else e.location.offset,
             e.size) for e in entries]


@pytest.mark.parametrize("built", [False, True])
def test_entry_column_locations_agree_with_entries(tmp_path: Path, built: bool) -> None:
    entries = list(_mixed_db(tmp_path).entries())  # builds that database's value objects
    assert {e.location is None for e in entries} == {True, False}
    db = open_db(str(tmp_path / "mixed"))  # a fresh one: columns straight from the node body

    def flatten(cols: list) -> list:
        out = []
        for c in cols:
            if built:  # the values already built as objects: the generic path
                list(c._values)
            files, fidx, offsets, lengths = c.locations()
            assert len(fidx) == len(offsets) == len(lengths) == len(c.keys)
            out += [(k, None if f < 0 else files[f], o, n) for k, f, o, n in zip(c.keys, fidx, offsets, lengths)]
        return out

    assert flatten(list(db.entry_columns())) == _expected_locations(entries)
    lo, hi = entries[17].key, entries[2901].key
    db = open_db(str(tmp_path / "mixed"))
    assert flatten(list(db.entry_columns(start=lo, stop=hi))) == _expected_locations(entries[17:2901])


def test_value_locations_of_a_plain_list() -> None:
    from ocdbt_py.format.btree import value_locations
    from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference

    a, b = DataFileId(b"d/", b"a"), DataFileId(b"d/", b"b")
    values = [b"xy", IndirectDataReference(a, 10, 5), IndirectDataReference(b, 0, 3), b"",
              IndirectDataReference(a, 99, 1)]
    assert value_locations(values) == ([a, b], [-1, 0, 1, -1, 0], [0, 10, 0, 0, 99], [2, 5, 3, 0, 1])
