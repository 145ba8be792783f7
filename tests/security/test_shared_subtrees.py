"""Hole 2: B+tree nodes whose entries share one child ("shared subtrees", a DAG).

About 30 KB of valid, correctly ordered nodes that share one child F times per level describe
F^3 keys.  Listing, ``verify`` and a checkpoint restore must stop at the second visit of a
node (a :class:`CorruptionError` / a reported problem), in time and memory proportional to
the stored bytes, not to the keys described.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

import ocdbt_py
from ocdbt_py import checkpoint
from ocdbt_py.errors import CorruptionError, OcdbtError
from ocdbt_py.format.btree import BtreeChild, encode_interior_node, encode_leaf_node
from ocdbt_py.format.data_file_table import IndirectDataReference, Statistics
from ocdbt_py.format.manifest import decode_manifest, encode_manifest
from ocdbt_py.format.version_tree import BtreeGenerationReference
from ocdbt_py.kvstore import MemoryStore
from ocdbt_py.maintenance.verify import verify
from tests import peak_rss
from tests.ocdbt.ocdbt_craft import RAW, DbFiles, Tree, generation, single_manifest, write_dir

pytestmark = pytest.mark.timeout(120)

FAN = 1000  # 10^9 keys from three levels


def dag(db: DbFiles, fan: int = FAN, file: str = "d/dag") -> tuple[IndirectDataReference, Statistics]:
    """A height-2 subtree: root -> fan x one interior node -> fan x one leaf of fan keys."""
    keys = [b"%04d" % i for i in range(fan)]
    leaf = encode_leaf_node([b"k" + k for k in keys], [b"v"] * fan, None)
    lref = db.append(leaf, file)
    lstats = Statistics(fan, len(leaf), 0)
    mid = encode_interior_node(1, keys, [4] * fan, [BtreeChild(lref, lstats)] * fan, None)
    mref = db.append(mid, file)
    mstats = Statistics(fan * fan, len(mid) + fan * len(leaf), 0)
    top = encode_interior_node(2, keys, [4] * fan, [BtreeChild(mref, mstats)] * fan, None)
    tref = db.append(top, file)
    return tref, Statistics(fan ** 3, len(top) + fan * mstats.num_tree_bytes, 0)


def dag_db(fan: int = FAN) -> dict[str, bytes]:
    db = DbFiles()
    ref, stats = dag(db, fan)
    db.put("manifest.ocdbt", single_manifest(RAW, [generation(1, Tree(ref, 2, stats))]))
    return db.as_dict()




def test_dag_is_small_and_valid_per_node() -> None:
    files = dag_db()
    assert sum(len(v) for v in files.values()) < 40_000


@pytest.mark.parametrize("op", ["list", "items", "entries", "len"])
def test_listing_a_dag_stops_at_the_shared_node(op: str) -> None:
    s = ocdbt_py.open(MemoryStore(dag_db()))
    t0, rss0 = time.perf_counter(), peak_rss.start()
    n = 0
    with pytest.raises(CorruptionError, match="reached twice"):
        if op == "len":
            n = len(list(s.list()))
        else:
            for _ in getattr(s, op)():
                n += 1
    assert n <= FAN  # the first leaf's keys at most
    assert time.perf_counter() - t0 < 5
    assert peak_rss.grown_kib(rss0) < 64 * 1024


def test_point_reads_of_a_dag_still_work() -> None:
    """A lookup visits one node per level: bounded whatever the sharing, and correct."""
    s = ocdbt_py.open(MemoryStore(dag_db()))
    assert s.get(b"0007" + b"0999" + b"k0003") == b"v"
    assert s.get(b"0007" + b"0999" + b"x") is None


def test_verify_reports_the_shared_subtree() -> None:
    t0 = time.perf_counter()
    report = verify(MemoryStore(dag_db()))
    assert time.perf_counter() - t0 < 10
    assert not report.ok
    assert any("shared" in p.message for p in report.problems), [str(p) for p in report.problems]
    assert report.nodes <= 3


def test_verify_small_dag_is_not_ok() -> None:
    """The 27,000-key DAG of the report (fan 30): statistics all consistent, still a problem."""
    report = verify(MemoryStore(dag_db(30)))
    assert not report.ok and report.nodes == 3


def _graft_dag(db_dir: Path) -> None:
    """Add a generation whose tree is the checkpoint's own tree plus a DAG under ``zz``."""
    m = decode_manifest((db_dir / "manifest.ocdbt").read_bytes())
    last = m.versions[-1]
    assert last.root is not None
    files = DbFiles()
    dref, dstats = dag(files, file="d/dag")
    # lift the old root to height 2 with single-child interior nodes, next to the DAG root
    ref, h, st = last.root, last.root_height, last.statistics
    while h < 2:
        blob = encode_interior_node(h + 1, [b""], [0], [BtreeChild(ref, st)], None)
        ref = files.append(blob, "d/dag")
        st = Statistics(st.num_keys, st.num_tree_bytes + len(blob), st.num_indirect_value_bytes)
        h += 1
    top = encode_interior_node(3, [b"", b"zz"], [0, 2], [BtreeChild(ref, st), BtreeChild(dref, dstats)], None)
    tref = files.append(top, "d/dag")
    total = Statistics(st.num_keys + dstats.num_keys, st.num_tree_bytes + dstats.num_tree_bytes + len(top), 0)
    gen = BtreeGenerationReference(last.generation_number + 1, tref, 3, total, last.commit_time + 1)
    write_dir(db_dir, files.as_dict())
    (db_dir / "manifest.ocdbt").write_bytes(encode_manifest(dataclasses.replace(
        m, config=dataclasses.replace(m.config, manifest_kind=0), versions=(gen,), version_nodes=())))


def test_checkpoint_restore_with_a_dag_is_bounded(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    want = {"w": np.arange(12, dtype=np.float32), "b": np.ones(3, np.int32)}
    checkpoint.save(ck, want)
    assert (ck / "manifest.ocdbt").exists()  # the item's database (it refers to process_0's files)
    _graft_dag(ck)
    t0, rss0 = time.perf_counter(), peak_rss.start()
    # the restore lists the whole item (value_sizes): it meets the DAG and stops
    with pytest.raises(OcdbtError, match="reached twice"):
        checkpoint.restore(ck)
    assert time.perf_counter() - t0 < 10
    assert peak_rss.grown_kib(rss0) < 256 * 1024
