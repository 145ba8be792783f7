"""Crash safety: fail or kill the process at every I/O step of a commit in turn.

For single and numbered manifests, for a database's first commit and for a commit to an
existing database (with numbered-manifest pruning), a :class:`~ocdbt_py.faults.FaultyStore`
makes each step of the commit raise, kill the process, or (for data-file writes) leave a torn
file and kill the process.  Afterwards the database must read as the last committed version
(the old one if the failure came before the manifest write, the new one after), ``verify``
must pass, and the next commit must succeed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import ocdbt_py
from ocdbt_py.faults import KILL_STATUS, FaultyStore, InjectedFault
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.version_read import MANIFEST_KEY
from tests.ocdbt_write.helpers import assert_verified

Model = dict[bytes, bytes]

_NEW: Model = {b"new/%d" % i: b"v%d" % i * (i * 40) for i in range(6)}


def _config(kind: str) -> dict[str, Any]:
    return {"manifest_kind": kind, "version_tree_arity_log2": 2, "max_inline_value_bytes": 50}


def _commit(store: Any, kind: str) -> None:
    db = ocdbt_py.open(store, mode="a", config=_config(kind))
    with db.transaction() as t:
        for k, v in _NEW.items():
            t.put(k, v)
        t.delete(b"old/0")


def _prepare(path: Path, kind: str, existing: bool) -> Model:
    if not existing:
        path.mkdir(parents=True)
        return {}
    db = ocdbt_py.open(path, mode="a", config=_config(kind))
    model: Model = {}
    for i in range(131 if kind == "numbered" else 12):  # numbered: the next commit prunes
        k = b"old/%d" % (i % 9)
        model[k] = b"%d" % i * (i % 5 * 30)
        db.put(k, model[k])
    return model


def _expected_after(model: Model) -> Model:
    out = dict(model)
    out.update(_NEW)
    out.pop(b"old/0", None)
    return out


def _commit_point(log: list[tuple[str, str]], kind: str) -> int:
    """Index of the step that makes the commit visible (the last manifest write)."""
    if kind == "single":
        return max(i for i, (op, key) in enumerate(log) if op == "set_if" and key == MANIFEST_KEY)
    return max(i for i, (op, key) in enumerate(log) if op == "set_if" and key != MANIFEST_KEY)


def _initial_point(log: list[tuple[str, str]], kind: str) -> int:
    """Index of the step that writes the initial manifest (empty generation 1)."""
    key = MANIFEST_KEY if kind == "single" else f"manifest.{1:016x}"
    return min(i for i, (op, k) in enumerate(log) if op == "set_if" and k == key)


def _run_in_child(path: Path, kind: str, step: int, action: str) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            _commit(FaultyStore(LocalStore(path), fail_at=step, action=action), kind)
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _check(path: Path, kind: str, want: Model, gen: int) -> None:
    db = ocdbt_py.open(path)
    assert db.generation == gen
    assert dict(db.items()) == want
    assert_verified(path)
    # the database accepts the next commit
    w = ocdbt_py.open(path, mode="a", config=_config(kind))
    w.put(b"after", b"crash")
    assert ocdbt_py.open(path)[b"after"] == b"crash"
    assert_verified(path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("existing", [False, True], ids=["first_commit", "existing_db"])
@pytest.mark.parametrize("kind", ["single", "numbered"])
def test_failure_at_every_step(tmp_path: Path, kind: str, existing: bool) -> None:
    template = tmp_path / "template"
    model = _prepare(template, kind, existing)
    old_gen = ocdbt_py.open(template).generation if existing else 0
    # count the steps of one commit
    probe_dir = tmp_path / "probe"
    shutil.copytree(template, probe_dir)
    probe = FaultyStore(LocalStore(probe_dir))
    _commit(probe, kind)
    log = probe.log
    point = _commit_point(log, kind)
    new_gen = ocdbt_py.open(probe_dir).generation
    assert new_gen == (old_gen + 1 if existing else 2)
    ops = {op for op, _ in log}
    assert {"set", "set_if"} <= ops
    if kind == "numbered" and existing:
        assert "delete" in ops  # pruning is among the steps
    cases = [(s, a) for s in range(len(log)) for a in ("raise", "kill")]
    cases += [(s, "torn") for s, (op, _) in enumerate(log) if op == "set"]
    for step, action in cases:
        d = tmp_path / f"s{step}-{action}"
        shutil.copytree(template, d)
        if action == "raise":
            try:
                _commit(FaultyStore(LocalStore(d), fail_at=step, action="raise"), kind)
                raised = False
            except InjectedFault:
                raised = True
            # a failed delete while pruning old manifests is ignored; everything else surfaces
            assert raised or log[step][0] == "delete", (step, log[step])
        else:
            code = _run_in_child(d, kind, step, action)
            assert code == KILL_STATUS, (step, action, code)
        committed = step > point
        if not existing and not committed and step > _initial_point(log, kind):
            # the initial manifest (empty generation 1) was already written
            want_gen = 1
        else:
            want_gen = new_gen if committed else old_gen
        if want_gen == 0:
            assert not (d / "manifest.ocdbt").exists() or ocdbt_py.open(d).generation == 0
            ocdbt_py.open(d, mode="a", config=_config(kind)).put(b"after", b"crash")
            assert dict(ocdbt_py.open(d).items()) == {b"after": b"crash"}
            assert_verified(d)
        else:
            _check(d, kind, _expected_after(model) if committed else model, want_gen)
        shutil.rmtree(d)
