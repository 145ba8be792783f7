"""``ocdbt put``, ``ocdbt rm`` and ``ocdbt gc``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import ocdbt_py
from ocdbt_py.cli import main
from tests.ocdbt_write.helpers import assert_verified, data_files


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_put_and_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "db")
    status, _, err = run(capsys, "put", db, "k", "v")
    assert status == 1 and "--create" in err
    status, out, _ = run(capsys, "put", db, "k", "v", "--create", "--config", '{"max_inline_value_bytes": 2}')
    assert status == 0 and out == f"put 'k' (1 B) into {db}: generation 2\n", out
    assert ocdbt_py.open(db).config.max_inline_value_bytes == 2
    src = tmp_path / "value.bin"
    src.write_bytes(bytes(range(256)) * 10)
    status, out, _ = run(capsys, "put", db, "--hex", "ff00", "-i", str(src), "--json")
    assert status == 0 and json.loads(out) == {"generation": 3, "key": "\\xff\\x00", "key_hex": "ff00",
                                               "length": 2560, "url": db}, out
    status, out, _ = run(capsys, "put", db, "--escaped", "a\\x01b", "text")
    assert status == 0
    d = dict(ocdbt_py.open(db).items())
    assert d == {b"k": b"v", b"\xff\x00": src.read_bytes(), b"a\x01b": b"text"}
    for bad in (["put", db, "k"], ["put", db, "k", "v", "-i", str(src)], ["put", db, "--hex", "zz", "v"],
                ["put", db, "k", "v", "--config", "{bad json"], ["rm", db], ["rm", db, "--stop", "x"]):
        status, _, _ = run(capsys, *bad)
        assert status == 2, bad
    status, out, _ = run(capsys, "put", db, "k", "v", "--config", '{"max_inline_value_bytes": 3}')
    assert status == 1  # configuration mismatch
    status, out, _ = run(capsys, "rm", db, "k", "absent")
    assert status == 0 and out == f"deleted 2 keys in {db}: generation 5\n", out
    status, out, _ = run(capsys, "put", db, "p/1", "x")
    status, out, _ = run(capsys, "put", db, "p/2", "x")
    status, out, _ = run(capsys, "rm", db, "--prefix", "p/")
    assert status == 0
    assert sorted(ocdbt_py.open(db).list()) == [b"a\x01b", b"\xff\x00"]
    status, out, _ = run(capsys, "rm", db, "--start", "a", "--stop", "b")
    assert sorted(ocdbt_py.open(db).list()) == [b"\xff\x00"]
    assert_verified(db)


def test_gc_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "db")
    for i in range(6):
        assert run(capsys, "put", db, "k", "x" * (200 + i), "--create")[0] == 0
    n_files = len(data_files(db))
    status, out, _ = run(capsys, "gc", db, "--keep-versions", "2", "--dry-run", "--grace", "0", "--json")
    report = json.loads(out)
    assert status == 0 and report["dry_run"] and len(report["deleted"]) >= 3
    assert len(data_files(db)) == n_files
    status, out, _ = run(capsys, "gc", db, "--keep-versions", "2", "--grace", "0", "-v")
    assert status == 0 and "deleted" in out
    assert [v.generation for v in ocdbt_py.open(db).versions()] == [6, 7]
    assert len(data_files(db)) == 2
    assert_verified(db)
    assert run(capsys, "gc", db, "--keep-versions", "0")[0] == 2
    assert run(capsys, "gc", db, "--keep-since", "yesterday")[0] == 2
    assert run(capsys, "gc", db, "--keep-versions", "1", "--keep-since", "2020-01-01T00:00:00Z")[0] == 2
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    status, out, _ = run(capsys, "gc", db, "--keep-since", since, "--grace", "0")
    assert status == 0
    assert [v.generation for v in ocdbt_py.open(db).versions()] == [7]
    assert run(capsys, "gc", str(tmp_path / "nothing"))[0] == 1
