"""Golden fixtures: databases TensorStore wrote, read by ocdbt-py without TensorStore.

Each ``conformance/fixtures/ocdbt/<name>/`` has a ``<name>.expected.json`` recording what
TensorStore reads from it (see ``make_fixtures.py``).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from ocdbt_oracle import check_store, expand_contents, oracle_from_tensorstore

import ocdbt_py
from ocdbt_py.kvstore import MemoryStore

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ocdbt"
NAMES = sorted(os.path.basename(p)[: -len(".expected.json")] for p in glob.glob(str(FIXTURES / "*.expected.json")))


def load(name: str) -> dict[str, Any]:
    with open(FIXTURES / f"{name}.expected.json") as f:
        return json.load(f)


def memory_copy(root: Path) -> MemoryStore:
    files = {}
    for path in root.rglob("*"):
        if path.is_file():
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return MemoryStore(files, read_only=True)


def test_fixture_set_is_complete() -> None:
    assert set(NAMES) >= {
        "raw_commits",
        "zstd_default",
        "numbered_arity2",
        "deep_tiny_nodes",
        "arity1_many_versions",
        "merged_root",
        "empty_db",
        "emptied_db",
        "binary_keys",
    }
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 600_000, total


@pytest.mark.parametrize("name", NAMES)
def test_golden_fixture_local(name: str) -> None:
    check_store(FIXTURES / name, load(name))


@pytest.mark.parametrize("name", NAMES)
def test_golden_fixture_memory_store(name: str) -> None:
    check_store(memory_copy(FIXTURES / name), load(name), deep=False)


def test_golden_features_present() -> None:
    """The fixtures really contain what they claim to cover."""
    zstd = load("zstd_default")
    assert zstd["config"]["compression"] == {"id": "zstd"}
    db = ocdbt_py.open(FIXTURES / "zstd_default")
    # at least one node body above 4096 bytes, i.e. a zstd frame without a content size
    import zstandard

    big = 0
    for n in zstd["btree_nodes"]:
        from ocdbt_oracle import parse_location

        _, ref = parse_location(n["location"])
        blob = db.kvstore.get(ref.file.path.decode(), (ref.offset, ref.offset + ref.length))
        assert blob is not None
        params = zstandard.get_frame_parameters(blob[14:-4])
        if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
            big += 1
    assert big >= 1

    numbered = load("numbered_arity2")
    assert numbered["manifest_kind"] == "numbered"
    assert {r["height"] for r in numbered["manifest_version_nodes"]} >= {1, 2}

    deep = load("deep_tiny_nodes")
    assert max(v["root_height"] for v in deep["versions"]) >= 4

    arity1 = load("arity1_many_versions")
    assert max(n["height"] for n in arity1["version_nodes"]) >= 3

    merged = load("merged_root")
    bases = {e["indirect"].split(":")[1] for n in merged["btree_nodes"] for e in n["entries"] if "indirect" in e}
    assert bases == {"ocdbt.process_0/", "ocdbt.process_1/"}

    assert [v["root"] for v in load("empty_db")["versions"]] == [None]
    emptied = load("emptied_db")["versions"]
    assert emptied[-1]["root"] is None and any(v["root"] for v in emptied)

    last = expand_contents(load("binary_keys"))
    keys = [k for k, _ in last[max(last)]]
    assert b"" in keys and b"K" * 65535 in keys and any(b"\xff" in k for k in keys)


def test_merged_root_and_process_dbs_agree() -> None:
    """Orbax reads the merged root; each per-process database holds its part of the keys."""
    root = ocdbt_py.open(FIXTURES / "merged_root")
    merged = dict(root.items())
    parts: dict[bytes, bytes] = {}
    for pid in (0, 1):
        child = ocdbt_py.open(FIXTURES / "merged_root" / f"ocdbt.process_{pid}")
        part = dict(child.items())
        assert part and not set(part) & set(parts)
        parts.update(part)
    assert merged == parts
    # out-of-line values of the root live in the children's data files
    locs = {e.location.file.base_path for e in root.entries() if e.location is not None}
    assert locs == {b"ocdbt.process_0/", b"ocdbt.process_1/"}


def test_fixture_copy_missing_data_file_is_corruption(tmp_path: Path) -> None:
    """A child directory deleted from a merged root: reading its values fails cleanly."""
    dest = tmp_path / "m"
    shutil.copytree(FIXTURES / "merged_root", dest)
    shutil.rmtree(dest / "ocdbt.process_1")
    db = ocdbt_py.open(dest)
    keys = list(db.list())  # the tree itself lives in the root's own data file
    assert keys
    with pytest.raises(ocdbt_py.CorruptionError):
        dict(db.items())


@pytest.mark.parametrize("name", NAMES)
def test_fixture_still_matches_tensorstore(name: str) -> None:
    """Where TensorStore is installed, its reading of each fixture equals the stored JSON."""
    pytest.importorskip("tensorstore")
    stored = load(name)
    live = oracle_from_tensorstore(str(FIXTURES / name), seed=len(name), description=stored["description"])
    for key in ("config", "manifest_kind", "versions", "contents", "btree_nodes", "version_nodes", "probes"):
        assert live[key] == stored[key], key
