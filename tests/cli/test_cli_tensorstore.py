"""The command-line tool and verify on databases written by TensorStore (the oracle)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ocdbt_py
from ocdbt_py.format.btree import LeafNode
from ocdbt_py.keys import escape_key
from ocdbt_py.maintenance.verify import verify
from ocdbt_py.read.btree_read import walk_nodes

ts = pytest.importorskip("tensorstore")

pytestmark = pytest.mark.tensorstore


def _write(path: Path, *, arity: int, numbered: bool = False, commits: int = 20) -> dict[bytes, bytes]:
    """Many small commits (so the version tree has nodes) into small nodes (a deep B+tree)."""
    config = {"max_decoded_node_bytes": 400, "version_tree_arity_log2": arity, "max_inline_value_bytes": 24}
    if numbered:
        config["manifest_kind"] = "numbered"
    kv = ts.KvStore.open({"driver": "ocdbt", "base": path.as_uri(), "config": config}).result()
    items: dict[bytes, bytes] = {}
    for g in range(commits):
        with ts.Transaction() as txn:
            for i in range(8):
                k = f"layer{g:02d}/param{i}".encode()
                v = (f"value {g} {i} " * (i + 1)).encode()
                kv.with_transaction(txn)[k] = v
                items[k] = v
    for k, v in [(b"bin\xff\x00key", b"\x00\xff" * 20), (b"back\\slash", b"b"), (b"nl\nkey", b"n")]:
        kv[k] = v
        items[k] = v
    return items


@pytest.fixture(scope="module")
def ts_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[bytes, bytes]]:
    path = tmp_path_factory.mktemp("ts") / "db"
    return path, _write(path, arity=1)


@pytest.fixture
def ts_copy(ts_db, tmp_path: Path) -> Path:
    dst = tmp_path / "db"
    shutil.copytree(ts_db[0], dst)
    return dst


def test_ls_get_versions_match_tensorstore(cli, ts_db) -> None:
    path, items = ts_db
    kv = ts.KvStore.open({"driver": "ocdbt", "base": path.as_uri()}).result()
    ts_keys = list(kv.list().result())
    assert sorted(ts_keys) == sorted(items)
    r = cli("ls", path)
    assert r.status == 0, r.err
    assert r.out.splitlines() == [escape_key(k) for k in sorted(items)]
    entries = json.loads(cli("ls", "--json", path).out)
    assert [bytes.fromhex(e["key_hex"]) for e in entries] == sorted(items)
    for e in entries[::7] + [e for e in entries if "\\x" in e["key"]]:
        key = bytes.fromhex(e["key_hex"])
        assert e["size"] == len(items[key])
        g = cli("get", path, "--hex", e["key_hex"])
        assert g.status == 0 and g.out_bytes == kv[key] == items[key]
    long = cli("ls", "-l", path).out.splitlines()
    assert any(line.endswith("inline") for line in long)
    assert any(":" in line.split()[-1] and line.split()[-1].startswith("d/") for line in long)
    versions = json.loads(cli("versions", "--json", path).out)
    db = ocdbt_py.open(path)
    assert [v["generation"] for v in versions] == [v.generation for v in db.versions()]
    assert versions[-1]["num_keys"] == len(items)
    info = json.loads(cli("info", "--json", path).out)
    assert info["config"]["version_tree_arity_log2"] == 1 and info["version_node_refs"] > 0


def test_verify_clean_tensorstore_database(cli, ts_db) -> None:
    path, _ = ts_db
    r = cli("verify", path)
    assert r.status == 0, r.out
    db = ocdbt_py.open(path)
    versions = db.versions()
    rep = verify(path)
    assert rep.ok and rep.versions == len(versions) and rep.version_nodes > 0
    # every distinct node is decoded exactly once, however many versions share it
    distinct = set()
    walked = 0
    for v in versions:
        for ref, _, _ in walk_nodes(db._reader, (v.root, v.root_height)):
            distinct.add(ref)
            walked += 1
    assert rep.nodes == len(distinct) < walked
    assert rep.versions_expected == len(versions)


def test_verify_numbered_manifest_database(cli, tmp_path: Path) -> None:
    path = tmp_path / "db"
    _write(path, arity=2, numbered=True, commits=6)
    r = cli("verify", path)
    assert r.status == 0, r.out
    assert json.loads(cli("info", "--json", path).out)["manifest_kind"] == "numbered"


def _leaf_refs(path: Path):
    db = ocdbt_py.open(path)
    latest = db.versions()[-1]
    return [ref for ref, node, _ in walk_nodes(db._reader, (latest.root, latest.root_height))
            if isinstance(node, LeafNode)]


def test_verify_flipped_byte_in_tensorstore_leaf(cli, ts_copy, flip) -> None:
    leaf = _leaf_refs(ts_copy)[0]
    key = leaf.file.path.decode()
    flip(ts_copy / key, leaf.offset + leaf.length - 6)
    r = cli("verify", ts_copy)
    assert r.status == 1
    assert f"{key}@{leaf.offset}" in r.out and "CRC-32C" in r.out


def test_verify_truncated_tensorstore_data_file(cli, ts_copy) -> None:
    leaf = _leaf_refs(ts_copy)[-1]
    f = ts_copy / leaf.file.path.decode()
    f.write_bytes(f.read_bytes()[: leaf.offset + 5])
    r = cli("verify", ts_copy)
    assert r.status == 1 and leaf.file.path.decode() in r.out and "truncated" in r.out


def test_verify_deleted_tensorstore_data_file(cli, ts_copy) -> None:
    victim = sorted((ts_copy / "d").iterdir())[len(list((ts_copy / "d").iterdir())) // 2]
    victim.unlink()
    r = cli("verify", ts_copy)
    assert r.status == 1
    assert f"d/{victim.name}" in r.out and "missing" in r.out
    j = json.loads(cli("verify", ts_copy, "--json").out)
    assert j["ok"] is False and any(p["file"] == f"d/{victim.name}" for p in j["problems"])


def test_subprocess_on_tensorstore_database(subproc, ts_db) -> None:
    path, items = ts_db
    p = subproc("verify", path)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subproc("get", path, "bin\\xff\\x00key", "--escaped")
    assert p.returncode == 0 and p.stdout == items[b"bin\xff\x00key"]
