"""``ocdbt tree`` and ``ocdbt export`` on the Orbax corpus (run in-process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.cli import main
from tests.checkpoint.conftest import Corpus, subprocess_env


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
    cap = capsys.readouterr()
    return status, cap.out, cap.err


def _flat_md(tree: object) -> list[checkpoint.LeafMetadata]:
    if isinstance(tree, checkpoint.LeafMetadata):
        return [tree]
    if isinstance(tree, dict):
        return [m for v in tree.values() for m in _flat_md(v)]
    if isinstance(tree, list):
        return [m for v in tree for m in _flat_md(v)]
    return []


def test_tree_item_dir(orbax_corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "tree", orbax_corpus.path("pytree_zarr3_ocdbt"))
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "BYTES", "STORED", "CHUNKS", "CODECS"]
    kernel = next(line for line in lines if "kernel" in line)
    assert "float32[8, 16]" in kernel and "512 B" in kernel and "2x8" in kernel and "zstd" in kernel
    assert any("str 'hello world'" in line for line in lines)
    leaves = _flat_md(checkpoint.metadata(orbax_corpus.path("pytree_zarr3_ocdbt")))
    n_arrays = sum(1 for m in leaves if m.kind in ("array", "scalar"))
    assert n_arrays == 30
    assert lines[-1] == f"{n_arrays} arrays, 1.3 KiB in memory, {lines[-1].split(', ')[2]}, {len(leaves)} leaves"


def test_tree_manager_root_and_step(orbax_corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    root = orbax_corpus.path("manager")
    status, out, _ = run(capsys, "tree", root)
    assert status == 0
    assert out.splitlines()[0] == "step 5 (steps: 0, 2, 4, 5)"
    assert "JSON {\"loss\": 2.0}" in out and "opt_state" in out
    status, out2, _ = run(capsys, "tree", root, "--step", "2", "--item", "params")
    assert status == 0 and out2.splitlines()[0].startswith("step 2") and "opt_state" not in out2
    status, _, err = run(capsys, "tree", root, "--step", "3")
    assert status == 1 and "no finalized step 3" in err and err.count("\n") == 1


def test_tree_json(orbax_corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tree", "--json", orbax_corpus.path("manager_commit_file"))
    assert status == 0
    doc = json.loads(out)
    assert doc["step"] == 2 and any("step 3" in s for s in doc["skipped"])
    assert doc["tree"]["x"]["shape"] == [4] and doc["tree"]["x"]["dtype"] == "float32"
    assert doc["tree"]["step"]["kind"] == "scalar"


def test_tree_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.txt").write_text("hi")
    status, _, err = run(capsys, "tree", tmp_path)
    assert status == 1 and "not an Orbax checkpoint" in err and "Traceback" not in err


def test_export_cli(orbax_corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("safetensors")
    import safetensors

    out = tmp_path / "m.safetensors"
    status, text, err = run(capsys, "export", orbax_corpus.path("manager"), out, "--exclude", "opt_state.*",
                            "--rename", "params.=model.", "--dtype", "float16")
    assert status == 0, err
    assert text.startswith("wrote 2 tensors")
    tensors = dict(safetensors.deserialize(out.read_bytes()))
    assert set(tensors) == {"model.w", "model.b"} and tensors["model.w"]["dtype"] == "F16"
    npz = tmp_path / "m.npz"
    status, _, err = run(capsys, "export", orbax_corpus.path("chunked_zarr3"), npz, "--include", "big")
    assert status == 0, err
    with np.load(npz) as z:
        assert z.files == ["big"]
        np.testing.assert_array_equal(z["big"], checkpoint.restore(orbax_corpus.path("chunked_zarr3"))["big"])
    status, _, err = run(capsys, "export", orbax_corpus.path("chunked_zarr3"), tmp_path / "x.bin")
    assert status == 2 and "--format" in err
    status, _, err = run(capsys, "export", orbax_corpus.path("pytree_zarr3_ocdbt"), tmp_path / "bad.safetensors")
    assert status == 1 and "int4" in err and not (tmp_path / "bad.safetensors").exists()
    assert not list(tmp_path.glob("*.tmp-*"))


def test_tree_subprocess_entry_point(orbax_corpus: Corpus) -> None:
    proc = subprocess.run([sys.executable, "-m", "ocdbt_py.cli", "tree", str(orbax_corpus.path("v1_pytree"))],
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "params" in proc.stdout and "kernel" in proc.stdout


def test_option_misuse_is_a_usage_error(orbax_corpus: Corpus, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    item = orbax_corpus.path("pytree_zarr3_ocdbt")
    status, _, err = run(capsys, "tree", item, "--step", "3")
    assert status == 2 and "CheckpointManager root" in err
    status, _, err = run(capsys, "export", item, tmp_path / "x.npz", "--item", "params")
    assert status == 2 and "step directory" in err
    status, _, err = run(capsys, "export", orbax_corpus.path("manager"), tmp_path / "x.npz", "--rename", "nope")
    assert status == 2 and "OLD=NEW" in err
