"""Garbage collection: only files no kept version references, never young files."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

import ocdbt_py
from ocdbt_py.errors import UnsupportedError
from ocdbt_py.maintenance.gc import collect_garbage
from ocdbt_py.timeutil import format_nanoseconds
from tests.ocdbt_write.helpers import assert_verified, data_files

OLD = time.time() + 10 * 3600  # "now" for gc: ten hours after the files were written


def _history(path: Path, kind: str = "single") -> dict[int, dict[bytes, bytes]]:
    db = ocdbt_py.open(path, mode="a", config={"manifest_kind": kind, "version_tree_arity_log2": 1,
                                               "max_inline_value_bytes": 4})
    models: dict[int, dict[bytes, bytes]] = {}
    model: dict[bytes, bytes] = {}
    for i in range(12):
        k = b"k%d" % (i % 4)
        model[k] = b"value number %d" % i
        models[db.put(k, model[k])] = dict(model)
    return models


def _orphan(path: Path) -> Path:
    p = path / "d" / ("ab" * 16)
    p.write_bytes(b"garbage from a crashed commit")
    return p


def test_gc_removes_stale_temporary_files(tmp_path: Path) -> None:
    _history(tmp_path)
    tmp = tmp_path / "d" / ("cd" * 16 + ".__tmp.0123")
    tmp.write_bytes(b"half a data file")
    assert collect_garbage(tmp_path).temp_files == []  # young
    dry = collect_garbage(tmp_path, now=OLD, dry_run=True)
    assert dry.temp_files == [str(tmp.relative_to(tmp_path))] and tmp.exists()
    report = collect_garbage(tmp_path, now=OLD)
    assert report.temp_files == [str(tmp.relative_to(tmp_path))] and not tmp.exists()
    assert_verified(tmp_path)


@pytest.mark.parametrize("kind", ["single", "numbered"])
def test_gc_keeps_every_version_by_default(tmp_path: Path, kind: str) -> None:
    models = _history(tmp_path, kind)
    orphan = _orphan(tmp_path)
    before = set(data_files(tmp_path))
    young = collect_garbage(tmp_path)  # default grace: the orphan is too young
    assert str(orphan.relative_to(tmp_path)) in young.kept_young and not young.deleted
    report = collect_garbage(tmp_path, now=OLD)
    assert report.deleted == [str(orphan.relative_to(tmp_path))]
    assert set(data_files(tmp_path)) == before - {orphan}
    for g, m in models.items():
        assert dict(ocdbt_py.open(tmp_path, version=g).items()) == m
    assert_verified(tmp_path)


@pytest.mark.parametrize("kind", ["single", "numbered"])
def test_gc_keep_versions(tmp_path: Path, kind: str) -> None:
    models = _history(tmp_path, kind)
    latest = max(models)
    dry = collect_garbage(tmp_path, keep_versions=3, dry_run=True, now=OLD)
    assert dry.dry_run and dry.deleted
    assert all((tmp_path / k).exists() for k in dry.deleted)
    report = collect_garbage(tmp_path, keep_versions=3, now=OLD)
    assert report.deleted and set(dry.deleted) <= set(report.deleted)
    db = ocdbt_py.open(tmp_path)
    gens = [v.generation for v in db.versions()]
    kept = [g for g in sorted(models) if g >= sorted(models)[-3]]
    if kind == "single":
        assert gens == kept
    else:  # the shortened history is recorded as a new generation with the same tree
        assert gens == kept + [latest + 1]
        assert dict(db.at(latest + 1).items()) == models[latest]
    for g in kept:
        assert dict(db.at(g).items()) == models[g]
    for g in set(models) - set(kept):
        with pytest.raises(ocdbt_py.NotFoundError):
            db.at(g)
    assert_verified(tmp_path)
    # the database keeps working, also for TensorStore
    w = ocdbt_py.open(tmp_path, mode="a")
    for i in range(5):
        w.put(b"more%d" % i, b"x" * 10)
    assert_verified(tmp_path)
    try:
        from tests.ocdbt_write.helpers import ts_snapshot

        assert ts_snapshot(tmp_path) == dict(ocdbt_py.open(tmp_path).items())
        assert ts_snapshot(tmp_path, kept[0]) == models[kept[0]]
    except pytest.skip.Exception:
        pass


def test_gc_keep_since(tmp_path: Path) -> None:
    models = _history(tmp_path)
    db = ocdbt_py.open(tmp_path)
    versions = db.versions()
    t = versions[6].commit_time_ns + 1  # between generation 7 and 8: generation 7 was current
    collect_garbage(tmp_path, keep_since=format_nanoseconds(t), now=OLD)
    gens = [v.generation for v in ocdbt_py.open(tmp_path).versions()]
    assert gens == [g for g in sorted(models) if g >= versions[6].generation]
    assert_verified(tmp_path)


def test_gc_never_touches_nested_databases_or_other_files(tmp_path: Path) -> None:
    _history(tmp_path)
    nested = tmp_path / "ocdbt.process_0"
    _history(nested)
    (tmp_path / "README").write_text("not a data file")
    (tmp_path / "d" / "short").write_text("not a data file name")
    nested_files = set(data_files(nested))
    _orphan(nested)
    report = collect_garbage(tmp_path, keep_versions=1, now=OLD)
    assert not any(k.startswith("ocdbt.process_0/") for k in report.deleted)
    assert set(data_files(nested)) >= nested_files
    assert (tmp_path / "README").exists() and (tmp_path / "d" / "short").exists()
    with pytest.raises(UnsupportedError):
        collect_garbage(nested)  # inside another database
    collect_garbage(nested, force=True, now=OLD)
    assert_verified(nested)
    assert_verified(tmp_path)


def test_gc_spares_an_in_flight_commit(tmp_path: Path) -> None:
    """Files a writer has written but not yet committed are younger than the grace period."""
    _history(tmp_path)
    db = ocdbt_py.open(tmp_path, mode="a")
    from ocdbt_py.kvstore import LocalStore
    from ocdbt_py.testing.faults import FaultyStore, InjectedFault

    # a commit that wrote its data file, then lost its manifest write (e.g. crashed)
    faulty = FaultyStore(LocalStore(tmp_path), ops=["set_if"], fail_at=0)
    w = ocdbt_py.open(faulty, mode="a")
    with pytest.raises(InjectedFault):
        w.put(b"pending", b"p" * 100)
    pending = [k for op, k in faulty.log if op == "set_if"]
    assert pending
    report = collect_garbage(tmp_path, keep_versions=1)  # real clock: the new file is young
    assert report.kept_young and not any(k in report.deleted for k in report.kept_young)
    assert all((tmp_path / k).exists() for k in report.kept_young)
    db.put(b"after", b"gc")
    assert_verified(tmp_path)


def test_gc_arguments(tmp_path: Path) -> None:
    db = tmp_path / "db"
    _history(db)
    with pytest.raises(ValueError):
        collect_garbage(db, keep_versions=0)
    with pytest.raises(ValueError):
        collect_garbage(db, keep_versions=1, keep_since="2020-01-01T00:00:00Z")
    with pytest.raises(ValueError):
        collect_garbage(db, grace_seconds=-1)
    empty = tmp_path / "empty"
    os.mkdir(empty)
    with pytest.raises(ocdbt_py.NotFoundError):
        collect_garbage(empty, dry_run=True)
    assert collect_garbage(empty).deleted == []  # a writable open of nothing: nothing to do
    assert not (empty / "manifest.ocdbt").exists()
    shutil.rmtree(empty)
