"""``diff()``/``ocdbt diff`` against known edits, and ``du()``/``ocdbt du`` against the stored
sizes; on checkpoints saved by us in several layouts and steps of a manager root."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.manager.manager import CheckpointManager
from ocdbt_py.inspect.diff import diff
from ocdbt_py.inspect.du import du, subtree_usage
from tests.inspect.conftest import flatten, planted_tree


def _save(path: Path, tree: Any, **kw: Any) -> Path:
    checkpoint.save(path, tree, chunk_byte_size=2048, **kw)
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tree = planted_tree(seed=2)
    return _save(tmp_path_factory.mktemp("base") / "a", tree), tree


def _edited(tree: Any) -> Any:
    t = {"params": dict(tree["params"]), "clean": tree["clean"].copy(), "step": tree["step"]}
    t["clean"][100, 7] += 0.25                      # one value: one chunk differs
    t["clean"][200, 50] = np.nan                    # a NaN where there was a number
    t["params"]["bfloat16"] = t["params"]["bfloat16"][:30]          # shape change
    t["params"]["int8"] = t["params"]["int8"].astype(np.int16)      # dtype change
    del t["params"]["int4"]                                          # removed
    t["params"]["new"] = np.zeros(4, ml_dtypes.bfloat16)            # added
    return t


def test_identical_checkpoints_decode_nothing(base: tuple[Path, Any]) -> None:
    path, tree = base
    res = diff(path, path)
    assert res.equal and sorted(res.unchanged) == sorted(flatten(tree))


def test_known_edits(base: tuple[Path, Any], tmp_path: Path) -> None:
    path, tree = base
    b = _save(tmp_path / "b", _edited(tree))
    res = diff(path, b)
    assert res.removed == ["params.int4"] and res.added == ["params.new"]
    assert res.changed["params.bfloat16"]["reason"] == "shape"
    assert res.changed["params.int8"] == {"reason": "dtype", "shape_a": [37, 29], "shape_b": [37, 29],
                                          "dtype_a": "int8", "dtype_b": "int16"}
    c = res.changed["clean"]
    assert c["reason"] == "values" and c["n_diff"] == 2 and c["nonfinite_diff"] == 1
    assert c["max_abs_diff"] == pytest.approx(0.25, abs=1e-6)
    assert c["l2"] == pytest.approx(0.25, abs=1e-6)
    old = float(tree["clean"][100, 7])
    assert c["max_rel_diff"] == pytest.approx(0.25 / max(abs(old), abs(old + 0.25)), rel=1e-5)
    # stored bytes were compared first: only the two edited chunks were decoded
    assert c["chunks"] - c["chunks_same_bytes"] == 2 and c["chunks"] > 10
    assert set(res.unchanged) == set(flatten(tree)) - {"params.int4", "params.bfloat16", "params.int8", "clean"}
    assert not res.equal


def test_tolerances(base: tuple[Path, Any], tmp_path: Path) -> None:
    path, tree = base
    t = {"params": tree["params"], "clean": tree["clean"] * np.float32(1 + 1e-6), "step": tree["step"]}
    b = _save(tmp_path / "tol", t)
    assert "clean" in diff(path, b).changed
    assert diff(path, b, rtol=1e-5).equal
    assert diff(path, b, atol=1e-4).equal
    assert "clean" in diff(path, b, rtol=1e-8).changed


def test_across_layouts(base: tuple[Path, Any], tmp_path: Path) -> None:
    """Zarr v3, no compression, other chunks: no byte comparison possible, values equal."""
    path, tree = base
    z3 = _save(tmp_path / "z3", tree, use_zarr3=True, use_compression=False)
    big = tmp_path / "big"
    checkpoint.save(big, tree)
    for other in (z3, big):
        res = diff(path, other)
        assert res.equal, res.changed
    b = _save(tmp_path / "b3", _edited(tree), use_zarr3=True)
    res = diff(path, b)
    assert res.changed["clean"]["n_diff"] == 2 and res.changed["clean"]["chunks_same_bytes"] == 0


def test_steps_of_a_manager_root_and_the_cli(cli: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    with CheckpointManager(tmp_path / "root", async_save=False) as m:
        m.save(1, {"default": {"w": w, "b": np.zeros(3, np.float32)}}, force=True)
        w2 = w.copy()
        w2[0, 0] = 5.0
        m.save(2, {"default": {"w": w2, "b": np.zeros(3, np.float32)}}, force=True)
    root = tmp_path / "root"
    res = diff(root, root, step_a=1, step_b=2)
    assert list(res.changed) == ["w"] and res.unchanged == ["b"]
    r = cli("diff", root, "--step-a", "1", "--step-b", "2")
    assert r.status == 1 and r.out.startswith("~ w: 1 of 4096 values differ")
    assert "1 changed, 0 added, 0 removed, 1 unchanged" in r.out
    r = cli("diff", "--json", root, root, "--step-a", "1", "--step-b", "1")
    assert r.status == 0
    assert json.loads(r.out) == {"changed": {}, "added": [], "removed": [], "unchanged": ["b", "w"]}
    r = cli("diff", "--json", root, "--step-a", "2", "--step-b", "1")
    doc = json.loads(r.out)
    assert r.status == 1 and set(doc) == {"changed", "added", "removed", "unchanged"}
    assert doc["changed"]["w"]["max_abs_diff"] == pytest.approx(abs(5.0 - w[0, 0]))
    for bad in (("diff", root), ("diff", root, "--step-a", "1"), ("diff", root, root, "--atol", "-1"),
                ("diff", root, root, "--rtol", "nan")):
        r = cli(*bad)
        assert r.status == 2, bad
        assert "Traceback" not in r.err
    assert cli("diff", root, tmp_path / "missing").status == 1
    assert cli("diff", root, "--step-a", "1", "--step-b", "9").status == 1


def test_du(base: tuple[Path, Any], cli: Any) -> None:
    path, tree = base
    u = du(path)
    arrays = flatten(tree)
    assert sorted(u.tensors) == sorted(arrays)
    md = {x.name: x for x in _leaves(checkpoint.metadata(path, stored_sizes=True))}
    for name, a in arrays.items():
        assert u.tensors[name].logical_bytes == a.nbytes
        assert u.tensors[name].stored_bytes == md[name].stored_bytes > 0
    assert u.data_files and all(k.split("/")[-2] == "d" for k in u.data_files)
    # every stored chunk lives in a data file, and B+tree nodes and metadata there too
    assert sum(u.data_files.values()) >= u.total.stored_bytes  # type: ignore[operator]
    sub = subtree_usage(u, 1)
    assert set(sub) == {"params", "clean", "step"}
    assert sub["params"].logical_bytes == sum(a.nbytes for n, a in arrays.items() if n.startswith("params."))
    r = cli("du", "--json", path)
    doc = json.loads(r.out)
    assert r.status == 0 and set(doc) == set(arrays)
    assert doc["clean"]["logical_bytes"] == 256 * 100 * 4 and doc["clean"]["stored_bytes"] > 0
    r = cli("du", "--depth", "1", path)
    assert r.status == 0 and r.out.splitlines()[0].split() == ["NAME", "LOGICAL", "STORED", "RATIO", "ARRAYS"]
    assert "data files:" in r.out
    assert cli("du", "--depth", "0", path).status == 2


def _leaves(tree: Any) -> list[Any]:
    from ocdbt_py.checkpoint import LeafMetadata

    if isinstance(tree, LeafMetadata):
        return [tree]
    vals = tree.values() if isinstance(tree, dict) else tree
    return [x for v in vals for x in _leaves(v)]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, (4 << 20) + 3])
def test_same_bytes(n: int) -> None:
    from ocdbt_py.inspect.source import same_bytes

    a = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8).tobytes()
    assert same_bytes(a, bytearray(a)) and same_bytes(memoryview(a), a)
    assert not same_bytes(a, a + b"x") and not same_bytes(a, None)
    for pos in {0, n // 2, n - 1} if n else set():
        b = bytearray(a)
        b[pos] ^= 1
        assert not same_bytes(a, b)


def test_per_process_layout(base: tuple[Path, Any], tmp_path: Path) -> None:
    """Per-process databases without a merged root manifest (read as a union)."""
    import shutil

    from ocdbt_py.inspect import stats
    from ocdbt_py.inspect.source import open_checkpoint

    path, tree = base
    pp = tmp_path / "pp"
    shutil.copytree(path, pp)
    (pp / "manifest.ocdbt").unlink()
    with open_checkpoint(pp) as ck:
        assert ck.items[0][1].layout == "ocdbt-per-process"
    assert diff(path, pp).equal
    s = stats(pp)
    assert s["params.float32"].nan == 3 and s["clean"].size == tree["clean"].size
    u = du(pp)
    assert all(x.stored_bytes for x in u.tensors.values()) and u.data_files
