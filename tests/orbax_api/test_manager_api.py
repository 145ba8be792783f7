"""``ocdbt_py.orbax`` used as Orbax scripts use it (NumPy trees, local and memory:// roots)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import ocdbt_py.orbax as ocp
from ocdbt_py.checkpoint import metadata, restore
from ocdbt_py.errors import StorageError, UnsupportedError


def test_composite_results_indexable_and_default_item(tmp_path) -> None:
    mngr = ocp.CheckpointManager(tmp_path / "m", item_names=("state", "meta"))
    mngr.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave({"a": np.arange(4)}),
                                         meta=ocp.args.JsonSave({"k": 1})))
    mngr.wait_until_finished()
    r = mngr.restore(0)
    assert isinstance(r, ocp.args.Composite)
    assert r.meta == r["meta"] == {"k": 1}
    np.testing.assert_array_equal(r.state["a"], np.arange(4))
    only = mngr.restore(0, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    assert list(only) == ["meta"]
    mngr.close()
    single = ocp.CheckpointManager(tmp_path / "d")
    single.save(1, args=ocp.args.StandardSave({"x": np.ones(2)}))
    single.wait_until_finished()
    np.testing.assert_array_equal(single.restore(1)["x"], np.ones(2))
    with pytest.raises(ValueError):
        single.save(2, args=ocp.args.Composite(x=ocp.args.StandardSave({"x": 1})))
    assert (tmp_path / "d" / "1" / "default").is_dir()
    single.close()


def test_same_files_as_native_layout(tmp_path) -> None:
    mngr = ocp.CheckpointManager(tmp_path / "m", options=ocp.CheckpointManagerOptions(
        step_prefix="ckpt", step_format_fixed_length=4, best_fn=lambda m: m["acc"]), item_names=("p",))
    mngr.save(3, args=ocp.args.Composite(p=ocp.args.PyTreeSave({"s": "text", "v": np.arange(3.0)})),
              metrics={"acc": 0.5})
    mngr.wait_until_finished()
    step = tmp_path / "m" / "ckpt_0003"
    assert json.loads((step / "metrics" / "metrics").read_text()) == {"acc": 0.5}
    handlers = json.loads((step / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    assert handlers["p"].endswith("PyTreeCheckpointHandler")
    assert restore(step, item="p")["s"] == "text"
    assert mngr.metrics(3) == {"acc": 0.5}
    assert mngr.item_metadata(3).p["v"].shape == (3,)
    mngr.close()


def test_step_already_exists_force_and_delete(tmp_path) -> None:
    mngr = ocp.CheckpointManager(tmp_path / "m", options=ocp.CheckpointManagerOptions(
        save_interval_steps=10, enable_async_checkpointing=False))
    assert mngr.save(0, args=ocp.args.StandardSave({"x": np.zeros(1)}))
    assert not mngr.save(5, args=ocp.args.StandardSave({"x": np.zeros(1)}))
    assert mngr.save(5, args=ocp.args.StandardSave({"x": np.zeros(1)}), force=True)
    assert not mngr.save(5, args=ocp.args.StandardSave({"x": np.zeros(1)}))  # not newer than the latest
    with pytest.raises(ocp.manager.StepAlreadyExistsError):
        mngr.save(5, args=ocp.args.StandardSave({"x": np.zeros(1)}), force=True)
    mngr.delete(0)
    assert mngr.all_steps() == [5] and not (tmp_path / "m" / "0").exists()
    with pytest.raises(FileNotFoundError):
        mngr.delete(0)
    mngr.close()


def test_todelete_subdir_keeps_deleted_steps(tmp_path) -> None:
    mngr = ocp.CheckpointManager(tmp_path / "m", options=ocp.CheckpointManagerOptions(
        max_to_keep=1, todelete_subdir="trash", enable_async_checkpointing=False))
    for s in range(2):
        mngr.save(s, args=ocp.args.StandardSave({"x": np.full(2, s)}))
    assert mngr.all_steps() == [1]
    np.testing.assert_array_equal(restore(tmp_path / "m" / "trash" / "0" / "default")["x"], [0, 0])
    mngr.close()
    url = "memory://i16-orbax/trash-run"  # no rename on object stores: copied, then deleted
    mngr = ocp.CheckpointManager(url, options=ocp.CheckpointManagerOptions(max_to_keep=1, todelete_subdir="trash"))
    for s in range(3):
        mngr.save(s, args=ocp.args.StandardSave({"x": np.full(2, s)}))
    mngr.wait_until_finished()
    assert mngr.all_steps() == [2] and ocp.CheckpointManager(url).all_steps() == [2]
    np.testing.assert_array_equal(restore(f"{url}/trash/1/default")["x"], [1, 1])
    mngr.close()
    with pytest.raises(UnsupportedError):
        ocp.CheckpointManagerOptions(todelete_full_path="trash")


def test_fsspec_root_and_reload(tmp_path) -> None:
    url = "memory://i16-orbax/run"
    mngr = ocp.CheckpointManager(url, options=ocp.CheckpointManagerOptions(max_to_keep=2))
    for s in range(4):
        mngr.save(s, args=ocp.args.StandardSave({"w": np.full(3, s, "float32")}))
    mngr.wait_until_finished()
    assert mngr.all_steps() == [2, 3]
    other = ocp.CheckpointManager(url)
    assert other.all_steps() == [2, 3]
    np.testing.assert_array_equal(other.restore(None)["w"], np.full(3, 3, "float32"))
    mngr.close()
    other.close()


def test_checkpointers_and_per_leaf_save_args(tmp_path) -> None:
    ck = ocp.PyTreeCheckpointer()
    tree = {"a": np.ones((64, 64), "float32"), "b": np.ones((64, 64), "float32")}
    ck.save(tmp_path / "c", args=ocp.args.PyTreeSave(tree, save_args={"a": ocp.SaveArgs(chunk_byte_size=1024),
                                                                       "b": ocp.SaveArgs(dtype=np.float16)}))
    m = metadata(tmp_path / "c")
    assert m["a"].chunks != (64, 64) and int(np.prod(m["a"].chunks)) * 4 <= 1024
    assert m["b"].chunks == (64, 64) and m["b"].dtype == np.float16
    restored = ck.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
        restore_args={"a": ocp.RestoreArgs(restore_type=np.ndarray, dtype=np.float64), "b": ocp.RestoreArgs()}))
    assert restored["a"].dtype == np.float64 and restored["b"].dtype == np.float16
    with pytest.raises(ValueError, match="already exists"):  # Orbax raises ValueError
        ck.save(tmp_path / "c", args=ocp.args.PyTreeSave(tree))
    async_ck = ocp.StandardCheckpointer()
    with pytest.raises(ValueError, match="already exists"):  # checked before the background part
        async_ck.save(tmp_path / "c", tree)
    ck.save(tmp_path / "c", tree, force=True)  # legacy positional item
    assert ck.metadata(tmp_path / "c").item_metadata["a"].shape == (64, 64)
    with pytest.raises(UnsupportedError):
        ocp.SaveArgs(aggregate=True)


def test_todelete_subdir_link_is_not_followed(tmp_path) -> None:
    """A ``todelete_subdir`` that is a link to elsewhere: the step is not moved out of the
    root (our error; the step stays where it was)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "m"
    mngr = ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(
        todelete_subdir="trash", enable_async_checkpointing=False))
    mngr.save(0, args=ocp.args.StandardSave({"x": np.zeros(2)}))
    (root / "trash").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StorageError, match="symbolic link"):
        mngr.delete(0)
    assert os.listdir(outside) == []
    np.testing.assert_array_equal(restore(root / "0" / "default")["x"], [0, 0])
    (root / "trash").unlink()
    mngr.delete(0)  # a real directory: moved there
    assert (root / "trash" / "0").is_dir() and not (root / "0").exists()
    mngr.close()
