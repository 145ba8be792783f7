"""Crash safety: fail or kill the process at every I/O step of a commit in turn.

For single and numbered manifests, for a database's first commit and for a commit to an
existing database (with numbered-manifest pruning), a :class:`~ocdbt_py.testing.faults.FaultyStore`
makes each step of the commit raise, kill the process, or (for data-file writes) leave a torn
file and kill the process.  Afterwards the database must read as the last committed version
(the old one if the failure came before the manifest write, the new one after), ``verify``
must pass, and the next commit must succeed.  ``raise`` scenarios run in this process; those
that end the process run in a scenario server started as a fresh, single-threaded interpreter
(see ``tests/ocdbt_write/_crash_child.py``), never in a copy of this multi-threaded process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import ocdbt_py
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.read.version_read import MANIFEST_KEY
from ocdbt_py.testing.faults import KILL_STATUS, FaultyStore, InjectedFault
from tests.ocdbt_write._crash_child import NEW as _NEW
from tests.ocdbt_write._crash_child import RESULT_PREFIX, SERVER_SUPPORTED, scenario_line
from tests.ocdbt_write._crash_child import commit as _commit
from tests.ocdbt_write._crash_child import config as _config
from tests.ocdbt_write.helpers import assert_verified

Model = dict[bytes, bytes]

#: The repository root: the scenario server runs ``python -m tests.ocdbt_write._crash_child`` from it.
_REPO_ROOT = Path(__file__).resolve().parents[2]
#: How long the scenario server may take before the test fails (a hang must not stall CI).
_SERVER_TIMEOUT = 300.0


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


class _ScenarioServer:
    """A scenario server: ``python -m tests.ocdbt_write._crash_child serve`` in a fresh interpreter.

    A new interpreter, not a copy of this multi-threaded process; it runs each scenario in a
    copy of itself, one at a time.  It starts at once (its start-up overlaps the caller's
    preparations); it takes its scenarios, all together, in :meth:`submit` and works on them
    while the caller goes on; :meth:`results` waits for them.
    """

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        # NumPy's BLAS starts worker threads when imported; the server must stay single-threaded
        # to fork safely, and a commit does no linear algebra
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.ocdbt_write._crash_child", "serve"],
            cwd=_REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.submitted = 0

    def submit(self, scenarios: Sequence[tuple[Path, str, int, str]]) -> None:
        """Hand over every ``(path, kind, step, action)`` scenario; the server starts on them."""
        assert self.proc.stdin is not None
        self.submitted = len(scenarios)
        try:
            self.proc.stdin.write("".join(scenario_line(*s) for s in scenarios))
            self.proc.stdin.flush()  # ``results`` closes it: the end of the scenarios
        except BrokenPipeError:  # the server already ended; ``results`` says why
            pass

    def results(self) -> tuple[list[int], str]:
        """Wait for the submitted scenarios; their exit statuses in order, and the server's stderr."""
        try:
            out, err = self.proc.communicate(timeout=_SERVER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"crash scenario server hung\n{err}")
        assert self.proc.returncode == 0, (self.proc.returncode, err)
        codes = [int(line[len(RESULT_PREFIX) :]) for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        assert len(codes) == self.submitted, (out, err)
        return codes, err

    def kill(self) -> None:
        """End the server and the scenario it may be running, if still alive."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def _scenario_server() -> Iterator[_ScenarioServer]:
    server = _ScenarioServer()
    try:
        yield server
    finally:
        server.kill()
        for stream in (server.proc.stdin, server.proc.stdout, server.proc.stderr):
            if stream is not None:
                stream.close()


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


@pytest.mark.skipif(not SERVER_SUPPORTED, reason="no scenario server on this platform")
@pytest.mark.parametrize("existing", [False, True], ids=["first_commit", "existing_db"])
@pytest.mark.parametrize("kind", ["single", "numbered"])
def test_failure_at_every_step(tmp_path: Path, kind: str, existing: bool) -> None:
    with _scenario_server() as server:
        _failure_at_every_step(server, tmp_path, kind, existing)


def _failure_at_every_step(server: _ScenarioServer, tmp_path: Path, kind: str, existing: bool) -> None:
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
    # the scenarios that end the process go to the scenario server; "raise" runs in-process
    killed = [(step, action) for step, action in cases if action != "raise"]
    dirs = {(step, action): tmp_path / f"s{step}-{action}" for step, action in cases}
    for case in killed:
        shutil.copytree(template, dirs[case])
    server.submit([(dirs[case], kind, *case) for case in killed])
    for case in cases:
        if case[1] == "raise":
            shutil.copytree(template, dirs[case])
    codes, err = server.results()
    outcomes = dict(zip(killed, codes))
    for step, action in cases:
        d = dirs[step, action]
        if action == "raise":
            try:
                _commit(FaultyStore(LocalStore(d), fail_at=step, action="raise"), kind)
                raised = False
            except InjectedFault:
                raised = True
            # a failed delete while pruning old manifests is ignored; everything else surfaces
            assert raised or log[step][0] == "delete", (step, log[step])
        else:
            code = outcomes[step, action]
            assert code == KILL_STATUS, (step, action, code, err)
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
