"""One grammar for every ``ocdbt`` subcommand, checked generically over the argparse registry
(so commands added later are checked too): the common options, one message and exit status
for a missing path, exit status 2 naming the help for bad usage, JSON output, and object
stores that do not answer failing within ``--timeout`` in one line."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ocdbt_py.cli.app import build_parser, subcommands
from ocdbt_py.cli.options import LOCATIONS
from tests.demo_output import demo_output

PARSER = build_parser()
COMMANDS = subcommands(PARSER)
#: Commands whose missing-path error names a fix after the common message.
FIX_HINTS = {"put"}
COMMON = ("--json", "-S", "--storage-option", "--quiet", "--debug", "--timeout")


def _locations(sub: argparse.ArgumentParser) -> list[tuple[str, bool]]:
    """``(dest, must_exist)`` of each location the command takes."""
    return [(loc[0], loc[1]) for loc in sub.get_default(LOCATIONS) or []]


def _file_ok(sub: argparse.ArgumentParser) -> set[str]:
    """The locations that may be a single file (``import``'s SRC)."""
    return {loc[0] for loc in sub.get_default(LOCATIONS) or [] if len(loc) > 2 and loc[2]}


def _positionals(sub: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in sub._actions if not a.option_strings and a.dest != "help"]


def _argv(name: str, paths: dict[str, str]) -> list[str]:
    """A command line for ``name``: each location from ``paths``, other positionals ``1``, and
    any required option given ``1``."""
    sub = COMMANDS[name]
    argv = [name]
    for a in _positionals(sub):
        argv.append(paths.get(a.dest, "1"))
    for a in sub._actions:
        if a.option_strings and a.required:
            argv += [a.option_strings[0], "1"]
    return argv


def test_the_registry_has_the_known_commands() -> None:
    known = {"ls", "get", "info", "versions", "verify", "tree", "steps", "export", "put", "rm", "gc"}
    assert known <= set(COMMANDS), sorted(known - set(COMMANDS))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_takes_the_common_options(name: str) -> None:
    sub = COMMANDS[name]
    for opt in COMMON:
        assert opt in sub._option_string_actions, f"ocdbt {name} lacks {opt}: build it with options.add_location"
    assert _locations(sub), f"ocdbt {name} declares no location (options.add_location)"
    paths = {dest: f"loc-{dest}" for dest, _ in _locations(sub)}
    argv = _argv(name, paths) + ["--json", "-S", "anon=true", "--quiet", "--debug", "--timeout", "5"]
    args = PARSER.parse_args(argv)
    assert args.json is True and args.quiet is True and args.debug is True and args.timeout == 5.0
    assert args.storage_option == [("anon", True)]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_missing_path_is_one_message_and_exit_1(name: str, cli: Callable[..., object], tmp_path: Path) -> None:
    locs = _locations(COMMANDS[name])
    paths = {dest: str(tmp_path / f"missing-{dest}") for dest, _ in locs}
    first = next(paths[dest] for dest, must in locs if must) if any(m for _, m in locs) else paths[locs[0][0]]
    r = cli(*_argv(name, paths))
    assert r.status == 1, (name, r.err)  # type: ignore[attr-defined]
    # the one message, on one line; a command may add how to fix it (put: --create)
    assert r.err.startswith(f"ocdbt: error: {first} does not exist") and r.err.count("\n") == 1, r.err  # type: ignore[attr-defined]
    assert r.err == f"ocdbt: error: {first} does not exist\n" or name in FIX_HINTS, r.err  # type: ignore[attr-defined]
    assert r.out == ""  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_bad_usage_exits_2_and_names_the_help(name: str, cli: Callable[..., object], tmp_path: Path) -> None:
    paths = {dest: str(tmp_path) for dest, _ in _locations(COMMANDS[name])}
    for argv in (_argv(name, paths) + ["--no-such-option"], [name], _argv(name, paths) + ["--timeout", "soon"]):
        r = cli(*argv)
        assert r.status == 2, (argv, r.err)  # type: ignore[attr-defined]
        assert f"run 'ocdbt {name} --help'" in r.err, r.err  # type: ignore[attr-defined]
        assert "Traceback" not in r.err  # type: ignore[attr-defined]


def test_usage_errors_found_by_the_command_exit_2(cli: Callable[..., object], tiny_db: object) -> None:
    db = str(tiny_db.root)  # type: ignore[attr-defined]
    for argv in (["ls", db, "--limit", "-1"], ["get", db, "a", "--json", "-o", "x.bin"],
                 ["export", db, "out.txt"], ["rm", db], ["verify", db, "--max-problems", "0"]):
        r = cli(*argv)
        assert r.status == 2 and r.err.startswith("ocdbt: "), (argv, r.err)  # type: ignore[attr-defined]


# -- JSON output of the existing commands ---------------------------------------------------------

def test_json_output_of_each_command(cli: Callable[..., object], tmp_path: Path) -> None:
    """Every command prints one JSON document with --json (on the demo's own output)."""
    d = demo_output(tmp_path)
    runs = {
        "ls": ["ls", d / "db"], "get": ["get", d / "db", "greeting"], "info": ["info", d / "ckpt"],
        "versions": ["versions", d / "db"], "verify": ["verify", d / "ckpt"], "tree": ["tree", d / "ckpt"],
        "steps": ["steps", d / "run"], "export": ["export", d / "ckpt", tmp_path / "m.npz"],
        "put": ["put", d / "db", "k", "v"], "rm": ["rm", d / "db", "k"],
        "gc": ["gc", d / "db", "--grace", "0", "--dry-run"],
    }
    for name, argv in runs.items():
        r = cli(*argv, "--json", "--quiet")
        assert r.status == 0, (name, r.err)  # type: ignore[attr-defined]
        json.loads(r.out)  # type: ignore[attr-defined]
    got = json.loads(cli("get", d / "db", "greeting", "--json").out)  # type: ignore[attr-defined]
    assert got["length"] == len(b"hello again") and got["key"] == "greeting"
    import base64

    assert base64.b64decode(got["value_base64"]) == b"hello again"
    exp = json.loads(cli("export", d / "ckpt", tmp_path / "m2.safetensors", "--json").out)  # type: ignore[attr-defined]
    assert exp["format"] == "safetensors" and exp["tensors"] == len(exp["names"]) > 0


def test_steps_on_an_item_or_step_says_what_it_is(cli: Callable[..., object], tmp_path: Path) -> None:
    d = demo_output(tmp_path)
    step, item = d / "run" / "20", d / "run" / "20" / "params"
    r = cli("steps", step)
    assert r.status == 2 and "is a checkpoint step directory" in r.err  # type: ignore[attr-defined]
    assert f"ocdbt steps {d / 'run'}" in r.err  # type: ignore[attr-defined]
    r = cli("steps", item)
    assert r.status == 2 and "is a checkpoint item" in r.err and f"ocdbt tree {item}" in r.err
    assert r.out == ""  # type: ignore[attr-defined]
    (tmp_path / "empty").mkdir()
    r = cli("steps", tmp_path / "empty")
    assert r.status == 1 and "holds no checkpoint steps" in r.err  # type: ignore[attr-defined]


def test_a_time_travel_miss_speaks_iso(cli: Callable[..., object], tiny_db: object) -> None:
    r = cli("ls", tiny_db.root, "--version", "2000-01-02T03:04:05Z")  # type: ignore[attr-defined]
    assert r.status == 1  # type: ignore[attr-defined]
    assert r.err == "ocdbt: error: no version committed at or before 2000-01-02T03:04:05Z\n"  # type: ignore[attr-defined]


def test_quiet_silences_notes_and_progress(cli: Callable[..., object], tiny_db: object) -> None:
    r = cli("verify", tiny_db.root, "--progress", "--quiet")  # type: ignore[attr-defined]
    assert r.status == 0 and r.err == ""  # type: ignore[attr-defined]


# -- object stores that do not answer ---------------------------------------------------------------

@pytest.fixture
def black_hole() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


@pytest.mark.parametrize("url,extra", [
    ("s3://bucket/db", ["-S", "key=k", "-S", "secret=s"]),
    ("gs://bucket/db", ["-S", "token=anon"]),
])
def test_an_object_store_that_does_not_answer_fails_within_the_timeout(
    black_hole: str, url: str, extra: list[str]
) -> None:
    pytest.importorskip("s3fs" if url.startswith("s3") else "gcsfs")
    argv = [sys.executable, "-m", "ocdbt_py.cli", "ls", url, "-S", f"endpoint_url={black_hole}", *extra,
            "--timeout", "2"]
    t = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t
    assert p.returncode == 1, p.stderr
    assert p.stderr == f"ocdbt: error: {url}: no answer within 2 s (network or endpoint unreachable? " \
        "--timeout SECONDS to wait longer, --debug for details)\n"
    assert elapsed < 15, elapsed  # interpreter start-up, imports and the 2 s wait


def test_a_command_redefining_a_common_option_does_not_break_the_tool() -> None:
    from ocdbt_py.cli.app import Parser
    from ocdbt_py.cli.options import add_json, add_location

    top = Parser(prog="ocdbt")
    p = top.add_subparsers(dest="command").add_parser("newcmd")
    add_location(p)
    add_json(p)  # harmless twice
    p.add_argument("-q", "--quiet", action="store_true", help="its own")
    args = top.parse_args(["newcmd", "x", "--quiet", "--json"])
    assert args.quiet and args.json and args.url == "x"


# -- messages: what is wrong and what to do, one line; results on stdout, notes on stderr ---------

#: Commands that read or write every chunk: each draws a progress bar and takes --progress/--no-progress.
LONG = {"export", "import", "verify", "stats", "report", "cp"}


@pytest.mark.parametrize("name", sorted(LONG))
def test_long_commands_take_progress(name: str) -> None:
    sub = COMMANDS[name]
    assert "--progress" in sub._option_string_actions and "--no-progress" in sub._option_string_actions, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_plain_file_is_not_a_database_or_checkpoint(name: str, cli: Callable[..., object],
                                                       tmp_path: Path) -> None:
    sub = COMMANDS[name]
    file_ok = _file_ok(sub)
    locs = [(dest, must) for dest, must in _locations(sub) if must and dest not in file_ok]
    if not locs:
        pytest.skip(f"ocdbt {name} takes no location that must be a database or checkpoint")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint\n")
    paths = {dest: str(notes) for dest, _ in _locations(sub)}
    r = cli(*_argv(name, paths))
    assert r.status == 1 and r.out == "", (name, r.err)  # type: ignore[attr-defined]
    assert r.err == (f"ocdbt: error: {notes} is a file, not a database or checkpoint: give the directory "  # type: ignore[attr-defined]
                     "that holds manifest.ocdbt, or a checkpoint item, step or root directory\n"), r.err  # type: ignore[attr-defined]


def test_import_takes_a_file(cli: Callable[..., object], tmp_path: Path) -> None:
    """SRC of ``import`` is the one location that may be a file: it gets past the check."""
    notes = tmp_path / "notes.safetensors"
    notes.write_bytes(b"\x00" * 4)
    r = cli("import", notes, tmp_path / "out")
    assert r.status != 0 and "is a file, not a database" not in r.err  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
def test_s3_without_credentials_says_how_to_give_them(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("s3fs" if backend == "fsspec" else "obstore")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
           "AWS_EC2_METADATA_DISABLED": "true"}
    p = subprocess.run([sys.executable, "-m", "ocdbt_py.cli", "ls", "s3://bucket/db", "-S",
                        "endpoint_url=http://127.0.0.1:9", "-S", f"backend={backend}", "--timeout", "60"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 1 and p.stdout == "", p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "no usable credentials were found" in p.stderr and "-S anon=true" in p.stderr, p.stderr
    assert "AWS_ACCESS_KEY_ID" in p.stderr and "Error:" not in p.stderr, p.stderr  # no library class names


def test_a_missing_version_says_which_exist(cli: Callable[..., object], tiny_db: object) -> None:
    r = cli("ls", tiny_db.root, "--version", "99")  # type: ignore[attr-defined]
    assert r.status == 1 and r.out == ""  # type: ignore[attr-defined]
    assert r.err == "ocdbt: error: no version 99: versions 1 to 2 are kept (listed by 'ocdbt versions' or " \
        "OcdbtStore.versions())\n", r.err  # type: ignore[attr-defined]


def test_put_and_rm_say_what_they_did(cli: Callable[..., object], tmp_path: Path) -> None:
    db = tmp_path / "db"
    r = cli("put", db, "a/b", "hello", "--create")
    assert r.status == 0 and r.err == ""  # type: ignore[attr-defined]
    assert r.out == f"put 'a/b' (5 B) into {db}: generation 2\n", r.out  # type: ignore[attr-defined]
    doc = json.loads(cli("put", db, "c", "x", "--json").out)  # type: ignore[attr-defined]
    assert doc["generation"] == 3 and doc["key"] == "c" and doc["length"] == 1
    r = cli("rm", db, "a/b", "c")
    assert r.out == f"deleted 2 keys in {db}: generation 4\n", r.out  # type: ignore[attr-defined]
    r = cli("put", db, "a/c", "x")
    r = cli("rm", db, "--prefix", "a/")
    assert r.out == f"deleted every key under 'a/' in {db}: generation 6\n", r.out  # type: ignore[attr-defined]
    r = cli("rm", db, "--prefix", "a/")
    assert r.out == f"nothing to delete (every key under 'a/') in {db}: no new generation, the latest is still 6\n", \
        r.out  # type: ignore[attr-defined]


def test_writers_refuse_to_overwrite_without_force(cli: Callable[..., object], tmp_path: Path) -> None:
    """One rule for every command that writes: existing output needs --force."""
    d = demo_output(tmp_path)
    out = tmp_path / "m.npz"
    runs = {
        "export": ["export", d / "ckpt", out],
        "export (shards)": ["export", d / "ckpt", tmp_path / "hf", "--max-shard-size", "5GB"],
        "get": ["get", d / "db", "greeting", "-o", tmp_path / "value.bin"],
        "report": ["report", d / "ckpt", "-o", tmp_path / "r.html"],
        "cp": ["cp", d / "ckpt", tmp_path / "copy"],
        "import": ["import", tmp_path / "hf", tmp_path / "back"],
    }
    for what, argv in runs.items():
        first = cli(*argv)
        assert first.status == 0, (what, first.err)  # type: ignore[attr-defined]
        again = cli(*argv)
        assert again.status == 1 and "--force" in again.err and again.err.count("\n") == 1, (what, again.err)  # type: ignore[attr-defined]
        assert "force=True" not in again.err, (what, again.err)  # type: ignore[attr-defined]
        assert cli(*argv, "--force").status == 0, what  # type: ignore[attr-defined]


def test_results_on_stdout_notes_on_stderr(cli: Callable[..., object], tmp_path: Path) -> None:
    d = demo_output(tmp_path)
    for argv, starts in (
        (["export", d / "ckpt", tmp_path / "m.safetensors"], "wrote "),
        (["report", d / "ckpt", "-o", tmp_path / "r.html"], f"wrote {tmp_path / 'r.html'} ("),
        (["cp", d / "ckpt", tmp_path / "c2"], "copied "),
        (["import", tmp_path / "m.safetensors", tmp_path / "back"], "imported "),
        (["verify", d / "ckpt", "--data"], "OK: "),
    ):
        r = cli(*argv, "--no-progress")
        assert r.status == 0 and r.out.startswith(starts) and r.err == "", (argv, r.out, r.err)  # type: ignore[attr-defined]
    r = cli("verify", d / "ckpt", "--data", "--progress")  # the bar (and only it) on stderr, erased at the end
    assert r.status == 0 and r.out.startswith("OK: ") and "\r" not in r.out  # type: ignore[attr-defined]
    assert "stored bytes" not in r.out and "values carry no checksum" in r.out  # type: ignore[attr-defined]
