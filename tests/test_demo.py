"""`make demo` is half of the README's contract: run it as the Makefile does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("orbax.checkpoint")
    pytest.importorskip("jax")
    p = subprocess.run(
        [sys.executable, "-m", "ocdbt_py.demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "matches what Orbax saved" in p.stdout
    assert "Orbax restored" in p.stdout and "-> matches" in p.stdout
    assert "verify: clean" in p.stdout
    assert "modules loaded in this process from JAX/TensorStore: none" in p.stdout
    assert "kept [20, 50, 60], best 20" in p.stdout
    assert "Orbax's CheckpointManager: steps [20, 50, 60] best 20 -> matches" in p.stdout
