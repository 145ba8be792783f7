"""Databases written by TensorStore over a configuration matrix, read back by ocdbt-py.

Every key, value and version is compared with TensorStore's own reads (see
:mod:`ocdbt_oracle`), at every generation, together with TensorStore's answers to range
lists, byte-range reads and time travel, and the decoded contents of every node.

The matrix crosses node size (1 byte, 256, 4096, default), inline limit (0, 1, 100, 1 MiB),
version_tree_arity_log2 (1..4), compression (none, zstd) and manifest kind (single,
numbered).  The 16 rows cover every pair of factor values (a pairwise covering array), so
each row exercises a different combination while the whole matrix stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ocdbt_oracle import check_store, expand_contents, oracle_from_tensorstore
from ocdbt_ts_workload import apply_workload, ts_open

import ocdbt_py

ts = pytest.importorskip("tensorstore")

pytestmark = [pytest.mark.tensorstore, pytest.mark.timeout(600)]

NODE_BYTES = [1, 256, 4096, None]
INLINE = [0, 1, 100, 1 << 20]
ARITY = [1, 2, 3, 4]
# columns chosen so every pair of values of any two factors occurs in some row
ZSTD = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1]
NUMBERED = [0, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0]


def matrix() -> list[dict[str, Any]]:
    rows = []
    for i in range(4):
        for j in range(4):
            r = 4 * i + j
            cfg: dict[str, Any] = {
                "max_inline_value_bytes": INLINE[j],
                "version_tree_arity_log2": ARITY[(i + j) % 4],
                "compression": {"id": "zstd", "level": [0, 3, -5, 9][r % 4]} if ZSTD[r] else None,
                "manifest_kind": "numbered" if NUMBERED[r] else "single",
            }
            if NODE_BYTES[i] is not None:
                cfg["max_decoded_node_bytes"] = NODE_BYTES[i]
            rows.append(cfg)
    return rows


def test_matrix_is_pairwise_covering() -> None:
    rows = matrix()
    factors = [
        [r.get("max_decoded_node_bytes") for r in rows],
        [r["max_inline_value_bytes"] for r in rows],
        [r["version_tree_arity_log2"] for r in rows],
        [r["compression"] is not None for r in rows],
        [r["manifest_kind"] for r in rows],
    ]
    for a in range(5):
        for b in range(a + 1, 5):
            pairs = set(zip(factors[a], factors[b]))
            assert len(pairs) == len(set(factors[a])) * len(set(factors[b])), (a, b)


def _row_id(cfg: dict[str, Any]) -> str:
    comp = "raw" if cfg["compression"] is None else f"zstd{cfg['compression']['level']}"
    return (
        f"node{cfg.get('max_decoded_node_bytes', 'default')}-inline{cfg['max_inline_value_bytes']}"
        f"-arity{cfg['version_tree_arity_log2']}-{comp}-{cfg['manifest_kind']}"
    )


@pytest.mark.parametrize("row", range(16), ids=[_row_id(c) for c in matrix()])
def test_matrix_row(tmp_path: Path, row: int) -> None:
    cfg = matrix()[row]
    model = apply_workload(str(tmp_path), cfg, seed=100 + row, commits=14, bulk=30, big_key=row % 5 == 0)
    oracle = oracle_from_tensorstore(str(tmp_path), seed=row)
    # the workload's own model agrees with TensorStore (guards the oracle itself)
    contents = expand_contents(oracle)
    assert [k for k, _ in contents[oracle["versions"][-1]["generation"]]] == sorted(model[-1])
    check_store(str(tmp_path), oracle, deep=row % 2 == 0)


def test_many_commits_prune_numbered_manifests(tmp_path: Path) -> None:
    """141 commits with numbered manifests: files older than 128 generations are pruned, yet
    every generation stays reachable through the version tree."""
    cfg = {"manifest_kind": "numbered", "version_tree_arity_log2": 1, "compression": None}
    kv = ts_open(str(tmp_path), cfg)
    for i in range(140):
        kv.write(f"k{i % 17:02d}".encode(), str(i).encode()).result()
        if i % 10 == 9:
            kv.delete_range(ts.KvStore.KeyRange(b"k0", b"k1")).result()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("manifest.0"))
    assert len(names) < 141  # some were pruned
    oracle = oracle_from_tensorstore(str(tmp_path), nodes=False)
    check_store(str(tmp_path), oracle, deep=False)
    db = ocdbt_py.open(tmp_path)
    assert [v.generation for v in db.versions()] == list(range(1, db.generation + 1))


def test_empty_and_fresh_databases(tmp_path: Path) -> None:
    # opening with TensorStore and reading creates nothing: there is no database
    kv = ts_open(str(tmp_path / "fresh"))
    assert kv.list().result() == []
    with pytest.raises(ocdbt_py.NotFoundError):
        ocdbt_py.open(tmp_path / "fresh")
    # delete_range on a fresh store writes the initial manifest only (generation 1, empty)
    ts_open(str(tmp_path / "empty")).delete_range(ts.KvStore.KeyRange()).result()
    db = ocdbt_py.open(tmp_path / "empty")
    assert db.generation == 1 and list(db.list()) == [] and len(db) == 0 and db.get(b"") is None
    check_store(str(tmp_path / "empty"), oracle_from_tensorstore(str(tmp_path / "empty")))


def test_assume_config_and_data_prefixes(tmp_path: Path) -> None:
    """``assume_config`` (no empty generation 1, as Orbax writes) and custom data-file prefixes."""
    kv = ts_open(
        str(tmp_path),
        {"max_inline_value_bytes": 10, "max_decoded_node_bytes": 200},
        assume_config=True,
        value_data_prefix="values/v-",
        btree_node_data_prefix="nodes/",
        version_tree_node_data_prefix="versions/x",
        target_data_file_size=500,
    )
    for c in range(20):
        txn = ts.Transaction(atomic=True)
        for i in range(5):
            kv.with_transaction(txn).write(f"c{c:02d}/{i}".encode(), bytes([c, i]) * (c * 3)).result()
        txn.commit_async().result()
    dirs = {p.name for p in tmp_path.iterdir()}
    assert {"values", "nodes"} <= dirs and "d" not in dirs
    oracle = oracle_from_tensorstore(str(tmp_path))
    assert oracle["versions"][0]["generation"] == 1 and oracle["versions"][0]["num_keys"] == 5
    check_store(str(tmp_path), oracle)


def test_large_values_and_inline_limits(tmp_path: Path) -> None:
    """A 1 MiB inline value (the largest allowed), 1 MiB + 1 out of line, and a 5 MiB value
    (its data file is padded to 4 KiB)."""
    kv = ts_open(str(tmp_path), {"max_inline_value_bytes": 1 << 20})
    big = bytes(range(256)) * 4096
    kv.write(b"inline", big).result()
    kv.write(b"outofline", big + b"!").result()
    kv.write(b"huge", bytes(range(251)) * 20887).result()
    kv.write(b"empty", b"").result()
    db = ocdbt_py.open(tmp_path)
    entries = {e.key: e for e in db.entries()}
    assert entries[b"inline"].location is None and entries[b"outofline"].location is not None
    assert db.get(b"inline") == big and db.get(b"outofline") == big + b"!"
    assert db.get(b"huge", (5_000_000, 5_000_010)) == (bytes(range(251)) * 20887)[5_000_000:5_000_010]
    assert db.get(b"huge", (-3, None)) == bytes(range(248, 251))
    check_store(str(tmp_path), oracle_from_tensorstore(str(tmp_path)), deep=False)


def test_reads_through_fsspec_memory(tmp_path: Path) -> None:
    """The same database read through fsspec's memory filesystem (a non-local backend)."""
    pytest.importorskip("fsspec")
    import fsspec

    apply_workload(str(tmp_path), {"max_decoded_node_bytes": 300}, seed=7, commits=5, bulk=20)
    oracle = oracle_from_tensorstore(str(tmp_path), nodes=False)
    fs = fsspec.filesystem("memory")
    root = "/ocdbt-conformance-copy"
    for p in tmp_path.rglob("*"):
        if p.is_file():
            fs.pipe(f"{root}/{p.relative_to(tmp_path).as_posix()}", p.read_bytes())
    try:
        check_store(ocdbt_py.open(f"memory://{root}").kvstore, oracle, deep=False)
    finally:
        fs.rm(root, recursive=True)


def test_refresh_sees_new_commits_and_old_views_stay(tmp_path: Path) -> None:
    """A reader opened before TensorStore commits more keeps its generation until refresh()."""
    kv = ts_open(str(tmp_path), {"version_tree_arity_log2": 1})
    kv.write(b"a", b"0").result()
    db = ocdbt_py.open(tmp_path)
    g = db.generation
    old = db.at(g)
    for i in range(1, 11):  # enough commits to roll version-tree buckets over
        kv.write(b"a", str(i).encode()).result()
    assert db.get(b"a") == b"0" and db.generation == g
    db.refresh()
    assert db.generation == g + 10 and db.get(b"a") == b"10"
    assert old.get(b"a") == b"0" and db.at(g).get(b"a") == b"0"
    assert [db.at(g + i).get(b"a") for i in range(11)] == [str(i).encode() for i in range(11)]
    pinned = ocdbt_py.open(tmp_path, version=g + 3)
    assert pinned.generation == g + 3 and pinned.get(b"a") == b"3"
