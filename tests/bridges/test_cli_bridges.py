"""``ocdbt export`` (sharded, --transpose, --map) and ``ocdbt import`` run in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.cli import main
from tests.bridges.test_safetensors import _flat, _load_dir, _same, _tree


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    status = main([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
    cap = capsys.readouterr()
    return status, cap.out, cap.err


def test_export_sharded_map_transpose_then_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint.save(tmp_path / "ckpt", _tree())
    m = tmp_path / "flax2hf.json"
    m.write_text(json.dumps([["^params\\.", ""], ["\\.kernel$", ".weight"]]))
    status, out, err = run(capsys, "export", tmp_path / "ckpt", tmp_path / "hf", "--max-shard-size", "3KB",
                           "--transpose", "*.kernel", "--map", m, "--exclude", "params.mask", "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["tensors"] == 5 and doc["files"][-1].endswith("model.safetensors.index.json") and len(doc["files"]) > 2
    got = _load_dir(tmp_path / "hf")
    src = _flat(_tree())
    assert sorted(got) == ["dense.bias", "dense.weight", "emb", "fp8", "steps"]
    _same(got["dense.weight"], np.ascontiguousarray(src["params.dense.kernel"].T))

    status, out, err = run(capsys, "import", tmp_path / "hf", tmp_path / "back", "--zarr3", "--chunk-byte-size",
                           "1KB", "--json")
    assert status == 0, err
    assert json.loads(out)["tensors"] == 5
    back = _flat(checkpoint.restore(tmp_path / "back"))
    _same(back["emb"], src["params.emb"])
    _same(back["dense.weight"], np.ascontiguousarray(src["params.dense.kernel"].T))
    # an existing checkpoint is not replaced without --force
    status, _, err = run(capsys, "import", tmp_path / "hf", tmp_path / "back")
    assert status == 1 and "exist" in err.lower()
    status, out, _ = run(capsys, "import", tmp_path / "hf", tmp_path / "back", "--force")
    assert status == 0 and out.startswith("imported 5 tensors")


def test_export_to_directory_defaults_to_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint.save(tmp_path / "ckpt", _tree())
    (tmp_path / "hf").mkdir()
    status, out, err = run(capsys, "export", tmp_path / "ckpt", tmp_path / "hf")
    assert status == 0, err
    assert os.listdir(tmp_path / "hf") == ["model.safetensors"] and "wrote 6 tensors" in out


@pytest.mark.parametrize("args", [
    ["--max-shard-size", "5 parsecs"],
    ["--map", "missing.json"],
    ["--format", "npz", "--max-shard-size", "1GB"],
])
def test_export_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    checkpoint.save(tmp_path / "ckpt", _tree())
    status, _, err = run(capsys, "export", tmp_path / "ckpt", tmp_path / "out", *args)
    assert status == 2, err


def test_import_usage_and_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "src").mkdir()
    status, _, err = run(capsys, "import", tmp_path / "src", tmp_path / "ckpt")
    assert status == 1 and "no .safetensors" in err
    (tmp_path / "src" / "x.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    status, _, err = run(capsys, "import", tmp_path / "src", tmp_path / "ckpt")
    assert status == 1 and "limit" in err
    status, _, err = run(capsys, "import", tmp_path / "src", tmp_path / "ckpt", "--chunk-byte-size", "lots")
    assert status == 2
