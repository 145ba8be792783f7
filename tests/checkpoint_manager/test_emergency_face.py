"""``ocdbt_py.orbax.emergency`` in one process: Orbax's options (defaults, checks, policies
of either API) and, on a one-replica mesh, the same steps, files and results as Orbax's own
emergency ``CheckpointManager`` (which then keeps only the persistent tier).  The
multi-replica face is exercised by ``test_multitier_multiprocess.py::test_orbax_emergency_face``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.orbax import emergency as em
from ocdbt_py.orbax import options as ours_options

jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")


def _mesh() -> Any:
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("replica", "model"))


def _state(mesh: Any, step: int) -> dict[str, Any]:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    w = np.arange(32, dtype=np.float32).reshape(8, 4) + step
    return {"w": jax.device_put(w, NamedSharding(mesh, P("model"))),
            "n": jax.device_put(np.arange(6, dtype=np.int32) * step, NamedSharding(mesh, P()))}


def _abstract(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in tree.items()}


def test_options_as_orbax() -> None:
    from orbax.checkpoint.experimental.emergency import checkpoint_manager as theirs

    for cls in ("LocalCheckpointOptions", "PersistentCheckpointOptions", "MultiprocessingOptions"):
        ours_fields = {f.name: f.default for f in em.dataclasses.fields(getattr(em, cls))}
        theirs_fields = {f.name: f.default for f in em.dataclasses.fields(getattr(theirs, cls))}
        if cls == "MultiprocessingOptions":  # one class serves ocp.options' and emergency's: a superset
            assert em.MultiprocessingOptions is ours_options.MultiprocessingOptions
            ours_fields = {k: v for k, v in ours_fields.items() if k in theirs_fields}
        assert ours_fields == theirs_fields, cls
    assert em.LocalCheckpointOptions().max_to_keep == theirs.LocalCheckpointOptions().max_to_keep == 1
    keep = ocp.checkpoint_managers.LatestN(2)
    for mod in (em, theirs):
        with pytest.raises(ValueError, match="max_to_keep"):
            mod.LocalCheckpointOptions(max_to_keep=3, preservation_policy=keep)
        with pytest.raises(ValueError, match="keep_period"):
            mod.PersistentCheckpointOptions(keep_period=3, preservation_policy=keep)
    opts = em.CheckpointManagerOptions()
    got = (opts.local.save_interval_steps, opts.persistent.save_interval_steps, opts.replica_axis_index)
    assert got == (10, 1000, 0)


def _run(mod: Any, root: Path, options: Any, steps: range) -> tuple[list[int], Any, dict[str, Any]]:
    mesh = _mesh()
    abstract = _abstract(_state(mesh, 0))
    (root / "local").mkdir(parents=True, exist_ok=True)
    (root / "persistent").mkdir(parents=True, exist_ok=True)
    mgr = mod.CheckpointManager(root / "local", root / "persistent", mesh, abstract, options=options)
    saved = [s for s in steps if mgr.save(s, args=ocp.args.Composite(state=ocp.args.PyTreeSave(_state(mesh, s))))]
    mgr.wait_until_finished()
    got = mgr.restore(None)
    out = {"all_steps": sorted(int(s) for s in mgr.all_steps()), "latest": mgr.latest_step(),
           "should_save": [s for s in range(steps.stop, steps.stop + 6) if mgr.should_save(s)]}
    mgr.close()
    return saved, got, out


@pytest.mark.parametrize("api", ["options", "policies"])
def test_one_replica_as_orbax(tmp_path: Path, api: str) -> None:
    """Equal saved and kept steps, results and step layout; each restores the other's."""
    cm = ocp.checkpoint_managers
    if api == "options":
        persistent = {"save_interval_steps": 2, "max_to_keep": 2, "keep_period": 4}
    else:  # Orbax's policy objects
        persistent = {"save_decision_policy": cm.AnySavePolicy([cm.FixedIntervalPolicy(3), cm.InitialSavePolicy()]),
                      "preservation_policy": cm.AnyPreservationPolicy([cm.LatestN(2), cm.EveryNSteps(6)])}
    from orbax.checkpoint.experimental.emergency import checkpoint_manager as theirs

    results = {}
    for name, mod in (("ours", em), ("orbax", theirs)):
        options = mod.CheckpointManagerOptions(local=mod.LocalCheckpointOptions(save_interval_steps=1),
                                               persistent=mod.PersistentCheckpointOptions(**persistent))
        results[name] = _run(mod, tmp_path / name, options, range(13))
    (saved, got, info), (t_saved, t_got, t_info) = results["ours"], results["orbax"]
    assert saved == t_saved and info == t_info, (saved, info, t_saved, t_info)
    expected = {"options": ([0, 2, 4, 6, 8, 10, 12], [0, 4, 8, 10, 12], [14, 16, 18]),
                "policies": ([0, 3, 6, 9, 12], [0, 6, 9, 12], [15, 18])}[api]
    assert (saved, info["all_steps"], info["should_save"]) == expected
    assert list(got) == list(t_got) == ["state"]
    for k in ("w", "n"):
        assert np.asarray(got.state[k]).tobytes() == np.asarray(t_got.state[k]).tobytes()
        assert got.state[k].sharding == t_got.state[k].sharding
    assert not os.listdir(tmp_path / "ours" / "local") and not os.listdir(tmp_path / "orbax" / "local")
    ours_step = tmp_path / "ours" / "persistent" / str(info["latest"])
    theirs_step = tmp_path / "orbax" / "persistent" / str(info["latest"])
    assert sorted(os.listdir(ours_step)) == sorted(os.listdir(theirs_step))
    # each manager restores the other's directories
    mesh = _mesh()
    abstract = _abstract(_state(mesh, 0))
    for mod, root in ((em, tmp_path / "orbax"), (theirs, tmp_path / "ours")):
        mgr = mod.CheckpointManager(root / "local", root / "persistent", mesh, abstract,
                                    options=mod.CheckpointManagerOptions())
        r = mgr.restore(info["latest"])
        assert np.asarray(r.state["w"]).tobytes() == np.asarray(_state(mesh, info["latest"])["w"]).tobytes()
        mgr.close()


def test_save_args_and_process_state(tmp_path: Path) -> None:
    """``state`` is required, ``process_metadata`` reserved (as Orbax); other JSON items are
    this process's state and come back by name; a missing step raises FileNotFoundError."""
    mesh = _mesh()
    abstract = _abstract(_state(mesh, 0))
    options = em.CheckpointManagerOptions(persistent=em.PersistentCheckpointOptions(save_interval_steps=1))
    with em.CheckpointManager(tmp_path / "l", tmp_path / "p", mesh, abstract, options=options) as mgr:
        assert mgr.in_primary_slice and mgr.directory == tmp_path / "p"
        with pytest.raises(FileNotFoundError):
            mgr.restore(None)
        with pytest.raises(ValueError, match="required"):
            mgr.save(0, args=ocp.args.Composite(other=ocp.args.JsonSave({})))
        with pytest.raises(ValueError, match="reserved"):
            mgr.save(0, args=ocp.args.Composite(state=ocp.args.PyTreeSave(_state(mesh, 0)),
                                                process_metadata=ocp.args.JsonSave({})))
        for s in range(3):
            assert mgr.save(s, args=ocp.args.Composite(state=ocp.args.StandardSave(_state(mesh, s)),
                                                       dataset=ocp.args.JsonSave({"pos": s * 7})))
        mgr.wait_until_finished()
        got = mgr.restore(None, args=ocp.args.Composite(dataset=ocp.args.JsonRestore()))
        assert got["dataset"] == {"pos": 14} and got.dataset == {"pos": 14}
        assert np.asarray(got.state["n"]).tolist() == (np.arange(6) * 2).tolist()
        assert mgr.restore(1, args=ocp.args.Composite(dataset=ocp.args.JsonRestore())).dataset == {"pos": 7}
        assert list(mgr.restore(1)) == ["state"]
        for name in ("best_step", "metadata"):
            with pytest.raises(NotImplementedError):
                getattr(mgr, name)()
        with pytest.raises(NotImplementedError):
            mgr.delete(1)
