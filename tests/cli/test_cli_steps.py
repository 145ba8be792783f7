"""``ocdbt steps``: the steps of a CheckpointManager root."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ocdbt_py.checkpoint import JsonItem
from ocdbt_py.checkpoint.manager import CheckpointManager
from tests.cli.conftest import Result


def _root(path: Path, **kw: object) -> Path:
    with CheckpointManager(path, async_save=False, **kw) as mgr:  # type: ignore[arg-type]
        for step in (3, 7):
            mgr.save(step, {"params": {"w": np.ones(2)}, "cfg": JsonItem({})}, metrics={"loss": step / 2})
    return path


def test_steps_lists_committed_steps(cli: Callable[..., Result], tmp_path: Path) -> None:
    root = _root(tmp_path / "run")
    (root / "9.orbax-checkpoint-tmp").mkdir()  # a save in flight is not a step
    r = cli("steps", root)
    assert r.status == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["STEP", "NAME", "COMMIT", "TIME", "(UTC)", "ITEMS", "METRICS"]
    assert [ln.split()[0] for ln in lines[1:]] == ["3", "7"]
    assert "cfg,metrics,params" in lines[1] and "loss=1.5" in lines[1]
    doc = json.loads(cli("steps", root, "--json").out)
    assert [d["step"] for d in doc] == [3, 7]
    assert doc[1]["metrics"] == {"loss": 3.5} and doc[1]["items"] == ["cfg", "metrics", "params"]
    assert doc[0]["commit_time"].endswith("Z")


def test_steps_with_a_prefix_and_errors(cli: Callable[..., Result], tmp_path: Path) -> None:
    root = _root(tmp_path / "run", step_prefix="ckpt", step_format_fixed_length=4)
    r = cli("steps", root, "--json")  # plain-integer names: none, and the fix is named
    assert r.status == 2 and "pass --prefix ckpt --width 4" in r.err and r.out == ""
    doc = json.loads(cli("steps", root, "--prefix", "ckpt", "--width", "4", "--json").out)
    assert [d["name"] for d in doc] == ["ckpt_0003", "ckpt_0007"]
    r = cli("steps", tmp_path / "missing")
    assert r.status == 1 and "does not exist" in r.err
    assert cli("steps", root, "--width", "0").status == 2
