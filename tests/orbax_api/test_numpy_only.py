"""``import ocdbt_py.orbax as ocp`` without JAX: the NumPy-only snippets run and give the
results Orbax gives (the expected values here are the ones the twice-run conformance test
checks against Orbax itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    work = tmp_path_factory.mktemp("npo")
    proc = subprocess.run([sys.executable, str(HERE / "_numpy_only_script.py"), str(work)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_jax_never_imported(results: dict) -> None:
    assert results["jax_loaded"] is False


def test_chunks_and_dtype(results: dict) -> None:
    r = results["chunks"]["read"]
    # float32 kernel (16, 8) in 128-byte chunks; float16 embed (32, 4) in 64-byte chunks
    assert r["chunks"] == {"kernel": [4, 8], "embed": [8, 4], "embed_dtype": "float16"}
    assert r["restored"]["embed"]["dtype"] == "float16"
    assert r["restored"]["step"] == 1


def test_continuous_min_interval(results: dict) -> None:
    w = results["continuous"]["write"]
    assert w["saved"] == [True, False, False, True, False, False]
    assert w["steps"] == [0, 3]


def test_custom_preservation_policy(results: dict) -> None:
    kept = results["custom_policy"]["write"]["kept"]
    assert kept[-1] == [0, 2, 4, 6]
    assert kept[3] == [0, 2, 3]


def test_retention_options(results: dict) -> None:
    w = results["retention"]["write"]
    assert w["latest2"]["kept"][-1] == [5, 6]
    # keep_period=4 keeps 0 and 4; the best 2 by loss (min) are 3 (1.0) and 5 (2.0)
    assert w["period_best"]["kept"][-1] == [0, 3, 4, 5]
    assert w["period_best"]["best"] == 3
    # BestN deletes the newest step when it is not among the best (Orbax's semantics)
    assert w["best1_max"]["kept"][2] == [1]
    assert w["best1_max"]["kept"][-1] == [3]
    assert w["interval3"]["saved"] == [True, False, False, True, False, False, True]
    assert w["interval3"]["kept"][-1] == [0, 3, 6]


def test_standard_checkpointer(results: dict) -> None:
    r = results["standard_np"]["read"]
    assert r["target"]["step"] == 3
    assert r["plain"]["step"]["dtype"] == "int64"  # a NumPy scalar is saved as a 0-d array
    assert r["target"]["dense"]["kernel"]["dtype"] == "float32"
    assert np.asarray(r["plain"]["embed"]["values"]).shape == (128,)


def test_root_and_step_metadata(results: dict) -> None:
    r = results["metadata"]["read"]
    assert r["root"] == {"model": "tiny", "layers": 2}
    assert r["custom"] == {"note": "first"} and r["metrics"] == {"acc": 0.25}
    assert r["w"] == [[2, 3], "float32"]


def test_continuous_waits_for_the_save_in_flight(results: dict) -> None:
    w = results["continuous_in_flight"]["write"]
    assert w == {"first": True, "busy": [True, False], "after": [False, True], "steps": [0]}


def test_item_handlers_and_legacy_calls(results: dict) -> None:
    r = results["handlers"]["read"]
    assert results["handlers"]["write"]["kept"] == [1]
    assert r["zarr"] == 3 and r["only"] == ["cfg"] and r["cfg"] == {"step": 1, "name": "run"}
    assert r["legacy"]["s"] == "text" and r["legacy"]["n"] is None
    assert r["typed"]["a"]["dtype"] == "float32"
