"""Orbax's documented snippets, written against an ``ocp`` module given as argument.

Each snippet has ``write(ocp, root) -> dict`` (what the script observes while saving: save
decisions, kept steps) and ``read(ocp, root) -> dict`` (what it restores).  The conformance
worker runs both with ``orbax.checkpoint`` and with ``ocdbt_py.orbax`` and crosses them
(Orbax reads what ours wrote and the other way round).  ``NUMPY`` snippets need no JAX.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def describe(x: Any) -> Any:
    """A JSON-comparable description of a restored value (values, dtype, sharding)."""
    if isinstance(x, dict) or (hasattr(x, "keys") and hasattr(x, "__getitem__")):
        return {str(k): describe(x[k]) for k in sorted(x.keys())}
    if isinstance(x, (list, tuple)):
        return [describe(v) for v in x]
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        d: dict[str, Any] = {"dtype": str(np.dtype(x.dtype)), "shape": list(x.shape),
                             "values": np.asarray(x).astype("float64").ravel().tolist()}
        sharding = getattr(x, "sharding", None)
        spec = getattr(sharding, "spec", None)
        if spec is not None:
            d["sharding"] = str(spec)
            d["mesh"] = dict(sharding.mesh.shape)
        return d
    if isinstance(x, (np.generic,)):
        return x.item()
    return x


def _params(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"dense": {"kernel": rng.standard_normal((16, 8)).astype("float32"),
                      "bias": rng.standard_normal(8).astype("float32")},
            "embed": rng.standard_normal((32, 4)).astype("float32"),
            "step": np.int64(seed)}


# ---- custom chunk sizes and data file size (PyTreeSave + SaveArgs) --------------------------

def chunks_write(ocp: Any, root: str) -> dict[str, Any]:
    tree = _params(1)
    save_args = {"dense": {"kernel": ocp.SaveArgs(chunk_byte_size=128), "bias": ocp.SaveArgs()},
                 "embed": ocp.SaveArgs(chunk_byte_size=64, dtype=np.dtype("float16")), "step": ocp.SaveArgs()}
    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    ckptr.save(f"{root}/ckpt", args=ocp.args.PyTreeSave(tree, save_args=save_args,
                                                          ocdbt_target_data_file_size=1024))
    return {}


def chunks_read(ocp: Any, root: str) -> dict[str, Any]:
    from ocdbt_py.checkpoint import metadata

    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    restored = ckptr.restore(f"{root}/ckpt")
    meta = metadata(f"{root}/ckpt")
    chunks = {"kernel": list(meta["dense"]["kernel"].chunks), "embed": list(meta["embed"].chunks),
              "embed_dtype": str(meta["embed"].dtype)}
    return {"restored": describe(restored), "chunks": chunks}


# ---- continuous checkpointing with a minimum interval -----------------------------------

def continuous_write(ocp: Any, root: str) -> dict[str, Any]:
    policy = ocp.checkpoint_managers.ContinuousCheckpointingPolicy(minimum_interval_secs=2)
    options = ocp.CheckpointManagerOptions(save_decision_policy=policy)
    saved = []
    with ocp.CheckpointManager(f"{root}/mgr", options=options) as mngr:
        for step in range(6):
            if step == 3:
                mngr.wait_until_finished()
                time.sleep(2.5)
            saved.append(bool(mngr.save(step, args=ocp.args.StandardSave({"x": np.full(4, step, "float32")}))))
            mngr.wait_until_finished()
        steps = list(mngr.all_steps())
    return {"saved": saved, "steps": steps}


def continuous_read(ocp: Any, root: str) -> dict[str, Any]:
    with ocp.CheckpointManager(f"{root}/mgr") as mngr:
        return {"steps": list(mngr.all_steps()), "latest": describe(mngr.restore(mngr.latest_step()))}


def continuous_in_flight_write(ocp: Any, root: str) -> dict[str, Any]:
    """No new save while one is in flight: the commit is held back by the post-finalization
    callback until the script has asked."""
    import threading

    release = threading.Event()
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.ContinuousCheckpointingPolicy(),
        async_options=ocp.AsyncOptions(post_finalization_callback=lambda: release.wait(30)))
    with ocp.CheckpointManager(f"{root}/mgr", options=options) as mngr:
        first = bool(mngr.save(0, args=ocp.args.StandardSave({"x": np.zeros(4)})))
        busy = [bool(mngr.is_saving_in_progress()), bool(mngr.should_save(1))]
        release.set()
        mngr.wait_until_finished()
        after = [bool(mngr.is_saving_in_progress()), bool(mngr.should_save(1))]
        return {"first": first, "busy": busy, "after": after, "steps": list(mngr.all_steps())}


def continuous_in_flight_read(ocp: Any, root: str) -> dict[str, Any]:
    with ocp.CheckpointManager(f"{root}/mgr") as mngr:
        return {"steps": list(mngr.all_steps())}


# ---- a custom PreservationPolicy subclass ---------------------------------------------

def _keep_even_cls(ocp: Any) -> Any:
    class KeepEvenAndLatest(ocp.checkpoint_managers.PreservationPolicy):
        def should_preserve(self, checkpoints, *, context):  # type: ignore[no-untyped-def]
            return [c.step % 2 == 0 or i == len(checkpoints) - 1 for i, c in enumerate(checkpoints)]

    return KeepEvenAndLatest


def custom_policy_write(ocp: Any, root: str) -> dict[str, Any]:
    options = ocp.CheckpointManagerOptions(preservation_policy=_keep_even_cls(ocp)(), enable_async_checkpointing=False)
    kept = []
    with ocp.CheckpointManager(f"{root}/mgr", options=options) as mngr:
        for step in range(7):
            mngr.save(step, args=ocp.args.StandardSave({"w": np.arange(3, dtype="int32") + step}))
            kept.append(list(mngr.all_steps()))
    return {"kept": kept}


def custom_policy_read(ocp: Any, root: str) -> dict[str, Any]:
    mngr = ocp.CheckpointManager(f"{root}/mgr")
    out = {"steps": list(mngr.all_steps()), "restored": {s: describe(mngr.restore(s)) for s in mngr.all_steps()}}
    mngr.close()
    return {"steps": out["steps"], "restored": {str(k): v for k, v in out["restored"].items()}}


# ---- max_to_keep / keep_period / best_fn (and BestN deleting the newest step) -----------

LOSSES = [5.0, 3.0, 4.0, 1.0, 6.0, 2.0, 7.0]


def retention_write(ocp: Any, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    configs = {
        "latest2": dict(max_to_keep=2),
        "period_best": dict(max_to_keep=2, keep_period=4, best_fn=lambda m: m["loss"], best_mode="min"),
        "best1_max": dict(max_to_keep=1, best_fn=lambda m: -m["loss"], best_mode="max",
                          keep_checkpoints_without_metrics=False),
        "interval3": dict(save_interval_steps=3, max_to_keep=3),
    }
    for name, kw in configs.items():
        options = ocp.CheckpointManagerOptions(**kw)
        mngr = ocp.CheckpointManager(f"{root}/{name}", options=options, item_names=("state", "extra"))
        saved, kept = [], []
        for step, loss in enumerate(LOSSES):
            args = ocp.args.Composite(state=ocp.args.StandardSave({"v": np.full(2, step, "float64")}),
                                      extra=ocp.args.JsonSave({"step": step}))
            saved.append(bool(mngr.save(step, args=args, metrics={"loss": loss})))
            kept.append(list(mngr.all_steps()))
        mngr.wait_until_finished()
        out[name] = {"saved": saved, "kept": kept, "best": mngr.best_step(), "latest": mngr.latest_step()}
        mngr.close()
    return out


def retention_read(ocp: Any, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("latest2", "period_best", "best1_max", "interval3"):
        best = dict(best_fn=lambda m: m["loss"], best_mode="min") if name == "period_best" else {}
        mngr = ocp.CheckpointManager(f"{root}/{name}", options=ocp.CheckpointManagerOptions(read_only=True, **best),
                                     item_names=("state", "extra"))
        steps = list(mngr.all_steps())
        restored = {str(s): describe(mngr.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), extra=ocp.args.JsonRestore()))) for s in steps}
        out[name] = {"steps": steps, "best": mngr.best_step(), "restored": restored}
        mngr.close()
    return out


# ---- item handlers given to the manager (Zarr v3 for one item), legacy checkpointer calls ----

def handlers_write(ocp: Any, root: str) -> dict[str, Any]:
    handlers = {"params": ocp.PyTreeCheckpointHandler(use_zarr3=True), "cfg": ocp.JsonCheckpointHandler()}
    with ocp.CheckpointManager(f"{root}/mgr", item_handlers=handlers,
                               options=ocp.CheckpointManagerOptions(max_to_keep=1)) as mngr:
        for step in (0, 1):
            mngr.save(step, args=ocp.args.Composite(params=ocp.args.PyTreeSave(_params(step), save_args=None),
                                                    cfg=ocp.args.JsonSave({"step": step, "name": "run"})))
        mngr.wait_until_finished()
        kept = list(mngr.all_steps())
    ckptr = ocp.PyTreeCheckpointer()
    ckptr.save(f"{root}/legacy", {"a": np.arange(6, dtype="int16").reshape(2, 3), "s": "text", "n": None})
    return {"kept": kept}


def handlers_read(ocp: Any, root: str) -> dict[str, Any]:
    from ocdbt_py.checkpoint import metadata

    handlers = {"params": ocp.PyTreeCheckpointHandler(use_zarr3=True), "cfg": ocp.JsonCheckpointHandler()}
    with ocp.CheckpointManager(f"{root}/mgr", item_handlers=handlers) as mngr:
        r = mngr.restore(1, args=ocp.args.Composite(params=ocp.args.PyTreeRestore(), cfg=ocp.args.JsonRestore()))
        only_cfg = mngr.restore(1, args=ocp.args.Composite(cfg=ocp.args.JsonRestore()))
    ckptr = ocp.PyTreeCheckpointer()
    target = {"a": np.zeros((2, 3), "int16"), "s": "", "n": None}
    legacy = ckptr.restore(f"{root}/legacy", item=target)
    typed = ckptr.restore(f"{root}/legacy", args=ocp.args.PyTreeRestore(
        target, restore_args={"a": ocp.RestoreArgs(restore_type=np.ndarray, dtype=np.float32),
                              "s": ocp.RestoreArgs(), "n": ocp.RestoreArgs()}))
    zarr = metadata(f"{root}/mgr/1/params")["embed"].zarr_format
    return {"params": describe(r["params"]), "cfg": r.cfg, "only": sorted(only_cfg.keys()), "zarr": zarr,
            "legacy": describe(legacy), "typed": describe(typed)}


# ---- root and step metadata ------------------------------------------------------------

def metadata_write(ocp: Any, root: str) -> dict[str, Any]:
    options = ocp.CheckpointManagerOptions(best_fn=lambda m: m["acc"])
    with ocp.CheckpointManager(f"{root}/mgr", options=options, metadata={"model": "tiny", "layers": 2}) as mngr:
        mngr.save(1, args=ocp.args.StandardSave({"w": np.ones((2, 3), "float32")}), metrics={"acc": 0.25},
                  custom_metadata={"note": "first"})
        mngr.wait_until_finished()
        return {"root": mngr.metadata().custom_metadata}


def metadata_read(ocp: Any, root: str) -> dict[str, Any]:
    # Orbax gives item metadata only for items whose handler it knows: register it
    with ocp.CheckpointManager(f"{root}/mgr", item_handlers=ocp.StandardCheckpointHandler()) as mngr:
        step = mngr.metadata(1)
        items = step.item_metadata
        return {"root": mngr.metadata().custom_metadata, "custom": step.custom_metadata,
                "metrics": dict(step.metrics), "metrics_fn": mngr.metrics(1),
                "w": [list(items["w"].shape), str(np.dtype(items["w"].dtype))]}


# ---- StandardCheckpointer (NumPy) -------------------------------------------------------

def standard_np_write(ocp: Any, root: str) -> dict[str, Any]:
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(f"{root}/std", _params(3))
    ckptr.wait_until_finished()
    return {}


def standard_np_read(ocp: Any, root: str) -> dict[str, Any]:
    ckptr = ocp.StandardCheckpointer()
    target = {"dense": {"kernel": np.zeros((16, 8), "float32"), "bias": np.zeros(8, "float32")},
              "embed": np.zeros((32, 4), "float32"), "step": 0}
    return {"plain": describe(ckptr.restore(f"{root}/std")), "target": describe(ckptr.restore(f"{root}/std", target))}


# ---- JAX: composite params + optimizer + JSON restored onto another mesh ----------------

def _mesh(shape: tuple[int, int]) -> Any:
    import jax

    return jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), ("data", "model"))


def _sharded(tree: Any, mesh: Any) -> Any:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def put(x: Any) -> Any:
        x = np.asarray(x)
        spec = [None] * x.ndim
        if x.ndim >= 1 and x.shape[0] % mesh.shape["data"] == 0:
            spec[0] = "data"
        if x.ndim >= 2 and x.shape[1] % mesh.shape["model"] == 0:
            spec[1] = "model"
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    return jax.tree.map(put, tree)


def _train_state(mesh: Any) -> dict[str, Any]:
    p = _params(7)
    params = {"dense": p["dense"], "embed": p["embed"]}
    opt = {"mu": {"dense": {"kernel": p["dense"]["kernel"] * 0.1, "bias": p["dense"]["bias"] * 0.1},
                  "embed": p["embed"] * 0.1},
           "count": np.array([3], dtype="int32")}
    return {"params": _sharded(params, mesh), "opt_state": _sharded(opt, mesh)}


def composite_mesh_write(ocp: Any, root: str) -> dict[str, Any]:
    state = _train_state(_mesh((4, 2)))
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(f"{root}/mgr", options=options,
                               item_names=("params", "opt_state", "config")) as mngr:
        for step in (10, 20, 30):
            mngr.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(state["params"]),
                opt_state=ocp.args.PyTreeSave(state["opt_state"]),
                config=ocp.args.JsonSave({"lr": 0.001, "step": step})))
        mngr.wait_until_finished()
        return {"steps": list(mngr.all_steps())}


def composite_mesh_read(ocp: Any, root: str) -> dict[str, Any]:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh((2, 4))  # another mesh than the one saved from
    like = _train_state(_mesh((4, 2)))

    def abstract(x: Any) -> Any:
        spec = [None] * x.ndim
        if x.ndim >= 2 and x.shape[1] % 4 == 0:
            spec[1] = "model"
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P(*spec)))

    abstract_params = jax.tree.map(abstract, like["params"])
    abstract_opt = jax.tree.map(abstract, like["opt_state"])
    with ocp.CheckpointManager(f"{root}/mgr", item_names=("params", "opt_state", "config")) as mngr:
        step = mngr.latest_step()
        restored = mngr.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params),
            opt_state=ocp.args.PyTreeRestore(
                abstract_opt, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_opt)),
            config=ocp.args.JsonRestore()))
        as_saved = mngr.restore(step)  # no args: every item, arrays on their saved shardings
        return {"steps": list(mngr.all_steps()), "step": step, "params": describe(restored.params),
                "opt_state": describe(restored["opt_state"]), "config": restored.config,
                "as_saved": describe(as_saved)}


def standard_jax_write(ocp: Any, root: str) -> dict[str, Any]:
    state = _train_state(_mesh((4, 2)))["params"]
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(f"{root}/std", state)
    ckptr.wait_until_finished()
    return {}


def standard_jax_read(ocp: Any, root: str) -> dict[str, Any]:
    import jax

    like = _train_state(_mesh((4, 2)))["params"]
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    ckptr = ocp.StandardCheckpointer()
    return {"restored": describe(ckptr.restore(f"{root}/std", abstract)),
            "as_saved": describe(ckptr.restore(f"{root}/std"))}


NUMPY = ["chunks", "continuous", "continuous_in_flight", "custom_policy", "retention", "handlers", "metadata",
         "standard_np"]
JAX = ["composite_mesh", "standard_jax"]
SNIPPETS = NUMPY + JAX
