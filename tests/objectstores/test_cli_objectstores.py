"""The ``ocdbt`` command on real object-store servers (moto, fake-gcs-server, azurite): the
common grammar (``-S`` options, ``--timeout`` defaults underneath them, the missing-path check
made as the first request) reads what ``ocdbt_py.open`` wrote there."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest

import ocdbt_py
from ocdbt_py.cli import main
from ocdbt_py.kvstore import open_kvstore

BUCKET = "ocdbt-cli"
_n = itertools.count()


def _target(kind: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if kind == "s3":
        srv = request.getfixturevalue("s3_server")
        srv.make_bucket(BUCKET)
        return f"s3://{BUCKET}/db{next(_n)}", srv.storage_options()
    if kind == "gcs":
        srv = request.getfixturevalue("gcs_server")
        srv.make_bucket(BUCKET)
        return f"gs://{BUCKET}/db{next(_n)}", srv.storage_options()
    srv = request.getfixturevalue("azure_server")
    srv.make_container(BUCKET)
    return f"az://{BUCKET}/db{next(_n)}", srv.storage_options()


def _flags(opts: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in opts.items():
        out += ["-S", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return out


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([os.fspath(a) for a in argv])
    cap = capsys.readouterr()
    return status, cap.out, cap.err


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_cli_reads_an_object_store(kind: str, request: pytest.FixtureRequest,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    url, opts = _target(kind, request)
    with ocdbt_py.open(url, mode="a", storage_options=opts) as db:
        db.put(b"greeting", b"hello from " + kind.encode())
    flags = _flags(opts)
    status, out, err = _run(capsys, "ls", url, *flags, "--timeout", "30")
    assert (status, out) == (0, "greeting\n"), err
    status, out, err = _run(capsys, "get", url, "greeting", "--json", *flags)
    assert status == 0, err
    assert json.loads(out)["length"] == len(b"hello from " + kind.encode())
    status, out, err = _run(capsys, "ls", url + "-missing", *flags)
    assert (status, out, err) == (1, "", f"ocdbt: error: {url}-missing does not exist\n")
    # a single object exists too (import's SRC can be a file): here it is just not a database
    open_kvstore(url, opts).set("note.txt", b"not a database")
    status, out, err = _run(capsys, "ls", url + "/note.txt", *flags)
    file_msg = (f"ocdbt: error: {url}/note.txt is a file, not a database or checkpoint: give the directory that "
                "holds manifest.ocdbt, or a checkpoint item, step or root directory\n")
    assert (status, err) == (1, file_msg)
    # and a store opened at that object holds no keys (a listing that answers for the object
    # itself must not give it back as a key "")
    assert list(open_kvstore(url + "/note.txt", opts).list("")) == []


def test_timeout_options_go_under_the_users_s3_options() -> None:
    import argparse

    from ocdbt_py.cli.options import storage_options

    ns = argparse.Namespace(url="s3://b/x", timeout=3.0,
                            storage_option=[("config_kwargs", {"read_timeout": 60})])
    opts = storage_options(ns)
    assert opts == {"config_kwargs": {"connect_timeout": 3.0, "read_timeout": 60, "retries": {"max_attempts": 2}}}
    ns.timeout = 0.0
    assert storage_options(ns) == {"config_kwargs": {"read_timeout": 60}}
    assert storage_options(argparse.Namespace(url="/local", timeout=3.0, storage_option=[])) is None
