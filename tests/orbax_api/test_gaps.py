"""Names and behaviours Orbax's own tests and real training code need (issue 33's gaps):
``ocp.step``/``ocp.path``, the ``utils`` helpers, a bare JSON handler, ``create=True``, and the
clear refusal of orbax-checkpoint's own objects."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

import ocdbt_py.errors as ocp_errors
import ocdbt_py.orbax as ocp
from ocdbt_py.orbax._foreign import ForeignOrbaxObjectError


def test_utils_helpers() -> None:
    assert ocp.utils.is_pathways_backend() is False
    assert ocp.utils.is_scalar(3) and ocp.utils.is_scalar(np.float32(1)) and not ocp.utils.is_scalar("3")
    assert str(ocp.utils.get_save_directory(7, "/r", name="state", step_prefix="ckpt",
                                            step_format_fixed_length=3)) == "/r/ckpt_007/state"


def test_standard_name_format_drives_the_manager(tmp_path) -> None:
    fmt = ocp.step.standard_name_format(step_prefix="ckpt", step_format_fixed_length=4)
    assert fmt == ocp.path.step.standard_name_format(step_prefix="ckpt", step_format_fixed_length=4)
    mngr = ocp.CheckpointManager(tmp_path / "r", options=ocp.CheckpointManagerOptions(step_name_format=fmt))
    mngr.save(3, args=ocp.args.StandardSave({"x": np.arange(3)}))
    mngr.close()
    assert (tmp_path / "r" / "ckpt_0003").is_dir()
    assert [(m.step, m.path.name) for m in fmt.find_all(tmp_path / "r")] == [(3, "ckpt_0003")]
    assert fmt.find_step(tmp_path / "r", 3).path == tmp_path / "r" / "ckpt_0003"
    with pytest.raises(ValueError):
        fmt.find_step(tmp_path / "r", 4)
    with pytest.raises(ValueError):  # as Orbax: the two broadcast settings must agree
        ocp.CheckpointManagerOptions(single_host_load_and_broadcast=True, step_name_format=fmt)
    assert ocp.path.atomicity.COMMIT_SUCCESS_FILE == "commit_success.txt"
    assert issubclass(ocp.path.atomicity.CommitFileTemporaryPath, ocp.path.atomicity.TemporaryPath)


def test_create_makes_the_root(tmp_path) -> None:
    root = tmp_path / "a" / "b"
    ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(create=True)).close()
    assert root.is_dir()
    # create=False leaves a missing root absent until the first save, as Orbax does
    other = tmp_path / "c"
    m = ocp.CheckpointManager(other, options=ocp.CheckpointManagerOptions(create=False))
    assert not other.exists()
    m.save(0, args=ocp.args.StandardSave({"w": np.ones(2)}))
    m.wait_until_finished()
    assert m.all_steps() == [0]
    m.close()


def test_bare_json_handler(tmp_path) -> None:
    h = ocp.JsonCheckpointHandler(filename="file")
    h.save(tmp_path, args=ocp.args.JsonSave({"a": 1, "b": [2.5, "x"]}))
    assert json.loads((tmp_path / "file").read_text()) == {"a": 1, "b": [2.5, "x"]}
    assert h.restore(tmp_path) == {"a": 1, "b": [2.5, "x"]}

    async def later() -> None:
        for f in await h.async_save(tmp_path / "d", args=ocp.args.JsonSave({"c": 3})):
            f.result()

    asyncio.run(later())
    assert h.restore(tmp_path / "d") == {"c": 3}
    with pytest.raises(FileNotFoundError):
        ocp.JsonCheckpointHandler().restore(tmp_path)
    ckptr = ocp.Checkpointer(ocp.JsonCheckpointHandler())
    ckptr.save(tmp_path / "ck", args=ocp.args.JsonSave({"lr": 0.1}))
    assert ckptr.restore(tmp_path / "ck") == {"lr": 0.1}


def test_orbax_objects_are_refused_by_name(tmp_path) -> None:
    orbax = pytest.importorskip("orbax.checkpoint")
    marker = r"\[orbax-internal: orbax\.checkpoint\..*StandardCheckpointHandler\]"
    with pytest.raises(ForeignOrbaxObjectError, match=marker):
        ocp.CheckpointManager(tmp_path, item_handlers=orbax.StandardCheckpointHandler())
    with pytest.raises(TypeError):  # still a TypeError for existing except clauses
        ocp.Checkpointer(orbax.PyTreeCheckpointHandler())


class _IterHandler(ocp.CheckpointHandler):
    """A custom handler in Orbax's style (MaxText's data-iterator handler is one)."""

    def save(self, directory, args):
        (directory / "it.json").write_text(json.dumps(args.state))

    def restore(self, directory, args=None):
        return json.loads((directory / "it.json").read_text())


@ocp.args.register_with_handler(_IterHandler, for_save=True)
class _IterSave(ocp.args.CheckpointArgs):
    def __init__(self, state):
        self.state = state


@ocp.args.register_with_handler(_IterHandler, for_restore=True)
class _IterRestore(ocp.args.CheckpointArgs):
    def __init__(self, state=None):
        self.state = state


def test_handler_registry_and_custom_handler_items(tmp_path) -> None:
    assert ocp.args.get_registered_handler_cls(_IterSave({})) is _IterHandler
    assert ocp.args.get_registered_args_cls(_IterHandler()) == (_IterSave, _IterRestore)
    assert ocp.args.get_registered_handler_cls(ocp.args.StandardSave) is ocp.StandardCheckpointHandler
    with pytest.raises(TypeError, match="must subclass"):
        ocp.args.register_with_handler(_IterHandler, for_save=True)(dict)
    mngr = ocp.CheckpointManager(tmp_path, item_names=("params", "it"))
    mngr.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave({"w": np.arange(3)}), it=_IterSave({"pos": 7})))
    mngr.close()
    assert json.loads((tmp_path / "1" / "it" / "it.json").read_text()) == {"pos": 7}
    handlers = {"params": ocp.StandardCheckpointHandler(), "it": _IterHandler()}
    mngr = ocp.CheckpointManager(tmp_path, item_handlers=handlers)
    got = mngr.restore(1)
    assert isinstance(got, ocp.args.Composite) and got.it == {"pos": 7}
    np.testing.assert_array_equal(got.params["w"], np.arange(3))


def test_legacy_checkpointers_form(tmp_path) -> None:
    mngr = ocp.CheckpointManager(tmp_path / "a", ocp.PyTreeCheckpointer(),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=1))
    mngr.save(0, {"a": np.ones(2)})
    mngr.save(1, {"a": np.zeros(2)}, save_kwargs={"save_args": {"a": ocp.SaveArgs(dtype=np.float16)}})
    mngr.wait_until_finished()
    assert mngr.all_steps() == [1]
    assert mngr.restore(1)["a"].dtype == np.float16
    multi = ocp.CheckpointManager(tmp_path / "b", {"x": ocp.PyTreeCheckpointer(),
                                                   "y": ocp.Checkpointer(ocp.JsonCheckpointHandler())})
    multi.save(3, {"x": {"a": np.ones(2)}, "y": {"k": 1}})
    multi.wait_until_finished()
    got = multi.restore(3, items={"x": {"a": np.zeros(2)}})
    assert set(got) == {"x"} and got.x["a"].tolist() == [1.0, 1.0]
    assert multi.restore(3).y == {"k": 1}


def test_composite_handler_returns_composite(tmp_path) -> None:
    h = ocp.CompositeCheckpointHandler("state", "meta")
    h.save(tmp_path, ocp.args.Composite(state=ocp.args.StandardSave({"a": np.int64(1)}),
                                        meta=ocp.args.JsonSave({"lang": "en"})))
    with pytest.raises(ValueError, match="temporary item"):  # as Orbax: items stay temporary until finalize()
        h.metadata(tmp_path)
    h.finalize(tmp_path)
    got = h.restore(tmp_path, ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    assert isinstance(got, ocp.args.Composite) and got.meta == {"lang": "en"}
    meta = h.metadata(tmp_path)
    assert isinstance(meta.item_metadata, ocp.args.Composite) and set(meta.item_metadata) == {"state", "meta"}
    assert meta.item_handlers["state"] == ocp.StandardCheckpointHandler.typestr()


def test_transforms_and_placeholders(tmp_path) -> None:
    ckptr = ocp.PyTreeCheckpointer()
    ckptr.save(tmp_path / "c", {"params": {"w": np.arange(6.0)}, "opt": {"mu": np.ones(3)}, "step": 3})
    # transforms={} (MaxText's load_params_from_path): the item's keys only
    got = ckptr.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(item={"params": {"w": np.zeros(6)}},
                                                                     transforms={}))
    assert set(got) == {"params"} and got["params"]["w"].tolist() == list(range(6))
    renamed = ckptr.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
        item={"w2": 0, "step": 0}, transforms={"w2": ocp.Transform(original_key="params/w", value_fn=lambda v: v * 2)}))
    assert renamed["step"] == 3 and renamed["w2"].tolist() == [0, 2, 4, 6, 8, 10]
    rename = {r"(.*)/y": ocp.Transform(original_key=r"\1/x")}
    by_regex = ocp.apply_transformations({"a": {"x": 1}, "b": {"x": 2}}, rename, {"a": {"y": 0}, "b": {"y": 0}})
    assert by_regex == {"a": {"y": 1}, "b": {"y": 2}}
    with pytest.raises(ValueError):
        ocp.apply_transformations({"a": 1}, {}, {"z": 0})
    held = ckptr.restore(tmp_path / "c", args=ocp.args.PyTreeRestore(
        item={"params": {"w": np.zeros(6)}, "opt": ocp.PLACEHOLDER, "step": 0}, partial_restore=True))
    assert held["opt"] is ocp.PLACEHOLDER and held["step"] == 3


def test_handler_registry_object(tmp_path) -> None:
    reg = ocp.DefaultCheckpointHandlerRegistry()
    reg.add("state", ocp.args.StandardSave)
    reg.add("state", ocp.args.StandardRestore)
    reg.add(None, ocp.args.JsonSave, ocp.JsonCheckpointHandler())
    with pytest.raises(ValueError):
        reg.add("state", ocp.args.StandardSave)
    assert isinstance(reg.get("state", ocp.args.StandardSave({})), ocp.StandardCheckpointHandler)
    mngr = ocp.CheckpointManager(tmp_path, handler_registry=reg)
    mngr.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave({"a": np.arange(2)}),
                                         meta=ocp.args.JsonSave({"k": 1})))
    mngr.wait_until_finished()
    got = mngr.restore(0, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    assert got.state["a"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="does not match with any registered handler"):
        ocp.CheckpointManager(tmp_path / "x", item_handlers={"p": ocp.PyTreeCheckpointHandler()}).save(
            0, args=ocp.args.Composite(p=ocp.args.StandardSave({"a": 1})))
    mngr.close()


def test_maxtext_names(tmp_path, caplog) -> None:
    args = ocp.type_handlers.SingleReplicaArrayRestoreArgs(sharding="s", global_shape=(4,))
    assert isinstance(args, ocp.ArrayRestoreArgs) and args.shape == (4,) and args.replica_axis_index == 0
    ocp.type_handlers.register_type_handler(np.ndarray, ocp.type_handlers.SingleReplicaArrayHandler(), override=True)
    with pytest.raises(ocp_errors.UnsupportedError):
        ocp.type_handlers.register_type_handler(np.ndarray, object())
    logger = ocp.logging.CloudLogger(options=ocp.logging.CloudLoggerOptions(job_name="run7"))
    mngr = ocp.CheckpointManager(tmp_path, logger=ocp.logging.CompositeLogger(logger, ocp.logging.StandardLogger()),
                                 options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False))
    with caplog.at_level("INFO", logger="ocdbt_py.orbax"):
        mngr.save(1, args=ocp.args.StandardSave({"a": np.arange(2)}))
        mngr.restore(1)
    assert any("[run7]" in r.getMessage() and "'event_type': 'save'" in r.getMessage() for r in caplog.records)
    assert any("'event_type': 'restore'" in r.getMessage() for r in caplog.records)
    mngr.close()
    tmp = tmp_path / "5.orbax-checkpoint-tmp"
    tmp.mkdir()
    [found] = ocp.step.all_temporary_paths(tmp_path)
    assert found.get() == tmp and found.get_final() == tmp_path / "5"
