"""The goodput benchmark (``bench/bench_manager.py``) runs end to end on a tiny model.

Not a performance test: it checks that the script still drives our ``CheckpointManager`` (and
its figures are consistent), so the benchmark cannot rot.  Orbax is left out (its import alone
takes seconds); the full script compares against it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "bench_manager.py"


def test_help() -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "--step-time" in p.stdout and "--variants" in p.stdout


def test_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    argv = [sys.executable, str(SCRIPT), "--d-model", "32", "--layers", "1", "--vocab", "64",
            "--steps", "24", "--warmup", "2", "--step-time", "0.01", "--fixed-interval", "8",
            "--min-interval", "1000", "--configs", "baseline,continuous,continuous-min,fixed",
            "--tmp", str(tmp_path), "--json", str(out)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "## Checkpoint manager goodput" in p.stdout
    assert "| continuous |" in p.stdout and "Targets (`Continuous`" in p.stdout
    res = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert set(res) == {"baseline", "continuous", "continuous-min", "fixed"}
    for r in res.values():
        assert r["steps"] == 24
        assert r["mean"] >= 0.01 * 0.95  # each step lasts at least --step-time
        assert r["p50"] <= r["p95"]
    assert res["baseline"]["commits"] == 0 and res["baseline"]["saves"] == 0
    # FixedInterval(8) over steps 2..25 saves exactly steps 8, 16 and 24.
    assert res["fixed"]["saves"] == 3
    assert res["fixed"]["commits"] >= 2  # the last may commit after the loop ends
    assert res["fixed"]["restore"] is not None and res["fixed"]["restore"] > 0
    # A 1000 s minimum interval: only the warmup's first save, nothing in the window.
    assert res["continuous-min"]["saves"] == 0
    # Continuous saves back to back: several saves, each committed before the next starts.
    c = res["continuous"]
    assert c["saves"] >= 2 and c["commits"] >= 1
    assert c["duration_p50"] is not None and c["duration_p50"] > 0
    assert c["lost_per_failure"] > 0 and 0 < c["goodput"]["3600.0"] <= 1.0 / (1 + c["overhead"]) + 1e-9
    # Nothing is left behind in the temporary directory.
    assert not any(p.name.startswith("bench_manager_") for p in tmp_path.iterdir())


@pytest.mark.parametrize("value", ["bogus"])
def test_unknown_config_is_rejected(value: str) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--configs", value], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "unknown config" in p.stderr
