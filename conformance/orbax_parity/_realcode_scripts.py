"""The checkpointing parts of real training code, with only the ``orbax.checkpoint`` import
changed, shrunk to tiny models on CPU (issue 33, item 3).  Each scenario repeats, in our own
words, the call sequence of the code it names (no file of those projects is copied or
imported: they pull in data loaders and TPU tooling); ``ocp`` is ``orbax.checkpoint`` or
``ocdbt_py.orbax``.  ``<name>_write`` trains and saves, ``<name>_read`` restores as the code
does on restart; the worker crosses the reads (each library reads the other's directory).

* ``maxtext_fixed`` / ``maxtext_autocheckpoint`` / ``maxtext_continuous``: MaxText
  ``src/maxtext/common/checkpointing.py`` -- ``create_orbax_checkpoint_manager`` (item
  ``items`` with ``PyTreeCheckpointHandler(restore_concurrent_gb, save_concurrent_gb,
  use_ocdbt, use_zarr3)``, ``create=True``, ``FixedIntervalPolicy`` / ``AnySavePolicy(
  [PreemptionCheckpointingPolicy, FixedIntervalPolicy])`` / ``ContinuousCheckpointingPolicy``
  with ``AsyncOptions(timeout_secs=3600)``, ``LatestN``), ``save_checkpoint``
  (``PyTreeSave(save_args=SaveArgs(chunk_byte_size), ocdbt_target_data_file_size)`` in
  ``Composite(items=...)`` with ``custom_metadata``) and ``load_state_if_possible``
  (``PyTreeRestore(item, restore_args=ArrayRestoreArgs(sharding), partial_restore=True)``).
* ``maxtext_single_replica``: ``load_state_if_possible(enable_single_replica_ckpt_restoring=True)``
  (``register_type_handler(jax.Array, SingleReplicaArrayHandler(...), override=True)`` and
  ``SingleReplicaArrayRestoreArgs``).
* ``maxtext_params``: ``save_params_to_path`` (``PyTreeCheckpointer(use_ocdbt, use_zarr3)``)
  and ``load_params_from_path`` (``construct_restore_args``, ``restore(item=, transforms={},
  restore_args=)``).
* ``maxtext_emergency``: ``emergency_checkpointing.create_emergency_checkpoint_manager``,
  ``save`` and ``restore`` (``Composite(state=...)``).
* ``flax_gemma``: Flax ``examples/gemma/train.py`` (``CheckpointManagerOptions(
  preservation_policy=LatestN(1), temporary_path_class=atomicity.CommitFileTemporaryPath)``,
  ``StandardSave`` of NNX states, ``StandardRestore(target)``).
* ``flax_nnx_toy``: Flax ``examples/nnx_toy_examples/08_save_load_checkpoints.py``.
* ``flax_imagenet``: Flax ``examples/imagenet/train.py`` and ``examples/wmt/train.py``'s
  ``save_checkpoint`` (a ``pmap``-replicated state through
  ``ocp.utils.fully_replicated_host_local_array_to_global_array``, then
  ``flax.training.checkpoints.save_checkpoint_multiprocess(keep=3)`` and
  ``restore_checkpoint``; Flax's module itself writes with Orbax either way, so what the
  drop-in changes is the arrays it is given).
* ``orbax_guide_pytrees`` / ``orbax_guide_manager``: Orbax's guides "Checkpointing PyTrees"
  and "CheckpointManager" (sharded ``StandardCheckpointer`` restore onto an abstract tree,
  ``PyTreeRestore`` with ``restore_args``; ``Composite`` of state + JSON, metrics and
  ``best_fn``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

SCRIPTS = ["maxtext_fixed", "maxtext_autocheckpoint", "maxtext_continuous", "maxtext_params",
           "maxtext_emergency", "flax_gemma", "flax_nnx_toy", "flax_imagenet", "orbax_guide_pytrees",
           "orbax_guide_manager", "maxtext_single_replica"]  # last: it registers a type handler for jax.Array

CHUNK = 1 << 20  # MaxText's checkpoint_storage_target_data_file_size_bytes, shrunk


def describe(tree: Any) -> Any:
    """Values, dtype and sharding of every leaf (a JSON-comparable tree)."""
    import jax

    def one(x: Any) -> Any:
        if not hasattr(x, "dtype"):
            return {"value": x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)}
        out: dict[str, Any] = {"type": "jax.Array" if isinstance(x, jax.Array) else type(x).__name__,
                               "dtype": str(x.dtype), "values": np.asarray(x).ravel().tolist()}
        s = getattr(x, "sharding", None)
        if isinstance(s, jax.sharding.NamedSharding):
            out["sharding"] = [dict(s.mesh.shape), [None if p is None else str(p) for p in s.spec]]
        elif s is not None:
            out["sharding"] = [type(s).__name__, sorted(d.id for d in s.device_set)]
        return out

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(k): one(v) for k, v in flat}


def _mesh() -> Any:
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


def _train_state(step: int, data_parallel: bool = False) -> Any:
    """A tiny flax TrainState (params + adam state), sharded on a 2x4 mesh as MaxText shards
    (``data_parallel``: replicated along ``data``, as single-replica restores need)."""
    import jax
    import optax
    from flax.training import train_state
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    params = {"params": {"dense": {"kernel": np.arange(32, dtype=np.float32).reshape(8, 4) / 10 + step,
                                   "bias": np.full(4, step, np.float32)}}}
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-3))
    state = state.replace(step=step)
    mesh = _mesh()

    def put(x: Any) -> Any:
        x = np.asarray(x)
        spec = (P(None, "model") if data_parallel else P("data", "model")) if x.ndim == 2 else P()
        return jax.device_put(x, NamedSharding(mesh, spec))

    return jax.tree.map(put, state)


def _abstract(tree: Any) -> Any:
    import jax

    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


# ---- MaxText: create_orbax_checkpoint_manager / save_checkpoint / load_state_if_possible ----

def _maxtext_manager(ocp: Any, root: str, policy: str, use_async: bool = True, keep: int = 2) -> Any:
    sdp = ocp.checkpoint_managers.save_decision_policy
    pp = ocp.checkpoint_managers.preservation_policy
    handlers = {"items": ocp.PyTreeCheckpointHandler(restore_concurrent_gb=1, save_concurrent_gb=1, use_ocdbt=True,
                                                     use_zarr3=True)}
    async_options = None
    if policy == "continuous":
        decision = sdp.ContinuousCheckpointingPolicy()
        async_options = ocp.AsyncOptions(timeout_secs=3600)
    elif policy == "autocheckpoint":
        decision = sdp.AnySavePolicy([sdp.PreemptionCheckpointingPolicy(), sdp.FixedIntervalPolicy(3)])
    else:
        decision = sdp.FixedIntervalPolicy(interval=2)
    return ocp.CheckpointManager(
        root, item_names=("items",), item_handlers=handlers,
        options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=use_async,
                                             save_decision_policy=decision, preservation_policy=pp.LatestN(keep),
                                             async_options=async_options, todelete_subdir=None,
                                             todelete_full_path=None))


def _maxtext_save(ocp: Any, mngr: Any, step: int, state: Any, force: bool = False) -> bool:
    import jax

    args = ocp.args.PyTreeSave(item=state, save_args=jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK), state),
                               ocdbt_target_data_file_size=CHUNK)
    return bool(mngr.save(step, args=ocp.args.Composite(items=args), force=force,
                          custom_metadata={"scan_layers": True}))


def _maxtext_load(ocp: Any, mngr: Any) -> Any:
    import jax

    step = mngr.latest_step()
    target = _abstract(_train_state(0))
    restore_args = jax.tree_util.tree_map(lambda data: ocp.type_handlers.ArrayRestoreArgs(sharding=data.sharding),
                                          target)
    args = ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
    restored = mngr.restore(step, args=ocp.args.Composite(items=args))
    return {"step": step, "state": describe(restored["items"])}


def _maxtext_loop(ocp: Any, root: str, policy: str, data_parallel: bool = False) -> Any:
    mngr = _maxtext_manager(ocp, f"{root}/ckpt", policy)
    saved, kept = [], []
    for step in range(7):
        saved.append(_maxtext_save(ocp, mngr, step, _train_state(step, data_parallel)))
        if policy == "continuous":
            mngr.wait_until_finished()  # the deterministic form: each save committed before the next step
        kept.append(list(mngr.all_steps()))
    mngr.wait_until_finished()
    out = {"saved": saved, "kept": kept, "latest": mngr.latest_step(),
           "custom_metadata": mngr.metadata(mngr.latest_step()).custom_metadata}
    mngr.close()
    return out


def _maxtext_read(ocp: Any, root: str, policy: str) -> Any:
    mngr = _maxtext_manager(ocp, f"{root}/ckpt", policy)
    out = {"steps": list(mngr.all_steps()), **_maxtext_load(ocp, mngr)}
    mngr.close()
    return out


def maxtext_fixed_write(ocp: Any, root: str) -> Any:
    return _maxtext_loop(ocp, root, "fixed")


def maxtext_fixed_read(ocp: Any, root: str) -> Any:
    return _maxtext_read(ocp, root, "fixed")


def maxtext_autocheckpoint_write(ocp: Any, root: str) -> Any:
    return _maxtext_loop(ocp, root, "autocheckpoint")


def maxtext_autocheckpoint_read(ocp: Any, root: str) -> Any:
    return _maxtext_read(ocp, root, "autocheckpoint")


def maxtext_continuous_write(ocp: Any, root: str) -> Any:
    return _maxtext_loop(ocp, root, "continuous")


def maxtext_continuous_read(ocp: Any, root: str) -> Any:
    return _maxtext_read(ocp, root, "continuous")


def maxtext_single_replica_write(ocp: Any, root: str) -> Any:
    return _maxtext_loop(ocp, root, "fixed", data_parallel=True)


def maxtext_single_replica_read(ocp: Any, root: str) -> Any:
    import jax

    mngr = _maxtext_manager(ocp, f"{root}/ckpt", "fixed")
    step = mngr.latest_step()
    target = _abstract(_train_state(0, data_parallel=True))

    def map_to_pspec(data: Any) -> Any:
        pspec, mesh = data.sharding.spec, data.sharding.mesh
        replica_mesh = jax.sharding.Mesh(mesh.devices[0:1], mesh.axis_names)  # replica 0 along axis 0
        return ocp.type_handlers.SingleReplicaArrayRestoreArgs(
            sharding=jax.sharding.NamedSharding(mesh, pspec),
            single_replica_sharding=jax.sharding.NamedSharding(replica_mesh, pspec),
            global_shape=data.shape, dtype=data.dtype)

    array_handler = ocp.type_handlers.SingleReplicaArrayHandler(replica_axis_index=0,
                                                                broadcast_memory_limit_bytes=1024 * 1024 * 1000)
    ocp.type_handlers.register_type_handler(jax.Array, array_handler, override=True)
    args = ocp.args.PyTreeRestore(item=target, restore_args=jax.tree_util.tree_map(map_to_pspec, target),
                                  partial_restore=True)
    restored = mngr.restore(step, args=ocp.args.Composite(items=args))
    mngr.close()
    return {"step": step, "state": describe(restored["items"])}


def maxtext_params_write(ocp: Any, root: str) -> Any:
    params = _train_state(3).params
    ckptr = ocp.PyTreeCheckpointer(use_ocdbt=True, use_zarr3=True)
    ckptr.save(f"{root}/params", {"params": params}, force=True)
    return {"saved": True}


def maxtext_params_read(ocp: Any, root: str) -> Any:
    want = _abstract(_train_state(0).params)
    ckptr = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(restore_concurrent_gb=1, save_concurrent_gb=1,
                                                         use_ocdbt=True, use_zarr3=True))
    restore_args = ocp.checkpoint_utils.construct_restore_args(want)
    restored = ckptr.restore(f"{root}/params", item={"params": want}, transforms={},
                             restore_args={"params": restore_args})
    return {"keys": sorted(restored), "params": describe(restored["params"])}


# ---- MaxText: the emergency manager ---------------------------------------------------------

def _emergency(ocp: Any) -> Any:
    if ocp.__name__.startswith("ocdbt_py"):
        from ocdbt_py.orbax import emergency
    else:
        from orbax.checkpoint.experimental.emergency import checkpoint_manager as emergency
    return emergency


def _emergency_mesh() -> Any:
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ("data", "model"))


def _emergency_state(step: int) -> Any:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _emergency_mesh()
    return {"params": jax.device_put(np.arange(16, dtype=np.float32).reshape(4, 4) + step,
                                     NamedSharding(mesh, P(None, "model"))),
            "step": jax.device_put(np.asarray(step, np.int32), NamedSharding(mesh, P()))}


def _emergency_manager(ocp: Any, root: str) -> Any:
    em = _emergency(ocp)
    os.makedirs(f"{root}/local", exist_ok=True)
    os.makedirs(f"{root}/persistent", exist_ok=True)
    return em.CheckpointManager(f"{root}/local", f"{root}/persistent", global_mesh=_emergency_mesh(),
                                abstract_state=_abstract(_emergency_state(0)),
                                options=em.CheckpointManagerOptions(
                                    local=em.LocalCheckpointOptions(save_interval_steps=2),
                                    persistent=em.PersistentCheckpointOptions(save_interval_steps=3)))


def maxtext_emergency_write(ocp: Any, root: str) -> Any:
    import jax

    mngr = _emergency_manager(ocp, root)
    saved = []
    for step in range(8):
        state = _emergency_state(step)
        args = ocp.args.PyTreeSave(item=state, save_args=jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK),
                                                                         state), ocdbt_target_data_file_size=CHUNK)
        saved.append(bool(mngr.save(step, args=ocp.args.Composite(state=args), force=False)))
    mngr.wait_until_finished()
    out = {"saved": saved, "all_steps": sorted(int(s) for s in mngr.all_steps()), "latest": mngr.latest_step()}
    mngr.close()
    return out


def maxtext_emergency_read(ocp: Any, root: str) -> Any:
    import jax

    mngr = _emergency_manager(ocp, root)
    target = _abstract(_emergency_state(0))
    restore_args = jax.tree_util.tree_map(lambda data: ocp.type_handlers.ArrayRestoreArgs(sharding=data.sharding),
                                          target)
    args = ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
    step = mngr.latest_step()
    out = {"step": step, "state": describe(mngr.restore(step, args=ocp.args.Composite(state=args)).state)}
    mngr.close()
    return out


# ---- Flax examples -----------------------------------------------------------------------------

def _nnx_model(seed: int) -> Any:
    from flax import nnx

    class Tiny(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.lin1 = nnx.Linear(4, 8, rngs=rngs)
            self.lin2 = nnx.Linear(8, 2, rngs=rngs)

    return Tiny(nnx.Rngs(seed))


def flax_gemma_write(ocp: Any, root: str) -> Any:
    import optax
    from flax import nnx

    model = _nnx_model(0)
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    mngr = ocp.CheckpointManager(
        f"{root}/checkpoints", options=ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.preservation_policy.LatestN(1),
            temporary_path_class=ocp.path.atomicity.CommitFileTemporaryPath))
    kept = []
    for step in range(1, 7):
        if step % 2 == 0:
            mngr.save(step, args=ocp.args.StandardSave(
                {"model": nnx.state(model), "optimizer": nnx.state(optimizer), "step": step}))
            kept.append(list(mngr.all_steps()))
    mngr.wait_until_finished()
    mngr.close()
    return {"kept": kept}


def flax_gemma_read(ocp: Any, root: str) -> Any:
    import optax
    from flax import nnx

    model = _nnx_model(1)  # other values: the restore must bring back step 6's
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    mngr = ocp.CheckpointManager(
        f"{root}/checkpoints", options=ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.preservation_policy.LatestN(1),
            temporary_path_class=ocp.path.atomicity.CommitFileTemporaryPath))
    target = {"model": nnx.state(model), "optimizer": nnx.state(optimizer), "step": 0}
    checkpoint = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(target))
    nnx.update(model, checkpoint["model"])
    nnx.update(optimizer, checkpoint["optimizer"])
    out = {"latest": mngr.latest_step(), "step": int(checkpoint["step"]), "model": describe(nnx.state(model)),
           "opt_step": describe(nnx.state(optimizer)["step"])}
    mngr.close()
    return out


def flax_nnx_toy_write(ocp: Any, root: str) -> Any:
    from flax import nnx

    state = nnx.state(_nnx_model(0))
    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(f"{root}/state", state)
    return {"saved": True}


def flax_nnx_toy_read(ocp: Any, root: str) -> Any:
    from flax import nnx

    model = _nnx_model(5)
    state = nnx.state(model)
    checkpointer = ocp.PyTreeCheckpointer()
    state = checkpointer.restore(f"{root}/state", item=state)
    nnx.update(model, state)
    return {"model": describe(nnx.state(model))}


def _replicated_state(step: int) -> Any:
    """A TrainState replicated over every local device, as ``flax.jax_utils.replicate`` makes it."""
    import jax

    devices = jax.local_devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("pmap",))

    def replicate(x: Any) -> Any:  # flax.jax_utils.replicate: one copy per device on a leading axis
        stacked = np.broadcast_to(np.asarray(x), (len(devices), *np.shape(x)))
        return jax.device_put(stacked, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("pmap")))

    return jax.tree.map(replicate, jax.tree.map(np.asarray, _train_state(step)))


def flax_imagenet_write(ocp: Any, root: str) -> Any:
    import jax
    from flax.training import checkpoints

    shapes = []
    for step in (10, 20, 30, 40):
        state = _replicated_state(step)
        # Orbax can not handle host local arrays from pmap. Convert to global arrays.
        replicated_state = jax.tree_util.tree_map(ocp.utils.fully_replicated_host_local_array_to_global_array, state)
        shapes.append(list(replicated_state.params["params"]["dense"]["kernel"].shape))
        checkpoints.save_checkpoint_multiprocess(f"{root}/work", replicated_state, step, keep=3)
    return {"shapes": shapes, "kept": sorted(int(d.split("_")[-1]) for d in os.listdir(f"{root}/work")
                                             if d.startswith("checkpoint_"))}


def flax_imagenet_read(ocp: Any, root: str) -> Any:
    import jax
    from flax.training import checkpoints

    target = jax.tree.map(np.asarray, _train_state(0))
    restored = checkpoints.restore_checkpoint(f"{root}/work", target)
    return {"step": int(restored.step), "params": describe(jax.tree.map(np.asarray, restored.params))}


# ---- Orbax's guides ------------------------------------------------------------------------------

def orbax_guide_pytrees_write(ocp: Any, root: str) -> Any:
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(f"{root}/standard", _train_state(2).params)
    ckptr.wait_until_finished()
    ocp.PyTreeCheckpointer().save(f"{root}/pytree", {"a": np.arange(4), "b": {"c": np.ones(3, np.float32)}})
    return {"saved": True}


def orbax_guide_pytrees_read(ocp: Any, root: str) -> Any:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    abstract = _abstract(_train_state(0).params)
    standard = ocp.StandardCheckpointer().restore(f"{root}/standard", abstract)
    # onto another sharding: everything replicated on a 1x8 mesh ("restoring with a new sharding")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(1, 8), ("x", "y"))
    moved = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())),
                         abstract)
    resharded = ocp.StandardCheckpointer().restore(f"{root}/standard", moved)
    item = {"a": np.zeros(4, np.int64), "b": {"c": np.zeros(3, np.float32)}}
    restore_args = ocp.checkpoint_utils.construct_restore_args(item)
    pytree = ocp.PyTreeCheckpointer().restore(f"{root}/pytree", args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args))
    meta = ocp.StandardCheckpointer().metadata(f"{root}/standard")
    shapes = jax.tree.map(lambda m: list(m.shape), getattr(meta, "item_metadata", meta))
    return {"standard": describe(standard), "resharded": describe(resharded), "pytree": describe(pytree),
            "shapes": describe(jax.tree.map(np.asarray, shapes, is_leaf=lambda x: isinstance(x, list)))}


def orbax_guide_manager_write(ocp: Any, root: str) -> Any:
    options = ocp.CheckpointManagerOptions(max_to_keep=3, save_interval_steps=2, best_fn=lambda m: m["loss"],
                                           best_mode="min")
    mngr = ocp.CheckpointManager(f"{root}/mgr", options=options, item_names=("state", "extra_params"))
    saved, kept = [], []
    for step, loss in enumerate([5.0, 4.0, 3.0, 6.0, 1.0, 2.0, 7.0, 0.5]):
        saved.append(bool(mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(_train_state(step).params),
            extra_params=ocp.args.JsonSave({"step": step, "lr": 0.1})), metrics={"loss": loss})))
        kept.append(list(mngr.all_steps()))
    mngr.wait_until_finished()
    out = {"saved": saved, "kept": kept, "best": mngr.best_step(), "latest": mngr.latest_step()}
    mngr.close()
    return out


def orbax_guide_manager_read(ocp: Any, root: str) -> Any:
    options = ocp.CheckpointManagerOptions(best_fn=lambda m: m["loss"], best_mode="min")
    mngr = ocp.CheckpointManager(f"{root}/mgr", options=options, item_names=("state", "extra_params"))
    best = mngr.best_step()
    restored = mngr.restore(best, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(_train_state(0).params)), extra_params=ocp.args.JsonRestore()))
    out = {"steps": list(mngr.all_steps()), "best": best, "metrics": mngr.metrics(best),
           "state": describe(restored.state), "extra": restored.extra_params}
    mngr.close()
    return out
