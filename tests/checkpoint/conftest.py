"""Fixtures for the Orbax checkpoint reader tests.

``orbax_corpus`` writes real Orbax checkpoints once per test session (the generator runs in a
subprocess with 8 forced CPU devices, plus a 2-process ``jax.distributed`` save) and records
Orbax's own restore of each.  Set ``OCDBT_TEST_ORBAX_CORPUS=/some/dir`` to reuse a corpus
generated earlier with ``conformance/checkpoint/gen_orbax_corpus.py /some/dir``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
GEN_DIR = REPO / "conformance" / "checkpoint"
if str(GEN_DIR) not in sys.path:
    sys.path.insert(0, str(GEN_DIR))

from _expected import compare, load_expected  # noqa: E402

__all__ = ["Corpus", "compare", "load_expected", "REPO", "GEN_DIR", "subprocess_env"]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for helper subprocesses: this repo importable, quiet JAX on CPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop("XLA_FLAGS", None)
    env.update(extra)
    return env


class Corpus:
    """A generated corpus: ``root/corpus.json`` plus checkpoints and expected records."""

    def __init__(self, root: Path):
        self.root = root
        self.info: dict[str, Any] = json.loads((root / "corpus.json").read_text())
        self.cases: dict[str, dict[str, Any]] = self.info["cases"]

    def path(self, name: str) -> Path:
        return self.root / self.cases[name]["path"]

    def expected(self, name: str) -> Any:
        return load_expected(str(self.root / self.cases[name]["expected"]))["tree"]

    def with_expected(self) -> list[str]:
        return [n for n, c in self.cases.items() if "expected" in c]


def _have(*mods: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in mods)


@pytest.fixture(scope="session")
def orbax_corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """The Orbax-written corpus (generated once per session; skipped without Orbax/JAX)."""
    pre = os.environ.get("OCDBT_TEST_ORBAX_CORPUS")
    if pre and (Path(pre) / "corpus.json").exists():
        return Corpus(Path(pre))
    if not _have("jax", "orbax.checkpoint", "tensorstore"):
        pytest.skip("orbax-checkpoint, jax and tensorstore are needed to generate the corpus")
    out = tmp_path_factory.mktemp("orbax_corpus")
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(GEN_DIR / "gen_orbax_corpus.py"), str(out)],
        env=subprocess_env(), capture_output=True, text=True, timeout=900,
    )
    if proc.returncode != 0 or not (out / "corpus.json").exists():
        pytest.fail(f"corpus generation failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    corpus = Corpus(out)
    corpus.info["generation_seconds"] = time.time() - t0
    return corpus
