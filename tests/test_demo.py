"""`make demo` is half of the README's contract: run it as the Makefile does."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from ocdbt_py.demo import TRY_NEXT_CLI


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocdbt_py.demo", *extra], cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    p = _run(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "every leaf: matches what was saved" in out
    assert "verify: clean" in out
    assert "modules loaded in this process from JAX/TensorStore/Orbax: none" in out
    assert "kept [20, 50, 60], best 20; restored step 20: matches" in out
    assert "at generation 2: greeting=b'hello, OCDBT'" in out
    assert "... and" not in out  # the small demo lists every file
    if importlib.util.find_spec("orbax") and importlib.util.find_spec("jax"):
        assert "Orbax restored" in out and "-> matches" in out
        assert "Orbax's CheckpointManager: steps [20, 50, 60] best 20 -> matches" in out
    else:
        assert "skipped: Orbax and JAX are not installed" in out
    # it ends with the README's tour, against the paths it left behind (relative to its cwd)
    for line in TRY_NEXT_CLI:
        assert "  " + line.format(d="demo-output") + "\n" in out
    assert (tmp_path / "demo-output" / "ckpt" / "manifest.ocdbt").exists()
    assert (tmp_path / "demo-output" / "run" / "20").is_dir()


def test_demo_says_when_orbax_is_skipped(tmp_path: Path) -> None:
    p = _run(tmp_path, "--skip-orbax", "--dir", "elsewhere")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "skipped (--skip-orbax)" in p.stdout
    assert "  ocdbt steps elsewhere/run\n" in p.stdout
