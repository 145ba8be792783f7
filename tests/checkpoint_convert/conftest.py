"""Fixtures of the copy tests: Orbax-written source checkpoints, and the Orbax worker."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FIXTURES = REPO / "conformance" / "fixtures" / "checkpoint" / "orbax-0.5.10" / "ckpt"


def have_oracle() -> bool:
    """Whether Orbax, TensorStore and JAX are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("jax", "orbax.checkpoint", "tensorstore"))


def run_worker(jobs: list[dict[str, Any]], workdir: Path, timeout: float = 900) -> dict[str, Any]:
    """Run ``_cp_worker.py`` on ``jobs``; returns its report."""
    jobs_file, report_file = workdir / "jobs.json", workdir / "report.json"
    jobs_file.write_text(json.dumps(jobs))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, str(HERE / "_cp_worker.py"), str(jobs_file), str(report_file)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not report_file.exists():
        pytest.fail(f"Orbax worker failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    report: dict[str, Any] = json.loads(report_file.read_text())
    return report


@pytest.fixture(scope="session")
def orbax_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints Orbax 0.12 wrote: ``pp2``/``pp3`` (per-parameter, Zarr v2/v3), ``oc2``/``oc3``
    (OCDBT) of a sharded tree, and ``mgr`` (a manager root of composite steps, per-parameter
    state and a JSON item)."""
    if not have_oracle():
        pytest.skip("orbax-checkpoint, jax and tensorstore are needed")
    root = tmp_path_factory.mktemp("cp_sources")
    report = run_worker([{"name": "save", "kind": "save", "root": str(root)}], root)
    assert report["save"]["errors"] == []
    return root
