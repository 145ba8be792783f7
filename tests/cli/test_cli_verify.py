"""``ocdbt verify`` and :func:`ocdbt_py.maintenance.verify.verify` on clean and damaged databases."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

import ocdbt_py
from ocdbt_py.cli.progress import Progress
from ocdbt_py.kvstore import MemoryStore
from ocdbt_py.maintenance.verify import VerifyReport, verify


def test_clean_database_exits_0(cli, tiny_db) -> None:
    r = cli("verify", tiny_db.root)
    assert r.status == 0, r.out + r.err
    assert r.out.startswith("OK: ")
    assert "checked 2 versions" in r.out


def test_report_counts(tiny_db) -> None:
    rep = verify(tiny_db.root)
    assert rep.ok and rep.complete
    n = len(tiny_db.items)
    # generation 1: 4 keys in 2 leaves + root; generation 2: 8 keys in 3 leaves + root
    assert (rep.versions, rep.versions_expected, rep.nodes) == (2, 2, 7)
    assert rep.values == n + n // 2
    assert rep.data_files == 2
    big = [v for v in tiny_db.items.values() if len(v) > 16]
    assert rep.indirect_values == len(big) + 1  # b/y is also in generation 1
    sizes = sum(tiny_db.path(f).stat().st_size for f in tiny_db.data_files)
    assert rep.bytes_checked == sizes  # every byte of both files is a node or a value
    j = rep.to_json()
    assert json.loads(json.dumps(j))["ok"] is True


def test_truncated_data_file(cli, tiny_db) -> None:
    f = tiny_db.path("d/gen0002")
    f.write_bytes(f.read_bytes()[:150])
    r = cli("verify", tiny_db.root)
    assert r.status == 1
    assert r.out.startswith("FAILED: ")
    assert "d/gen0002" in r.out and "truncated" in r.out
    assert "Traceback" not in r.out + r.err


def test_flipped_byte_in_a_node(cli, tiny_db, flip) -> None:
    leaf = tiny_db.leaves[1]
    flip(tiny_db.path("d/gen0002"), leaf.offset + leaf.length // 2)
    r = cli("verify", tiny_db.root)
    assert r.status == 1
    assert f"d/gen0002@{leaf.offset}" in r.out and "CRC-32C mismatch" in r.out
    # the rest of the tree was still checked
    assert "checked 2 versions" in r.out


def test_deleted_data_file(cli, tiny_db) -> None:
    tiny_db.path("d/gen0001").unlink()
    r = cli("verify", tiny_db.root)
    assert r.status == 1
    assert "d/gen0001" in r.out and "missing" in r.out
    # one problem for the file, not one per reference
    assert "1 problem" in r.out


def test_wrong_leaf_statistic(cli, make_db, tmp_path: Path) -> None:
    db = make_db(tmp_path / "db", bad_leaf_stats=True)
    r = cli("verify", db.root)
    assert r.status == 1
    assert "statistics" in r.out and "num_keys=" in r.out
    assert f"d/gen0002@{db.leaves[0].offset}" in r.out
    assert "1 problem" in r.out  # the parent's own sums are consistent: only the entry is wrong


def test_wrong_root_statistic(make_db, tmp_path: Path) -> None:
    db = make_db(tmp_path / "db", bad_root_stats=True)
    rep = verify(db.root)
    assert not rep.ok
    [p] = rep.problems
    assert p.generation == 2 and p.file == "d/gen0002" and "num_indirect_value_bytes" in p.message


def test_key_order_across_nodes(make_db, tmp_path: Path) -> None:
    db = make_db(tmp_path / "db", bad_entry_key=True)
    rep = verify(db.root)
    assert [p.file for p in rep.problems] == ["d/gen0002"]
    assert "below its parent entry's key" in rep.problems[0].message


def test_several_problems_and_max_problems(cli, tiny_db, flip) -> None:
    tiny_db.path("d/gen0001").unlink()
    for leaf in tiny_db.leaves:
        flip(tiny_db.path("d/gen0002"), leaf.offset + 20)
    rep = verify(tiny_db.root)
    assert len(rep.problems) == 4 and rep.complete
    rep = verify(tiny_db.root, max_problems=2)
    assert len(rep.problems) == 2 and not rep.complete
    r = cli("verify", tiny_db.root, "--max-problems", "2")
    assert r.status == 1 and "stopped after the first 2" in r.out
    j = json.loads(cli("verify", tiny_db.root, "--json").out)
    assert j["ok"] is False and len(j["problems"]) == 4
    assert {p["file"] for p in j["problems"]} == {"d/gen0001", "d/gen0002"}


def test_latest_and_single_version(cli, tiny_db) -> None:
    tiny_db.path("d/gen0001").unlink()  # only generation 1 uses it
    assert cli("verify", tiny_db.root, "--latest").status == 0
    assert cli("verify", tiny_db.root, "--version", "2").status == 0
    r = cli("verify", tiny_db.root, "--version", "1")
    assert r.status == 1 and "d/gen0001" in r.out
    assert cli("verify", tiny_db.root).status == 1
    db = ocdbt_py.open(tiny_db.root, version=2)
    assert verify(db, all_versions=False).versions == 1


def test_verify_accepts_a_kvstore_and_reports_progress(tiny_db) -> None:
    store = MemoryStore({
        p.relative_to(tiny_db.root).as_posix(): p.read_bytes() for p in tiny_db.root.rglob("*") if p.is_file()
    })
    seen: list[int] = []
    rep = verify(store, progress=lambda r: seen.append(r.nodes))
    assert rep.ok and rep.nodes == 7
    assert seen and seen[-1] == 7 and seen == sorted(seen)


def test_no_database_raises_not_found(tmp_path: Path) -> None:
    with pytest.raises(ocdbt_py.NotFoundError):
        verify(tmp_path)


@pytest.mark.parametrize("zstd", [None, 3])
def test_hostile_damage_never_raises(make_db, tmp_path: Path, zstd: int | None) -> None:
    """Random byte damage anywhere in the data files: always a report, never an exception."""
    db = make_db(tmp_path / "db", zstd=zstd)
    files = {f: db.path(f).read_bytes() for f in db.data_files}
    rng = random.Random(1234)
    detected = 0
    for _ in range(60):
        for f, data in files.items():
            db.path(f).write_bytes(data)
        f = rng.choice(db.data_files)
        data = bytearray(files[f])
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        db.path(f).write_bytes(bytes(data))
        rep = verify(db.root)
        assert isinstance(rep, VerifyReport)
        detected += not rep.ok
        for p in rep.problems:
            assert p.file in (f, None) and str(p)
    # damage to out-of-line values is invisible (values carry no checksum), the rest is found
    assert detected > 30


def test_shared_subtrees_are_checked_once(make_db, tmp_path: Path, monkeypatch) -> None:
    from ocdbt_py.maintenance import verify as verify_mod

    db = make_db(tmp_path / "db")
    # a third generation that reuses generation 1's root node
    from ocdbt_py.format.manifest import decode_manifest, encode_manifest
    from ocdbt_py.format.version_tree import BtreeGenerationReference

    m = decode_manifest(db.path("manifest.ocdbt").read_bytes())
    v1, v2 = m.versions
    v3 = BtreeGenerationReference(3, v1.root, v1.root_height, v1.statistics, v2.commit_time + 1)
    db.path("manifest.ocdbt").write_bytes(encode_manifest(type(m)(m.config, (*m.versions, v3), ())))
    rep = verify(db.root)
    assert rep.ok and rep.versions == 3 and rep.nodes == 7
    # when the memory of checked nodes overflows, shared nodes are simply checked again
    monkeypatch.setattr(verify_mod, "_MEMO_BYTES", 1)
    rep = verify(db.root)
    assert rep.ok and rep.versions == 3 and rep.nodes == 7 + 3


def test_progress_line_draws_and_erases() -> None:
    buf = io.StringIO()
    with Progress("verifying", enabled=True, stream=buf, delay=0) as bar:
        bar.update(1, 4, "1/4 versions")
    text = buf.getvalue()
    assert "verifying [" in text and "25%" in text and "1/4 versions" in text
    assert text.endswith("\r")
    quiet = io.StringIO()
    with Progress("x", enabled=False, stream=quiet, delay=0) as bar:
        bar.update(1, 2)
    assert quiet.getvalue() == ""


def test_cli_progress_flag(cli, tiny_db) -> None:
    # --progress forces the line on (drawing is delayed, so a tiny walk stays quiet) and must
    # not disturb the report on stdout
    r = cli("verify", tiny_db.root, "--progress")
    assert r.status == 0 and r.out.startswith("OK")


def test_tallest_tree_is_walked(tmp_path: Path) -> None:
    """A chain of 255 levels (the most a height byte allows) is checked without recursion errors."""
    from ocdbt_py.format.btree import BtreeChild, encode_interior_node, encode_leaf_node
    from ocdbt_py.format.config import Config
    from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
    from ocdbt_py.format.manifest import Manifest, encode_manifest
    from ocdbt_py.format.version_tree import BtreeGenerationReference

    fid = DataFileId(b"", b"d/chain")
    buf = bytearray()
    enc = encode_leaf_node([b"k"], [b"v"], None)
    ref = IndirectDataReference(fid, 0, len(enc))
    buf += enc
    stats = Statistics(1, len(enc), 0)
    for h in range(1, 256):
        enc = encode_interior_node(h, [b"k"], [0], [BtreeChild(ref, stats)], None)
        ref = IndirectDataReference(fid, len(buf), len(enc))
        buf += enc
        stats = stats._replace(num_tree_bytes=stats.num_tree_bytes + len(enc))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "chain").write_bytes(bytes(buf))
    version = BtreeGenerationReference(1, ref, 255, stats, 1)
    (tmp_path / "manifest.ocdbt").write_bytes(encode_manifest(Manifest(Config(), (version,), ())))
    rep = verify(tmp_path)
    assert rep.ok, [str(p) for p in rep.problems]
    assert rep.nodes == 256


def test_unsafe_paths_and_failing_storage_are_problems(tmp_path: Path, make_db) -> None:
    from ocdbt_py.errors import StorageError
    from ocdbt_py.format.btree import encode_leaf_node
    from ocdbt_py.format.config import Config
    from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
    from ocdbt_py.format.manifest import Manifest, encode_manifest
    from ocdbt_py.format.version_tree import BtreeGenerationReference

    # a leaf whose value points outside the database
    evil = IndirectDataReference(DataFileId(b"", b"../../etc/passwd"), 0, 10)
    leaf = encode_leaf_node([b"k"], [evil], None)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(leaf)
    root = IndirectDataReference(DataFileId(b"", b"d/f"), 0, len(leaf))
    v = BtreeGenerationReference(1, root, 0, Statistics(1, len(leaf), 10), 1)
    (tmp_path / "manifest.ocdbt").write_bytes(encode_manifest(Manifest(Config(), (v,), ())))
    rep = verify(tmp_path)
    assert len(rep.problems) == 1 and "invalid data file path" in rep.problems[0].message

    # a backend that fails reading one file: reported, and the walk goes on
    db = make_db(tmp_path / "db2")
    files = {p.relative_to(db.root).as_posix(): p.read_bytes() for p in db.root.rglob("*") if p.is_file()}

    class Flaky(MemoryStore):
        def get(self, key, byte_range=None):
            if key == "d/gen0001":
                raise StorageError("simulated outage")
            return super().get(key, byte_range)

    rep = verify(Flaky(files))
    assert rep.problems and all(p.file == "d/gen0001" and "simulated outage" in p.message for p in rep.problems)
    assert rep.versions == 2 and rep.nodes == 4  # generation 2's nodes were all checked
