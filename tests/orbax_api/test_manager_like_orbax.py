"""``CheckpointManager`` behaviours a program observes, run the same way on ``orbax.checkpoint``
(the oracle, when installed) and on ``ocdbt_py.orbax``: each test asserts what Orbax 0.12.8 does."""

from __future__ import annotations

import datetime
import json
from typing import Any
from unittest import mock

import numpy as np
import pytest

import ocdbt_py.orbax


def _orbax() -> Any:
    return pytest.importorskip("orbax.checkpoint")


@pytest.fixture(params=["ocdbt_py", pytest.param("orbax", marks=pytest.mark.orbax)])
def ocp(request: pytest.FixtureRequest) -> Any:
    return ocdbt_py.orbax if request.param == "ocdbt_py" else _orbax()


TREE = {"a": np.arange(4), "b": np.arange(3.0), "c": {"a": np.arange(2), "e": np.arange(5)}}


def test_legacy_root_metadata_file_is_read(ocp: Any, tmp_path) -> None:
    """An older manager's ``metadata/metadata`` (a bare JSON object) is the custom metadata."""
    (tmp_path / "metadata").mkdir()
    (tmp_path / "metadata" / "metadata").write_text(json.dumps({"blah": "hello"}))
    with ocp.CheckpointManager(tmp_path) as m:
        assert m.metadata().custom_metadata == {"blah": "hello"}


def test_read_only_manager_keeps_given_metadata_in_memory(ocp: Any, tmp_path) -> None:
    opts = ocp.CheckpointManagerOptions(read_only=True)
    with ocp.CheckpointManager(tmp_path, options=opts, metadata={"state": 123}) as m:
        assert m.metadata().custom_metadata == {"state": 123}
    with ocp.CheckpointManager(tmp_path) as m:
        assert m.metadata().custom_metadata == {}


def test_item_metadata_needs_a_known_handler(ocp: Any, tmp_path) -> None:
    """A fresh manager without handlers knows no item's handler until a restore meets it."""
    with ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)) as m:
        m.save(0, args=ocp.args.StandardSave(TREE))
        assert m.metadata(0).item_metadata is not None
    with ocp.CheckpointManager(tmp_path) as m:
        assert m.metadata(0).item_metadata is None
        m.restore(0)
        assert m.metadata(0).item_metadata is not None


def test_keep_time_interval_reads_datetime_now(ocp: Any, tmp_path) -> None:
    """Save times come from ``datetime.datetime.now``: a program that fixes "now" steers
    ``keep_time_interval`` (one step kept per 3 hours, plus the 2 newest)."""
    now = datetime.datetime.now(tz=datetime.timezone.utc)
    with mock.patch("datetime.datetime", autospec=True) as dt:
        opts = ocp.CheckpointManagerOptions(max_to_keep=2, keep_time_interval=datetime.timedelta(hours=3),
                                            enable_async_checkpointing=False)
        with ocp.CheckpointManager(tmp_path, options=opts) as m:
            for step in range(10):
                dt.now.return_value = now + datetime.timedelta(hours=step)
                assert m.save(step, args=ocp.args.StandardSave({"x": np.zeros(1)}))
            assert m.all_steps() == [0, 3, 6, 8, 9]


def test_continuous_checkpointing_telemetry(ocp: Any, tmp_path) -> None:
    jax = pytest.importorskip("jax")
    policy = ocp.checkpoint_managers.ContinuousCheckpointingPolicy()
    for opts, flag in ((ocp.CheckpointManagerOptions(save_decision_policy=policy), 1),
                       (ocp.CheckpointManagerOptions(), 0)):
        with mock.patch.object(jax.monitoring, "record_scalar") as rec, \
                ocp.CheckpointManager(tmp_path / str(flag), options=opts):
            rec.assert_any_call("/jax/orbax/checkpoint_manager/continuous_checkpointing_enabled", flag)


def test_preemption_sync_point_forces_a_save(ocp: Any, tmp_path) -> None:
    pytest.importorskip("jax")
    from jax.experimental import multihost_utils

    client = mock.patch("jax._src.distributed.global_state.client", object())
    with client, mock.patch.object(multihost_utils, "reached_preemption_sync_point", side_effect=lambda s: s == 2):
        opts = ocp.CheckpointManagerOptions(save_interval_steps=4, enable_async_checkpointing=False)
        with ocp.CheckpointManager(tmp_path, options=opts) as m:
            for step in range(6):
                m.save(step, args=ocp.args.StandardSave({"x": np.zeros(1)}))
            assert m.all_steps() == [0, 2, 4]


@pytest.mark.parametrize("case", ["missing", "subtree"])
def test_tree_mismatch_error_text(ocp: Any, tmp_path, case: str) -> None:
    with ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)) as m:
        m.save(0, args=ocp.args.PyTreeSave(TREE))
        item: dict[str, Any] = {"a": 0, "b": ocp.PLACEHOLDER, "c": {"e": ocp.PLACEHOLDER}}
        if case == "subtree":
            item = {"a": 0, "b": 0, "c": ocp.PLACEHOLDER}
        rargs = {"a": ocp.RestoreArgs(), "b": ocp.RestoreArgs(),
                 "c": {"a": ocp.RestoreArgs(), "e": ocp.RestoreArgs()}}
        with pytest.raises(ValueError, match="User-provided restore item and on-disk value"):
            m.restore(0, args=ocp.args.PyTreeRestore(item, restore_args=rargs))


def test_target_empty_containers_kept(ocp: Any, tmp_path) -> None:
    """An empty node of the target (optax's ``EmptyState()``) comes back as itself."""
    optax = pytest.importorskip("optax")
    jax = pytest.importorskip("jax")
    state = {"opt": optax.adamw(1e-3).init({"w": np.ones(4, np.float32)}), "x": np.ones(3)}
    with ocp.CheckpointManager(tmp_path, item_names=("state",),
                               options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)) as m:
        m.save(0, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)))
        got = m.restore(0, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(state))).state
    assert jax.tree.structure(got) == jax.tree.structure(state)
    assert type(got["opt"][1]) is type(state["opt"][1])


def test_array_items_both_ways(ocp: Any, tmp_path) -> None:
    """``ArraySave``/``ArrayRestore`` items; the other library restores them too."""
    opts = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with ocp.CheckpointManager(tmp_path, item_names=("arr", "s"), options=opts) as m:
        m.save(0, args=ocp.args.Composite(arr=ocp.args.ArraySave(np.arange(16)), s=ocp.args.ArraySave(3.5)))
        got = m.restore(0, args=ocp.args.Composite(arr=ocp.args.ArrayRestore(), s=ocp.args.ArrayRestore()))
        assert m.item_metadata(0).arr is None  # the array handler keeps no metadata of its own
    np.testing.assert_array_equal(got.arr, np.arange(16))
    assert got.s == 3.5
    other = _orbax() if ocp is ocdbt_py.orbax else ocdbt_py.orbax
    with other.CheckpointManager(tmp_path, item_names=("arr", "s")) as m:
        again = m.restore(0, args=other.args.Composite(
            arr=other.args.ArrayRestore(restore_args=other.RestoreArgs(dtype=np.float32)), s=other.args.ArrayRestore()))
    assert again.arr.dtype == np.float32 and again.arr.tolist() == list(range(16)) and again.s == 3.5


def test_step_statistics_logged(ocp: Any, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """Without a ``logger`` the manager logs each save's and restore's statistics at INFO."""
    import ast
    import logging

    with caplog.at_level(logging.INFO), ocp.CheckpointManager(
            tmp_path, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)) as m:
        m.save(0, args=ocp.args.StandardSave({"x": np.zeros(2)}))
        save_line = caplog.records[-1].getMessage()
        m.restore(0)
        restore_line = caplog.records[-1].getMessage()
    saved = ast.literal_eval(save_line[save_line.find("{"):])
    assert saved["step"] == 0 and saved["event_type"] == "save" and saved["synchronous"] is True
    for key in ("wait_for_prev_start_time", "wait_for_prev_duration_secs", "checkpointer_blocking_start_time",
                "checkpointer_blocking_duration_secs", "get_old_steps_start_time", "get_old_steps_duration_secs",
                "checkpoint_manager_blocking_start_time", "checkpoint_manager_blocking_duration_secs"):
        assert saved[key] is not None, key
    restored = ast.literal_eval(restore_line[restore_line.find("{"):])
    assert restored["event_type"] == "restore" and restored["directory"] == str(tmp_path)
    for key in ("checkpointer_start_time", "checkpointer_duration_secs", "checkpoint_manager_start_time",
                "checkpoint_manager_duration_secs"):
        assert restored[key] is not None, key


def test_step_left_unfinalized_when_finalize_does_not_run(ocp: Any, tmp_path) -> None:
    """A local step becomes visible through ``AtomicRenameTemporaryPath.finalize``: without it
    (a preemption) the step stays a temporary directory whose commit time is unset."""
    opts = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with mock.patch.object(ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize"), \
            ocp.CheckpointManager(tmp_path, options=opts) as m:
        m.save(0, args=ocp.args.StandardSave({"x": np.zeros(2)}))
        assert m.all_steps() == [0]  # what it tracked; a reload finds nothing
        m.reload()
        assert m.all_steps() == []
    names = [p.name for p in tmp_path.iterdir() if p.name.startswith("0")]
    assert len(names) == 1 and names[0].startswith("0.orbax-checkpoint-tmp")
    doc = json.loads((tmp_path / names[0] / "_CHECKPOINT_METADATA").read_text())
    assert doc["init_timestamp_nsecs"] > 0 and doc.get("commit_timestamp_nsecs") is None
    with ocp.CheckpointManager(tmp_path, options=opts) as m:  # finalize runs: committed, stamped
        m.save(0, args=ocp.args.StandardSave({"x": np.zeros(2)}))
    step = ocp.path.step.standard_name_format().find_step(tmp_path, 0)
    assert step.commit_timestamp_nsecs > 0
    assert (tmp_path / "0" / "commit_success.txt").exists()
