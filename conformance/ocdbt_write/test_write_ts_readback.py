"""Databases written by ocdbt_py, read back by TensorStore at every version.

The config matrix of the reader's conformance suite (manifest kinds, compression, inline
limit, node size, version-tree arity, data-file prefixes and sizes), each with a workload of
bulk writes, overwrites, deletes (present and absent keys), range deletes, odd keys (empty,
NUL, 0xFF, 65535 bytes) and values around the inline limit.  Every generation must list and
read identically through TensorStore and ocdbt_py, time travel by commit time must find it,
and ``verify`` must pass.
"""

from __future__ import annotations

import pathlib
import random
import sys
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import ocdbt_py  # noqa: E402
from tests.ocdbt_write.helpers import Model, check_versions, ts_kv  # noqa: E402

pytest.importorskip("tensorstore")

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "raw": {"compression": None},
    "zstd9": {"compression": {"id": "zstd", "level": 9}},
    "numbered": {"manifest_kind": "numbered"},
    "all_out_of_line": {"max_inline_value_bytes": 0},
    "big_inline": {"max_inline_value_bytes": 1 << 20},
    "tiny_nodes": {"max_decoded_node_bytes": 256, "compression": None},
    "unlimited_nodes": {"max_decoded_node_bytes": 0},
    "arity1": {"version_tree_arity_log2": 1},
    "arity2_numbered": {"version_tree_arity_log2": 2, "manifest_kind": "numbered"},
    "prefixes": {
        "value_data_prefix": "values/v-",
        "btree_node_data_prefix": "nodes/",
        "version_tree_node_data_prefix": "versions-",
        "target_data_file_size": 700,
        "version_tree_arity_log2": 1,
    },
    "assume_config": {"assume_config": True, "max_inline_value_bytes": 10},
}


def _workload(db: ocdbt_py.OcdbtStore, rnd: random.Random) -> dict[int, Model]:
    """Run a fixed mix of commits; returns the model of every generation."""
    inline = db.config.max_inline_value_bytes
    models: dict[int, Model] = {}
    model: Model = {}
    if db.generation:
        models[db.generation] = {}

    def snap(gen: int) -> None:
        models[gen] = dict(model)

    sizes = [0, 1, inline, inline + 1, 300] if inline <= 4096 else [0, 1, 300, 5000]
    items = {b"k%04d" % i: bytes([i % 251]) * rnd.choice(sizes) for i in range(120)}
    if inline > 4096:  # the exact boundary once, not for a hundred keys
        items[b"at limit"] = b"L" * inline
        items[b"over limit"] = b"O" * (inline + 1)
    items[b""] = b"empty key"
    items[b"\x00nul"] = b"\x00" * 5
    items[b"\xff" * 3] = b"high"
    items[b"long" * 100] = b"long key"
    with db.transaction() as t:
        for k, v in items.items():
            t.put(k, v)
    model.update(items)
    snap(t.generation)  # type: ignore[arg-type]
    for i in range(0, 120, 7):
        k = b"k%04d" % i
        model[k] = b"overwritten %d" % i + b"x" * (i * 3)
        snap(db.put(k, model[k]))
    model.pop(b"k0003")
    snap(db.delete(b"k0003"))
    snap(db.delete(b"absent key"))  # still a new generation
    for k in [k for k in model if b"k0010" <= k < b"k0030"]:
        del model[k]
    snap(db.delete_range(b"k0010", b"k0030"))
    with db.transaction() as t:
        t.put(b"zz", b"after")
        t.delete_range(b"k0050", b"k0060")
        t.put(b"k0055", b"re-added inside the range")
        t.delete(b"\x00nul")
    for k in [k for k in model if b"k0050" <= k < b"k0060"]:
        del model[k]
    model[b"zz"] = b"after"
    model[b"k0055"] = b"re-added inside the range"
    del model[b"\x00nul"]
    snap(t.generation)  # type: ignore[arg-type]
    big = bytes(rnd.getrandbits(8) for _ in range(5000))
    model[b"big"] = big
    snap(db.put(b"big", big))
    return models


# The reader issue's matrix (conformance/ocdbt/test_ocdbt_ts_matrix.py): a pairwise covering
# array over node size, inline limit, arity, compression and manifest kind.
_NODE_BYTES = [1, 256, 4096, None]
_INLINE = [0, 1, 100, 1 << 20]
_ARITY = [1, 2, 3, 4]
_ZSTD = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1]
_NUMBERED = [0, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0]


def reader_matrix() -> list[dict[str, Any]]:
    rows = []
    for i in range(4):
        for j in range(4):
            r = 4 * i + j
            cfg: dict[str, Any] = {
                "max_inline_value_bytes": _INLINE[j],
                "version_tree_arity_log2": _ARITY[(i + j) % 4],
                "compression": {"id": "zstd", "level": [0, 3, -5, 9][r % 4]} if _ZSTD[r] else None,
                "manifest_kind": "numbered" if _NUMBERED[r] else "single",
            }
            if _NODE_BYTES[i] is not None:
                cfg["max_decoded_node_bytes"] = _NODE_BYTES[i]
            rows.append(cfg)
    return rows


def _row_id(cfg: dict[str, Any]) -> str:
    comp = "raw" if cfg["compression"] is None else f"zstd{cfg['compression']['level']}"
    return (
        f"node{cfg.get('max_decoded_node_bytes', 'default')}-inline{cfg['max_inline_value_bytes']}"
        f"-arity{cfg['version_tree_arity_log2']}-{comp}-{cfg['manifest_kind']}"
    )


@pytest.mark.parametrize("row", range(16), ids=[_row_id(c) for c in reader_matrix()])
def test_reader_matrix_written_by_us(tmp_path: pathlib.Path, row: int) -> None:
    cfg = reader_matrix()[row]
    path = tmp_path / "db"
    db = ocdbt_py.open(path, mode="a", config=cfg)
    models = _workload(db, random.Random(row))
    check_versions(path, models)
    stored = ocdbt_py.open(path).config.to_json()
    for k in ("max_inline_value_bytes", "version_tree_arity_log2", "manifest_kind"):
        assert stored[k] == cfg[k]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_matrix_read_back_by_tensorstore(tmp_path: pathlib.Path, name: str) -> None:
    path = tmp_path / "db"
    db = ocdbt_py.open(path, mode="a", config=CONFIGS[name])
    models = _workload(db, random.Random(name))
    if CONFIGS[name].get("assume_config"):
        assert min(models) == 1 and models[1]  # no empty generation 1
    else:
        assert models[1] == {} if 1 in models else True
    check_versions(path, models)
    # TensorStore sees the config we asked for
    cfg = ts_kv(path).spec().to_json()
    assert "ocdbt" in str(cfg)


def test_long_history_and_gc_free_read_back(tmp_path: pathlib.Path) -> None:
    """300 single-key commits at arity 2 (several version-tree levels), numbered manifests."""
    path = tmp_path / "db"
    db = ocdbt_py.open(path, mode="a", config={"version_tree_arity_log2": 2, "manifest_kind": "numbered"})
    models: dict[int, Model] = {1: {}}
    model: Model = {}
    for i in range(300):
        k = b"key%d" % (i % 37)
        model[k] = b"v%d" % i
        models[db.put(k, model[k])] = dict(model)
    numbered = sorted(p.name for p in path.iterdir() if p.name.startswith("manifest.0"))
    assert len(numbered) == 129 and numbered[-1] == f"manifest.{301:016x}"
    # spot-check a sample of versions through TensorStore (all of them through ocdbt_py)
    sample = {g: models[g] for g in list(models)[::23] + [301]}
    check_versions(path, sample, time_travel=False, exact=False)
    for g, m in models.items():
        assert dict(ocdbt_py.open(path, version=g).items()) == m
