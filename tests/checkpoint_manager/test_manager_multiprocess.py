"""A real 2-process ``jax.distributed`` job (127.0.0.1, gloo) using one CheckpointManager per
process: timing-dependent decisions agree, the steps commit, retention runs once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ocdbt_py.checkpoint.manager import CheckpointManager

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_job(worker: str, root: Path) -> list[dict]:
    pytest.importorskip("jax")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(HERE.parent.parent))
    procs = [subprocess.Popen([sys.executable, str(HERE / worker), str(root), str(i), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, err[-3000:]
        results.append(json.loads(lines[-1][len("RESULT "):]))
    for r in results:
        assert "error" not in r, r
    return results


def test_two_processes_agree_on_continuous_decisions(tmp_path: Path) -> None:
    a, b = _run_job("_mp_manager_worker.py", tmp_path)
    assert a["decisions"] == b["decisions"]
    assert a["decisions"][0] is True and sum(a["decisions"]) >= 2
    saved = [i for i, d in enumerate(a["decisions"]) if d]
    assert a["steps"] == b["steps"] == saved[-2:]
    assert a["latest"] == b["latest"] == saved[-1]
    assert a["restored_ok"] and b["restored_ok"] and a["sharded"] and b["sharded"]
    assert CheckpointManager(tmp_path, read_only=True).all_steps() == saved[-2:]
    assert sorted(os.listdir(tmp_path)) == sorted(str(s) for s in saved[-2:])


def test_sigterm_to_one_process_saves_everywhere_at_one_step(tmp_path: Path) -> None:
    """JAX's preemption sync manager picks one step for both processes, though only process 1
    received SIGTERM; both save it and stop there."""
    from ocdbt_py.checkpoint import restore

    a, b = _run_job("_mp_preempt_worker.py", tmp_path)
    assert a["stop"] is not None and a["stop"] == b["stop"] >= 20
    assert a["saved"] == b["saved"] == [a["stop"]]
    assert CheckpointManager(tmp_path, read_only=True).all_steps() == [a["stop"]]
    assert restore(tmp_path)["w"].tolist() == [float(a["stop"])] * 4
