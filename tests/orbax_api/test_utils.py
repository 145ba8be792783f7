"""``ocp.utils``, ``ocp.tree`` and ``ocp.checkpoint_utils`` helpers on NumPy trees."""

from __future__ import annotations

import threading
import time

import numpy as np

import ocdbt_py.orbax as ocp


def _save_steps(root, steps) -> None:
    mngr = ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(step_prefix="ckpt"))
    for s in steps:
        mngr.save(s, args=ocp.args.StandardSave({"x": np.full(2, s)}))
    mngr.close()


def test_step_helpers(tmp_path) -> None:
    _save_steps(tmp_path / "r", [1, 5])
    assert ocp.utils.checkpoint_steps(tmp_path / "r") == [1, 5]
    assert [p.name for p in ocp.utils.checkpoint_steps_paths(tmp_path / "r")] == ["ckpt_1", "ckpt_5"]
    assert ocp.utils.any_checkpoint_step(tmp_path / "r") in (1, 5)
    assert ocp.utils.step_from_checkpoint_name("ckpt_0042") == 42
    assert ocp.utils.is_checkpoint_finalized(tmp_path / "r" / "ckpt_5")
    assert ocp.utils.is_tmp_checkpoint("/x/5.orbax-checkpoint-tmp-123")
    assert ocp.utils.is_primary_host(0) and not ocp.utils.reached_preemption(5)


def test_checkpoints_iterator_sees_new_steps(tmp_path) -> None:
    root = tmp_path / "r"
    _save_steps(root, [0])

    def later() -> None:
        time.sleep(0.5)
        _save_steps(root, [3])

    t = threading.Thread(target=later)
    t.start()
    seen = []
    # the steps are named ckpt_<n>: as in Orbax, the iterator needs their format to snapshot them
    for step in ocp.checkpoint_utils.checkpoints_iterator(root, seconds_to_sleep=0.1, timeout=2, step_prefix="ckpt"):
        assert (root / "_SNAPSHOTS" / f"ckpt_{step}" / "_CHECKPOINT_METADATA").is_file()  # held while in use
        seen.append(step)
    t.join()
    assert seen == [0, 3]
    assert not any((root / "_SNAPSHOTS").iterdir())  # released
    with ocp.checkpoint_utils.wait_for_new_checkpoint(root, until_step=3, seconds_to_sleep=0.1, timeout=2,
                                                      step_prefix="ckpt") as step:
        assert step == 3
        snap = ocp.checkpoint_utils.get_snapshot_dir_from_step_dir(root / "ckpt_3")
        assert snap == root / "_SNAPSHOTS" / "ckpt_3" and snap.is_dir()
        # the snapshot restores as the step does, also once the step itself is gone
        assert ocp.StandardCheckpointer().restore(snap / "default")["x"].tolist() == [3, 3]
    assert not snap.exists()
    with ocp.checkpoint_utils.wait_for_new_checkpoint(root, until_step=9, seconds_to_sleep=0.1, timeout=0.3) as step:
        assert step == -1
    with ocp.checkpoint_utils.wait_for_new_checkpoint(tmp_path / "missing", seconds_to_sleep=0.1, timeout=0.3) as step:
        assert step == -1  # a root that does not exist yet is waited for


def test_checkpoints_iterator_timeout_fn_as_orbax(tmp_path) -> None:
    """After the timeout, ``timeout_fn`` is asked each ``seconds_to_sleep`` until it says to
    stop, then once more by the iterator (Orbax's count: 5 calls for 'stop after 3')."""
    calls = [0]

    def timeout_fn() -> bool:
        calls[0] += 1
        return calls[0] > 3

    (tmp_path / "r").mkdir()
    assert list(ocp.checkpoint_utils.checkpoints_iterator(tmp_path / "r", timeout=0.2, seconds_to_sleep=0.1,
                                                          timeout_fn=timeout_fn)) == []
    assert calls[0] == 5


def test_tree_helpers() -> None:
    tree = {"a": {"b": np.ones(2), "c": 3}, "d": [np.zeros(1), None]}
    flat = ocp.tree.to_flat_dict(tree)
    assert set(flat) == {("a", "b"), ("a", "c"), ("d", "0")}
    assert ocp.tree.to_flat_dict(tree, sep="/").keys() >= {"a/b", "a/c"}
    back = ocp.tree.from_flat_dict(flat, target=tree)
    assert back["a"]["c"] == 3 and back["d"][1] is None
    assert ocp.tree.get_param_names(tree)["a"]["b"] == "a.b"
    args = ocp.checkpoint_utils.construct_restore_args({"w": np.ones(2, "float16"), "n": 1})
    assert args["w"].dtype == np.float16 and args["n"].restore_type is int
