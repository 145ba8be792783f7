"""Several processes commit to one local database at the same time; nothing is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ocdbt_py
from tests.ocdbt_write.helpers import assert_verified, ts_snapshot

N_PROCS = 3
M_TXNS = 15
N_INCREMENTS = 10

_WORKER = textwrap.dedent("""
    import sys, time
    import ocdbt_py
    from ocdbt_py.errors import ConditionFailedError
    path, kind, worker, m, incs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start = float(sys.argv[6])
    while time.time() < start:
        time.sleep(0.001)
    db = ocdbt_py.open(path, mode="a", config={"manifest_kind": kind, "max_inline_value_bytes": 8})
    for i in range(m):
        with db.transaction() as t:
            t.put(b"w%d/%03d/a" % (worker, i), b"value a %d %d" % (worker, i))
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

_TS_WORKER = textwrap.dedent("""
    import sys, time
    import tensorstore as ts
    path, m, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    while time.time() < start:
        time.sleep(0.001)
    kv = ts.KvStore.open({"driver": "ocdbt", "base": "file://" + path + "/",
                          "config": {"max_inline_value_bytes": 8}}).result()
    for i in range(m):
        txn = ts.Transaction(atomic=True)
        kvt = kv.with_transaction(txn)
        kvt[b"ts/%03d" % i] = b"from tensorstore %d" % i
        txn.commit_sync()
""")


def _run(tmp_path: Path, kind: str, with_tensorstore: bool) -> None:
    import time

    path = tmp_path / "db"
    start = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(path), kind, str(w), str(M_TXNS), str(N_INCREMENTS), str(start)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for w in range(N_PROCS)
    ]
    if with_tensorstore:
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _TS_WORKER, str(path), str(M_TXNS), str(start)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()[-3000:]
    conflicts = sum(int(out) for out, _ in outs[:N_PROCS])
    print(f"{conflicts} lost manifest races were retried")
    db = ocdbt_py.open(path)
    items = dict(db.items())
    for w in range(N_PROCS):
        for i in range(M_TXNS):
            assert items[b"w%d/%03d/a" % (w, i)] == b"value a %d %d" % (w, i)
            assert items[b"w%d/%03d/b" % (w, i)] == b"b"
    assert items[b"counter"] == b"%d" % (N_PROCS * N_INCREMENTS)
    n_ts = M_TXNS if with_tensorstore else 0
    assert sum(k.startswith(b"ts/") for k in items) == n_ts
    # every transaction is its own generation, after the initial empty one
    gens = [v.generation for v in db.versions()]
    assert gens == list(range(1, 2 + N_PROCS * (M_TXNS + N_INCREMENTS) + n_ts))
    assert_verified(path)
    assert ts_snapshot(path) == items


@pytest.mark.parametrize("kind", ["single", "numbered"])
def test_processes_commit_concurrently(tmp_path: Path, kind: str) -> None:
    _run(tmp_path, kind, with_tensorstore=False)


def test_tensorstore_and_ocdbt_py_commit_concurrently(tmp_path: Path) -> None:
    pytest.importorskip("tensorstore")
    _run(tmp_path, "single", with_tensorstore=True)
