"""``ocdbt ls/get/info/versions/tree`` on a tiny database written with our own encoders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ocdbt_py.cli.app import build_parser, command_modules
from ocdbt_py.keys import escape_key

ALL_COMMANDS = {"ls", "get", "info", "versions", "verify", "tree"}


def test_every_command_is_registered() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) >= ALL_COMMANDS  # type: ignore[arg-type]
    assert all(m.rsplit(".", 1)[1].startswith("cmd_") for m in command_modules())


def test_ls_lists_keys_in_order_escaped(cli, tiny_db) -> None:
    r = cli("ls", tiny_db.root)
    assert r.status == 0, r.err
    lines = r.out.splitlines()
    assert lines == [escape_key(k) for k in sorted(tiny_db.items)]
    assert "bin\\xff\\xfe" in lines
    assert "ctl\\x0a\\x09" in lines
    assert "back\\\\slash" in lines
    assert "caf\u00e9" in lines


def test_ls_long_shows_size_and_location(cli, tiny_db) -> None:
    r = cli("ls", "-l", tiny_db.root)
    assert r.status == 0, r.err
    rows = {line.split()[0]: line.split()[1:] for line in r.out.splitlines()}
    assert rows["a"] == ["1", "inline"]
    assert rows["b/y"][0] == str(len(tiny_db.items[b"b/y"]))
    file, offset = rows["b/y"][1].rsplit(":", 1)
    assert file == "d/gen0002" and offset == "0"
    assert rows["bin\\xff\\xfe"][1].startswith("d/gen0002:")


def test_ls_json_parses_and_key_hex_round_trips(cli, tiny_db) -> None:
    r = cli("ls", "--json", tiny_db.root)
    assert r.status == 0, r.err
    entries = json.loads(r.out)
    assert [bytes.fromhex(e["key_hex"]) for e in entries] == sorted(tiny_db.items)
    for e in entries:
        key = bytes.fromhex(e["key_hex"])
        assert e["key"] == escape_key(key)
        assert e["size"] == len(tiny_db.items[key])
        assert e["inline"] == (e["file"] is None) == (e["offset"] is None)
        g = cli("get", tiny_db.root, e["key_hex"], "--hex")
        assert g.status == 0, g.err
        assert g.out_bytes == tiny_db.items[key]
        g = cli("get", tiny_db.root, e["key"], "--escaped")
        assert g.out_bytes == tiny_db.items[key]


def test_ls_json_empty_listing_parses(cli, tiny_db) -> None:
    r = cli("ls", "--json", "--prefix", "nothing-here", tiny_db.root)
    assert r.status == 0
    assert json.loads(r.out) == []


def test_ls_prefix_limit_and_versions(cli, tiny_db) -> None:
    assert cli("ls", tiny_db.root, "--prefix", "b/").out.splitlines() == ["b/x", "b/y"]
    assert cli("ls", tiny_db.root, "--prefix-hex", "62696e").out.splitlines() == ["bin\\xff\\xfe"]
    assert cli("ls", tiny_db.root, "--prefix", "bin\\xff").out.splitlines() == ["bin\\xff\\xfe"]
    assert cli("ls", tiny_db.root, "-n", "2").out.splitlines() == ["a", "b/x"]
    first = sorted(tiny_db.items)[: len(tiny_db.items) // 2]
    assert cli("ls", tiny_db.root, "--version", "1").out.splitlines() == [escape_key(k) for k in first]
    # a time between the two commits selects generation 1; a later one generation 2
    assert cli("ls", tiny_db.root, "--version", "2023-11-14T22:13:21.5Z").out.splitlines() == [
        escape_key(k) for k in first
    ]
    assert len(cli("ls", tiny_db.root, "--version", "2030-01-01T00:00:00Z").out.splitlines()) == len(tiny_db.items)


def test_get_is_binary_safe_and_writes_files(cli, tiny_db, tmp_path: Path) -> None:
    r = cli("get", tiny_db.root, "b/y")
    assert r.status == 0 and r.out_bytes == tiny_db.items[b"b/y"]
    r = cli("get", tiny_db.root, "bin\\xff\\xfe", "--escaped")
    assert r.out_bytes == b"\x00\x01\x02\xff" * 8
    out = tmp_path / "value.bin"
    r = cli("get", tiny_db.root, "--hex", b"bin\xff\xfe".hex(), "-o", out)
    assert r.status == 0 and r.out_bytes == b""
    assert out.read_bytes() == b"\x00\x01\x02\xff" * 8
    r = cli("get", tiny_db.root, "caf\u00e9")
    assert r.out_bytes == b"unicode key"


def test_get_missing_key_is_one_line_error(cli, tiny_db) -> None:
    r = cli("get", tiny_db.root, "no\\xffsuch", "--escaped")
    assert r.status == 1
    assert r.out_bytes == b""
    assert r.err.strip().count("\n") == 0
    assert "no\\xffsuch" in r.err and "not found" in r.err
    assert "Traceback" not in r.err


def test_get_bad_hex_is_usage_error(cli, tiny_db) -> None:
    r = cli("get", tiny_db.root, "--hex", "xyz")
    assert r.status == 2 and "bad key" in r.err


def test_info_text_and_json(cli, tiny_db) -> None:
    r = cli("info", tiny_db.root)
    assert r.status == 0, r.err
    assert "generation:" in r.out and "2 (latest 2)" in r.out
    assert f"keys:                    {len(tiny_db.items)}" in r.out
    j = json.loads(cli("info", tiny_db.root, "--json").out)
    assert j["generation"] == 2 and j["num_keys"] == len(tiny_db.items)
    assert j["config"]["max_inline_value_bytes"] == 16
    j1 = json.loads(cli("info", tiny_db.root, "--json", "--version", "1").out)
    assert j1["generation"] == 1 and j1["num_keys"] == len(tiny_db.items) // 2


def test_versions_text_and_json(cli, tiny_db) -> None:
    r = cli("versions", tiny_db.root)
    assert r.status == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split()[0] == "GENERATION" and len(lines) == 3
    assert lines[1].split()[0] == "1" and lines[2].split()[0] == "2"
    vs = json.loads(cli("versions", "--json", tiny_db.root).out)
    assert [v["generation"] for v in vs] == [1, 2]
    assert vs[1]["num_keys"] == len(tiny_db.items)
    assert vs[1]["root"]["file"] == "d/gen0002"
    assert vs[0]["commit_time"].startswith("2023-11-14T22:13:21")


def test_tree_on_a_plain_database_is_one_line_error(cli, tiny_db) -> None:
    # ``tree`` shows Orbax checkpoints (tests/checkpoint); a bare database is not one.
    r = cli("tree", tiny_db.root)
    assert r.status == 1
    assert "not an Orbax checkpoint" in r.err and "ocdbt ls" in r.err
    assert "Traceback" not in r.err and r.err.count("\n") == 1
    assert cli("tree", "--help").status == 0


def test_missing_database_is_one_line_error(cli, tmp_path: Path) -> None:
    r = cli("ls", tmp_path / "nowhere")
    assert r.status == 1
    assert r.err == f"ocdbt: error: {tmp_path / 'nowhere'} does not exist\n"
    (tmp_path / "empty").mkdir()
    r = cli("ls", tmp_path / "empty")
    assert r.status == 1
    assert r.err.startswith("ocdbt: error: no OCDBT database")
    assert r.err.count("\n") == 1 and "Traceback" not in r.err


def test_debug_shows_traceback(cli, tmp_path: Path) -> None:
    r = cli("ls", "--debug", tmp_path / "nowhere")
    assert r.status == 1 and "Traceback" in r.err


def test_corrupt_manifest_is_one_line_error(cli, tiny_db) -> None:
    m = tiny_db.path("manifest.ocdbt")
    m.write_bytes(m.read_bytes()[:-3])
    r = cli("ls", tiny_db.root)
    assert r.status == 1 and "Traceback" not in r.err
    assert r.err.startswith("ocdbt: error:") and r.err.count("\n") == 1
    v = cli("verify", tiny_db.root)
    assert v.status == 1 and "manifest" in v.out


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["ls"],
        ["ls", "DB", "--version", "yesterday"],
        ["ls", "DB", "--version", "0"],
        ["ls", "DB", "--storage-option", "novalue"],
        ["ls", "DB", "--prefix", "bad\\q"],
        ["ls", "DB", "--prefix", "a", "--prefix-hex", "61"],
        ["verify", "DB", "--max-problems", "0"],
        ["verify", "DB", "--latest", "--version", "1"],
    ],
)
def test_usage_errors_exit_2(cli, tiny_db, args: list[str]) -> None:
    r = cli(*[tiny_db.root if a == "DB" else a for a in args])
    assert r.status == 2
    assert "Traceback" not in r.err


def test_help_and_version_exit_0(cli) -> None:
    assert cli("--help").status == 0
    r = cli("--version")
    assert r.status == 0 and "ocdbt" in r.out
    for c in ALL_COMMANDS:
        assert cli(c, "--help").status == 0


def test_step_directory_lists_item_databases(cli, make_db, tmp_path: Path) -> None:
    step = tmp_path / "ckpt" / "7"
    make_db(step / "params")
    make_db(step / "opt_state")
    (step / "other").mkdir()
    r = cli("ls", step)
    assert r.status == 2 and r.out == ""
    assert f"{step}/params" in r.err and f"{step}/opt_state" in r.err
    assert f"{step}/other" not in r.err
    assert "Traceback" not in r.err
    # a checkpoint root: the items are two levels down
    r = cli("info", tmp_path / "ckpt")
    assert r.status == 2 and f"{step}/params" in r.err and "ocdbt info" in r.err


def test_manifest_path_is_accepted(cli, tiny_db) -> None:
    r = cli("ls", tiny_db.path("manifest.ocdbt"))
    assert r.status == 0 and len(r.out.splitlines()) == len(tiny_db.items)


def test_storage_options_go_to_fsspec(cli, tiny_db) -> None:
    url = tiny_db.root.as_uri()
    r = cli("ls", url, "-S", "auto_mkdir=false", "--storage-option", 'unused_option="x"')
    assert r.status == 0, r.err
    assert len(r.out.splitlines()) == len(tiny_db.items)
    r = cli("verify", url, "-S", "auto_mkdir=false")
    assert r.status == 0, r.out + r.err


def test_memory_filesystem_url(cli, tiny_db) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for p in tiny_db.root.rglob("*"):
        if p.is_file():
            fs.pipe(f"/clitest/{p.relative_to(tiny_db.root).as_posix()}", p.read_bytes())
    try:
        r = cli("ls", "-l", "memory://clitest")
        assert r.status == 0, r.err
        assert len(r.out.splitlines()) == len(tiny_db.items)
        assert cli("verify", "memory://clitest").status == 0
        fs.rm("/clitest/d/gen0002")
        r = cli("verify", "memory://clitest")
        assert r.status == 1 and "d/gen0002" in r.out and "missing" in r.out
    finally:
        fs.rm("/clitest", recursive=True)


def test_real_subprocess(subproc, tiny_db) -> None:
    p = subproc("ls", "--json", tiny_db.root)
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)) == len(tiny_db.items)
    p = subproc("get", tiny_db.root, "bin\\xff\\xfe", "--escaped")
    assert p.returncode == 0 and p.stdout == b"\x00\x01\x02\xff" * 8
    p = subproc("verify", tiny_db.root)
    assert p.returncode == 0 and p.stdout.startswith(b"OK")
    p = subproc("ls", tiny_db.root / "missing")
    assert p.returncode == 1 and b"Traceback" not in p.stderr and p.stderr.count(b"\n") == 1
    shutil.rmtree(tiny_db.root / "d")
    p = subproc("verify", tiny_db.root)
    assert p.returncode == 1 and b"missing" in p.stdout


def test_cli_import_is_light(subproc) -> None:
    import subprocess
    import sys

    code = ("import sys, ocdbt_py.cli; bad = [m for m in ('numpy', 'zstandard', 'fsspec', "
            "'ocdbt_py.store', 'ocdbt_py.maintenance.verify') if m in sys.modules]; print(bad)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"


def test_ascii_terminal_never_crashes_the_printer(tiny_db) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONIOENCODING="ascii")
    p = subprocess.run([sys.executable, "-m", "ocdbt_py.cli", "ls", str(tiny_db.root)],
                       capture_output=True, env=env, check=False)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode("ascii").splitlines()
    assert "caf\\xc3\\xa9" in lines and "bin\\xff\\xfe" in lines
