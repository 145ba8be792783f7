"""Checkpoints written by Orbax's v1 API (``orbax.checkpoint.experimental.v1``, 0.12.8):
``save_pytree``, ``save_checkpointables`` with a JSON item (``JsonHandler``:
``<item>/data.json``), a composite of pytrees and JSON, and a manager-style root of
such steps.  ``restore``, ``metadata``, ``ocdbt tree`` and ``export`` must give what v1's own
``load_*`` gives."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.cli import main

ocp = pytest.importorskip("orbax.checkpoint.experimental.v1")
jnp = pytest.importorskip("jax.numpy")

TREE: dict[str, Any] = {
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": {"c": np.linspace(0, 1, 5).astype(np.float64), "d": 3, "s": "text"},
    "layers": [np.ones((2, 2), np.int32), np.full((3,), 7, np.int16)],
}
JSON_ITEM = {"step": 7, "name": "run-α", "lr": [0.1, 0.2], "nested": {"ok": True, "none": None}}


def _json_ctx() -> Any:
    registry = ocp.handlers.local_registry()
    registry.add(ocp.handlers.JsonHandler, checkpointable_name="config")
    ctx = ocp.Context()
    ctx.checkpointables.registry = registry
    return ctx


@pytest.fixture(scope="module")
def v1_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("v1")
    ocp.save_pytree(root / "pytree", TREE, custom_metadata={"note": "hi"})
    with _json_ctx():
        ocp.save_checkpointables(root / "ckpts" / "7", {"params": TREE, "config": JSON_ITEM})
        ocp.save_checkpointables(
            root / "ckpts" / "9",
            {"params": TREE, "opt": {"mu": jnp.zeros((3,), jnp.bfloat16)}, "config": JSON_ITEM},
        )
    return root


def _same(ours: Any, theirs: Any) -> None:
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and sorted(ours) == sorted(theirs), (ours, theirs)
        for k in theirs:
            _same(ours[k], theirs[k])
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for x, y in zip(ours, theirs):
            _same(x, y)
    elif hasattr(theirs, "shape") and hasattr(theirs, "dtype"):
        want = np.asarray(theirs)
        got = np.asarray(ours)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
    else:
        assert ours == theirs and type(ours) is type(theirs), (ours, theirs)


def test_pytree_restores_like_load_pytree(v1_root: Path) -> None:
    _same(checkpoint.restore(v1_root / "pytree"), ocp.load_pytree(v1_root / "pytree"))


@pytest.mark.parametrize("step", ["7", "9"])
def test_checkpointables_restore_like_load_checkpointables(v1_root: Path, step: str) -> None:
    path = v1_root / "ckpts" / step
    with _json_ctx():
        theirs = dict(ocp.load_checkpointables(path))
    ours = checkpoint.restore(path)
    assert ours["config"] == JSON_ITEM  # the document itself, not {"data.json": {...}}
    _same(ours, theirs)


def test_root_of_v1_steps_restores_latest(v1_root: Path) -> None:
    assert [c.step for c in checkpoint.list_steps(v1_root / "ckpts")] == [7, 9]
    latest = checkpoint.restore(v1_root / "ckpts")
    assert sorted(latest) == ["config", "opt", "params"]
    _same(checkpoint.restore(v1_root / "ckpts", step=7)["params"], checkpoint.restore(v1_root / "pytree"))


def test_metadata_of_v1_items(v1_root: Path) -> None:
    md = checkpoint.metadata(v1_root / "ckpts" / "9")
    assert md["config"] == JSON_ITEM
    assert isinstance(md["params"]["a"], checkpoint.LeafMetadata)
    assert md["params"]["a"].shape == (2, 3) and str(md["params"]["a"].dtype) == "float32"
    assert str(md["opt"]["mu"].dtype) == "bfloat16"
    top = checkpoint.metadata(v1_root / "pytree")
    assert sorted(top) == ["a", "b", "layers"]


def _run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    capsys.readouterr()
    status = main([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
    return status, capsys.readouterr().out


def test_cli_tree_shows_v1_json_item(v1_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _run(capsys, "tree", "--json", v1_root / "ckpts" / "7")
    assert status == 0
    doc = json.loads(out)
    text = json.dumps(doc)
    assert "data.json" not in text and '"run-\\u03b1"' in text or "run-α" in text
    status, out = _run(capsys, "tree", v1_root / "ckpts")
    assert status == 0 and "config" in out and "params" in out and "data.json" not in out


def test_export_v1_checkpoint_matches_v1_load(v1_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.npz"
    names = checkpoint.export_npz(v1_root / "ckpts" / "9", out)
    with _json_ctx():
        theirs = dict(ocp.load_checkpointables(v1_root / "ckpts" / "9"))
    with np.load(out, allow_pickle=False) as z:
        assert sorted(z.files) == sorted(names)
        np.testing.assert_array_equal(z["params.a"], np.asarray(theirs["params"]["a"]))
        np.testing.assert_array_equal(z["params.layers.1"], np.asarray(theirs["params"]["layers"][1]))
        assert "config" not in " ".join(z.files)  # JSON items carry no tensors


def test_training_checkpointer_root(tmp_path: Path) -> None:
    """``ocp.training.Checkpointer``: step dirs with ``state`` + ``metrics`` (MetricsHandler)."""
    root = tmp_path / "train"
    with ocp.training.Checkpointer(root) as ck:
        ck.save_pytree(1, TREE, metrics={"loss": 0.5})
        ck.save_checkpointables(2, {"params": TREE, "extra": {"x": np.ones(2)}})
    with ocp.training.Checkpointer(root) as ck:
        pytree1 = ck.load_pytree(1)
        both2 = dict(ck.load_checkpointables(2))
    step1 = checkpoint.restore(root, step=1)
    _same(step1["state"], pytree1)
    assert step1["metrics"] == {"loss": 0.5}  # v1 loads metrics separately; we return the item
    _same(checkpoint.restore(root), both2)
    assert checkpoint.metadata(root, step=1)["metrics"] == {"loss": 0.5}


def test_cli_export_v1_step(v1_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.npz"
    status, _ = _run(capsys, "export", v1_root / "ckpts" / "7", out)
    assert status == 0
    with np.load(out, allow_pickle=False) as z:
        np.testing.assert_array_equal(z["params.a"], TREE["a"])
        np.testing.assert_array_equal(z["params.b.c"], TREE["b"]["c"])


class _ConfigJson(ocp.handlers.JsonHandler):  # type: ignore[misc, name-defined]
    """A JsonHandler that writes ``config.json`` instead of ``data.json``."""

    def __init__(self) -> None:
        super().__init__(filename="config.json")


def test_json_item_with_custom_filename(tmp_path: Path) -> None:
    """A v1 ``JsonHandler(filename=...)`` item: the document itself, as Orbax loads it with
    the same handler (not ``{"config.json": {...}}``)."""
    registry = ocp.handlers.local_registry()
    registry.add(_ConfigJson, checkpointable_name="config")
    ctx = ocp.Context()
    ctx.checkpointables.registry = registry
    path = tmp_path / "ck"
    with ctx:
        ocp.save_checkpointables(path, {"params": TREE, "config": JSON_ITEM})
        theirs = dict(ocp.load_checkpointables(path))
    assert sorted(os.listdir(path / "config")) == ["config.json"]
    ours = checkpoint.restore(path)
    assert ours["config"] == JSON_ITEM == theirs["config"]
    _same(ours, theirs)
    assert checkpoint.metadata(path)["config"] == JSON_ITEM
    assert checkpoint.restore(path / "config") == JSON_ITEM  # the item directory on its own


def test_v0_json_handler_with_custom_filename(tmp_path: Path) -> None:
    """Orbax v0's ``JsonCheckpointHandler(filename="cfg.json")`` under a CheckpointManager."""
    v0 = pytest.importorskip("orbax.checkpoint")
    with v0.CheckpointManager(tmp_path / "run", item_names=("cfg", "state"), item_handlers={
            "cfg": v0.JsonCheckpointHandler(filename="cfg.json"),
            "state": v0.StandardCheckpointHandler()}) as mgr:
        mgr.save(3, args=v0.args.Composite(cfg=v0.args.JsonSave(JSON_ITEM),
                                           state=v0.args.StandardSave({"w": np.arange(4.0)})))
        mgr.wait_until_finished()
        theirs = mgr.restore(3, args=v0.args.Composite(cfg=v0.args.JsonRestore(), state=v0.args.StandardRestore()))
    assert "cfg.json" in os.listdir(tmp_path / "run" / "3" / "cfg")
    ours = checkpoint.restore(tmp_path / "run")
    assert ours["cfg"] == dict(theirs["cfg"]) == JSON_ITEM
    np.testing.assert_array_equal(ours["state"]["w"], np.arange(4.0))


def test_single_process_metadata_file_stays_a_directory_item(tmp_path: Path) -> None:
    """``process_metadata`` holding one of its files is still a directory of documents."""
    ocp.save_pytree(tmp_path / "ck", TREE)
    (tmp_path / "ck" / "process_metadata").mkdir()
    (tmp_path / "ck" / "process_metadata" / "mesh_metadata.json").write_text("[0, 1]")
    got = checkpoint.restore(tmp_path / "ck")
    assert got["process_metadata"] == {"mesh_metadata.json": [0, 1]}
