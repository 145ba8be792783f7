"""N writer processes commit to one OCDBT database on the S3 server and on the Azure emulator
at the same time, through obstore's conditional puts and through the fsspec clients': no commit
is lost.  The processes get their endpoint and credentials only from the services' usual
environment variables."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import ocdbt_py
from ocdbt_py.maintenance.verify import verify
from tests.objectstores import servers

N_PROCS = 4
M_TXNS = 6
N_INCREMENTS = 5
BUCKET = "ocdbt-multi"
_n = itertools.count()

_WORKER = textwrap.dedent("""
    import sys, time
    import ocdbt_py
    from ocdbt_py.errors import ConditionFailedError
    url, worker, m, incs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    db = ocdbt_py.open(url, mode="a", config={"max_inline_value_bytes": 8})
    print("READY", type(db.kvstore).__name__, flush=True)
    sys.stdin.readline()  # the go signal: every writer is ready
    for i in range(m):
        with db.transaction() as t:
            t.put(b"w%d/%03d/a" % (worker, i), b"value from writer %d txn %d" % (worker, i))
            t.put(b"w%d/%03d/b" % (worker, i), b"b")
            t.put(b"last", b"%d" % worker)
    done = 0
    while done < incs:  # read-modify-write with optimistic retries
        try:
            with db.transaction() as t:
                n = int(t.get(b"counter") or b"0")
                t.put(b"counter", b"%d" % (n + 1))
            done += 1
        except ConditionFailedError:
            pass
    print(db._writer.conflicts)
""")


BACKEND_CLASS = {"obstore": ("ObstoreStore",), "fsspec": ("S3Store", "AzureStore")}


def _run_writers(url: str, env_extra: dict[str, str], backend: str) -> list[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "STORAGE_EMULATOR"))}
    env.update(env_extra)
    env["OCDBT_PY_BACKEND"] = backend
    env["PYTHONPATH"] = str(servers.REPO) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, str(w), str(M_TXNS), str(N_INCREMENTS)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for w in range(N_PROCS)
    ]
    try:
        for p in procs:  # wait until every process has imported and opened the database
            assert p.stdout is not None
            line = p.stdout.readline()
            words = line.decode().split()
            assert words[:1] == ["READY"], (line, p.stderr.read().decode()[-3000:] if p.stderr else "")
            assert words[1] in BACKEND_CLASS[backend], words
        for p in procs:  # then release them together
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        conflicts = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err.decode()[-3000:]
            conflicts.append(int(out.split()[-1]))
        return conflicts
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _check(url: str, opts: dict[str, Any]) -> None:
    db = ocdbt_py.open(url, storage_options=opts)
    for w in range(N_PROCS):
        for i in range(M_TXNS):
            assert db.get(b"w%d/%03d/a" % (w, i)) == b"value from writer %d txn %d" % (w, i)
            assert db.get(b"w%d/%03d/b" % (w, i)) == b"b"
    assert db.get(b"counter") == b"%d" % (N_PROCS * N_INCREMENTS)
    assert int(db.get(b"last") or b"-1") in range(N_PROCS)
    # one generation per commit, plus the initial empty one
    assert db.generation == 1 + N_PROCS * (M_TXNS + N_INCREMENTS)
    assert len(list(db.list())) == 2 * N_PROCS * M_TXNS + 2
    report = verify(url, storage_options=opts)
    assert report.ok, report.format()


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
@pytest.mark.parametrize("kind", ["s3", "azure"])
def test_concurrent_writer_processes(kind: str, backend: str, request: pytest.FixtureRequest) -> None:
    srv: Any = request.getfixturevalue(f"{kind}_server")
    srv.make_bucket(BUCKET)
    scheme = {"s3": "s3", "azure": "az"}[kind]
    url = f"{scheme}://{BUCKET}/db{next(_n)}"
    conflicts = _run_writers(url, srv.env(), backend)
    _check(url, {**srv.storage_options(), "backend": backend})
    # the writers really raced (otherwise this test proves nothing)
    assert sum(conflicts) > 0, conflicts
