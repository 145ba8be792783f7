"""The inspection commands on checkpoints Orbax wrote, over its layouts: OCDBT or one directory
per array, Zarr v2 or v3; values against NumPy and against our own save of the same tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.inspect import diff, du, report, stats
from tests.inspect.conftest import assert_stats_match, planted

ocp = pytest.importorskip("orbax.checkpoint")
pytestmark = pytest.mark.orbax

LAYOUTS = [(True, False), (True, True), (False, False), (False, True)]  # (use_ocdbt, use_zarr3)


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(9)
    return {
        "params": {n: planted(n, (40, 30), seed=i) for i, n in enumerate(("float32", "bfloat16", "float16", "int8"))},
        "big": rng.standard_normal((512, 256)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def orbax_ckpts(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[tuple[bool, bool], Path], Any]:
    tree = _tree()
    base = tmp_path_factory.mktemp("orbax_layouts")
    out = {}
    for use_ocdbt, use_zarr3 in LAYOUTS:
        path = base / f"ocdbt{int(use_ocdbt)}_zarr3{int(use_zarr3)}"
        handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
        with ocp.Checkpointer(handler) as c:
            c.save(path, args=ocp.args.PyTreeSave(tree))
        out[(use_ocdbt, use_zarr3)] = path
    return out, tree


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"ocdbt{int(x[0])}-zarr3{int(x[1])}")
def test_orbax_layout(layout: tuple[bool, bool], orbax_ckpts: Any, tmp_path: Path, cli: Any) -> None:
    paths, tree = orbax_ckpts
    path = paths[layout]
    assert ((path / "manifest.ocdbt").exists()) == layout[0]
    assert_stats_match({k: v.to_json() for k, v in stats(path).items()}, tree)
    ours = tmp_path / "ours"
    checkpoint.save(ours, tree)
    res = diff(path, ours)
    assert res.equal, res.changed
    edited = {"params": dict(tree["params"]), "big": tree["big"].copy()}
    edited["big"][7, 7] = np.inf
    checkpoint.save(tmp_path / "edited", edited)
    res = diff(path, tmp_path / "edited")
    assert list(res.changed) == ["big"] and res.changed["big"]["nonfinite_diff"] == 1
    u = du(path)
    for name, x in u.tensors.items():
        assert x.stored_bytes and x.stored_bytes > 0, name
    assert bool(u.data_files) == layout[0]
    r = cli("stats", "--json", path)
    assert r.status == 0
    assert_stats_match(json.loads(r.out), tree)
    data = report(path, tmp_path / "r.html")
    assert set(data.stats) == {"params.float32", "params.bfloat16", "params.float16", "params.int8", "big"}
