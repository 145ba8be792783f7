"""``CompositeCheckpointHandler`` used directly, with Orbax's handler protocol: a save writes
each item into its temporary directory, ``finalize`` makes them final, and a restore without
arguments needs to know each item's handler."""

from __future__ import annotations

import numpy as np
import pytest

import ocdbt_py.orbax as ocp


def _args() -> ocp.args.Composite:
    return ocp.args.Composite(state=ocp.args.StandardSave({"a": np.arange(3), "b": 2}),
                              meta=ocp.args.JsonSave({"lang": "en"}))


def test_save_is_temporary_until_finalize(tmp_path) -> None:
    h = ocp.CompositeCheckpointHandler()
    h.save(tmp_path, _args())
    assert not (tmp_path / "state").exists() and (tmp_path / "state.orbax-checkpoint-tmp").is_dir()
    assert not (tmp_path / "_CHECKPOINT_METADATA").exists()  # the checkpointer's to write, as Orbax
    assert h.metadata_from_temporary_paths(tmp_path).item_handlers == {
        "state": ocp.StandardCheckpointHandler.typestr(), "meta": ocp.JsonCheckpointHandler.typestr()}
    with pytest.raises(ValueError, match="temporary item"):
        h.metadata(tmp_path)
    h.finalize(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta", "state"]
    assert h.metadata_from_temporary_paths(tmp_path).item_handlers == {}
    meta = h.metadata(tmp_path)
    assert meta.init_timestamp_nsecs is None and meta.item_metadata.meta is None
    assert meta.item_metadata.state["a"].shape == (3,)
    got = h.restore(tmp_path)
    assert got.meta == {"lang": "en"} and got.state["b"] == 2


def test_restore_without_args_needs_known_handlers(tmp_path) -> None:
    h = ocp.CompositeCheckpointHandler("state", "meta")
    h.save(tmp_path, _args())
    h.finalize(tmp_path)
    with pytest.raises(ValueError, match="undetermined `CheckpointHandler`"):
        ocp.CompositeCheckpointHandler("state", "meta").restore(tmp_path)
    with pytest.raises(ValueError, match="could not be restored"):  # nothing recorded the item handlers
        ocp.CompositeCheckpointHandler().restore(tmp_path)
    # through a Checkpointer the step records them, so any composite handler restores it
    ocp.Checkpointer(ocp.CompositeCheckpointHandler()).save(tmp_path / "c", args=_args())
    got = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(tmp_path / "c")
    assert got.meta == {"lang": "en"} and got.state["a"].tolist() == [0, 1, 2]


def test_finalize_reports_item_durations(tmp_path) -> None:
    jax = pytest.importorskip("jax")
    seen: list[str] = []

    def listener(event: str, duration: float, **kw: object) -> None:
        seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        h = ocp.CompositeCheckpointHandler(state=ocp.StandardCheckpointHandler())
        h.save(tmp_path, ocp.args.Composite(state=ocp.args.StandardSave({"a": 1})))
        h.finalize(tmp_path)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert seen.count("/jax/orbax/write/background_item_finalize_secs") == 1
