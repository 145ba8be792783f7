"""Restore, metadata and export work with JAX, TensorStore and Orbax made unimportable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.checkpoint.conftest import Corpus, subprocess_env

HERE = Path(__file__).resolve().parent


def test_corpus_without_jax_or_tensorstore(orbax_corpus: Corpus) -> None:
    proc = subprocess.run([sys.executable, str(HERE / "_no_jax_worker.py"), str(orbax_corpus.root)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["leaked"] == []
    assert len(summary["results"]) >= 20
    assert {k: v for k, v in summary["results"].items() if v} == {}
    assert sorted(summary["exported"]) == ["big", "rep", "tiny"]


def test_import_does_not_pull_in_jax() -> None:
    """Even where JAX is installed, importing and using the reader does not import it."""
    code = (
        "import sys, ocdbt_py.checkpoint as c\n"
        "from ocdbt_py.checkpoint import restore, metadata, LazyArray\n"
        "from ocdbt_py.bridges import export_safetensors\n"
        "import ocdbt_py.checkpoint.restore.api, ocdbt_py.checkpoint.meta, ocdbt_py.checkpoint.export\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'tensorstore', 'orbax')]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
