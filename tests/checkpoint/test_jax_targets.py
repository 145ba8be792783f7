"""Restoring into JAX arrays with shardings on a different mesh (8 CPU devices, subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoint.conftest import Corpus, subprocess_env

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def jax_results(orbax_corpus: Corpus) -> dict[str, list[str]]:
    pytest.importorskip("jax")
    pytest.importorskip("orbax.checkpoint")
    proc = subprocess.run([sys.executable, str(HERE / "_jax_target_worker.py"), str(orbax_corpus.root)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check", [
    "resharded_matches_orbax",
    "partial_subtree_and_cast",
    "jax_array_target_and_numpy_leaves",
    "prng_keys",
    "each_region_read_once_per_device_domain",
    "step_dir_targets_per_item",
])
def test_jax_targets(jax_results: dict[str, list[str]], check: str) -> None:
    assert check in jax_results
    assert jax_results[check] == []
