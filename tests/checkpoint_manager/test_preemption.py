"""Preemption: SIGTERM turns the next step into a save, and the process keeps running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ocdbt_py.checkpoint import restore

HERE = Path(__file__).parent


def test_sigterm_saves_at_the_preemption_step(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent.parent))
    proc = subprocess.run([sys.executable, str(HERE / "_preempt_worker.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"saved": [7], "stopped": 7, "steps": [7], "handler_restored": True}
    np.testing.assert_array_equal(restore(tmp_path)["w"], np.full(4, 7, np.float32))


def test_without_a_preemption_policy_sigterm_is_not_intercepted(tmp_path: Path) -> None:
    code = (
        "import os, signal, numpy as np\n"
        "from ocdbt_py.checkpoint.manager import CheckpointManager, FixedInterval\n"
        f"m = CheckpointManager({str(tmp_path)!r}, save_policy=FixedInterval(1))\n"
        "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
        "m.save(0, {'default': {'w': np.ones(2)}}); m.close()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "import time; time.sleep(30)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(HERE.parent.parent)))
    assert proc.returncode == -15, (proc.returncode, proc.stderr)
