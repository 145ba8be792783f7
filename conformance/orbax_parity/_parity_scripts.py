"""The scripts of the behaviour-parity table (issue 33): each runs unchanged with
``orbax.checkpoint`` and with ``ocdbt_py.orbax`` (passed in as ``ocp``) and returns what user
code can observe, as JSON.

Each script has a ``<name>_write(ocp, root)`` and a ``<name>_read(ocp, root)``; the worker runs
the write with 8 host devices, then the read with 8, and (for ``sharding``) with 4: the
checkpoint's saved devices do not all exist there.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

SCRIPTS = ["sharding", "partial_target", "custom_policy_log", "emergency_persistent"]
#: scripts whose read also runs where the saved devices do not exist
FEWER_DEVICES = ["sharding"]


def _error(e: BaseException) -> dict[str, Any]:
    """What an ``except`` clause can see of an error: which of Orbax's bases it has."""
    return {"error": True, "ValueError": isinstance(e, ValueError),
            "FileNotFoundError": isinstance(e, FileNotFoundError)}


def observe(fn: Any) -> Any:
    """``fn()``'s result, or the kind of error it raised."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - observed
        return _error(e)


def describe_array(x: Any) -> dict[str, Any]:
    """Type, values and sharding of a restored leaf."""
    out: dict[str, Any] = {"type": "jax.Array" if hasattr(x, "sharding") else type(x).__name__,
                           "dtype": str(x.dtype), "values": np.asarray(x).ravel().tolist()}
    sharding = getattr(x, "sharding", None)
    if sharding is not None:
        mesh = getattr(sharding, "mesh", None)
        out["sharding"] = {"kind": type(sharding).__name__,
                           "mesh": None if mesh is None else dict(mesh.shape),
                           "spec": None if mesh is None else [None if p is None else str(p) for p in sharding.spec],
                           "devices": sorted(d.id for d in sharding.device_set)}
    return out


def _init() -> dict[str, Any]:
    import jax.numpy as jnp

    return {"w": jnp.arange(32.0).reshape(8, 4), "b": jnp.arange(4.0)}


def _sharded_state() -> dict[str, Any]:
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    return {k: jax.device_put(v, NamedSharding(mesh, P("data", "model") if v.ndim == 2 else P()))
            for k, v in _init().items()}


# ---- 1. a target without shardings (jax.eval_shape) restores onto the saved shardings -------

def sharding_write(ocp: Any, root: str) -> Any:
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(f"{root}/ckpt", _sharded_state())
    ckptr.wait_until_finished()
    return {"saved": True}


def sharding_read(ocp: Any, root: str) -> Any:
    import jax

    ckptr = ocp.StandardCheckpointer()
    abstract = jax.eval_shape(_init)  # leaves with shape and dtype, no sharding
    tree = lambda r: {k: describe_array(v) for k, v in sorted(r.items())}  # noqa: E731
    return {
        "eval_shape_target": observe(lambda: tree(ckptr.restore(f"{root}/ckpt", abstract))),
        "no_target": observe(lambda: tree(ckptr.restore(f"{root}/ckpt"))),
    }


# ---- 2. a restore target lacking a saved key (or naming one not saved) --------------------

def partial_target_write(ocp: Any, root: str) -> Any:
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(f"{root}/ckpt", {"w": np.arange(6, dtype=np.float32), "b": np.ones(2, np.int32)})
    ckptr.wait_until_finished()
    return {"saved": True}


def partial_target_read(ocp: Any, root: str) -> Any:
    import jax

    ckptr = ocp.StandardCheckpointer()
    shape = {"w": jax.ShapeDtypeStruct((6,), np.float32), "b": jax.ShapeDtypeStruct((2,), np.int32)}
    tree = lambda r: {k: describe_array(v) for k, v in sorted(r.items())}  # noqa: E731
    pytree = ocp.PyTreeCheckpointer()
    return {
        "full": observe(lambda: tree(ckptr.restore(f"{root}/ckpt", shape))),
        "lacks_key": observe(lambda: tree(ckptr.restore(f"{root}/ckpt", {"w": shape["w"]}))),
        "lacks_key_numpy": observe(lambda: tree(ckptr.restore(f"{root}/ckpt", {"w": np.zeros(6, np.float32)}))),
        "extra_key": observe(lambda: tree(ckptr.restore(f"{root}/ckpt", {**shape, "x": shape["b"]}))),
        "pytree_lacks_key": observe(lambda: tree(pytree.restore(
            f"{root}/ckpt", args=ocp.args.PyTreeRestore({"w": np.zeros(6, np.float32)})))),
        "pytree_partial_restore": observe(lambda: tree(pytree.restore(
            f"{root}/ckpt", args=ocp.args.PyTreeRestore({"w": np.zeros(6, np.float32)}, partial_restore=True)))),
    }


# ---- 3. a custom PreservationPolicy logging through Orbax's helper ------------------------

class _Handler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


def _keep_even_and_latest(ocp: Any) -> Any:
    pp = ocp.checkpoint_managers.preservation_policy

    class KeepEvenAndLatest(ocp.checkpoint_managers.PreservationPolicy):
        def should_preserve(self, checkpoints, *, context):  # type: ignore[no-untyped-def]
            flags = [c.step % 2 == 0 or i == len(checkpoints) - 1 for i, c in enumerate(checkpoints)]
            pp._log_preservation_decision("KeepEvenAndLatest", checkpoints, flags)
            return flags

    return KeepEvenAndLatest()


def custom_policy_log_write(ocp: Any, root: str) -> Any:
    options = ocp.CheckpointManagerOptions(preservation_policy=_keep_even_and_latest(ocp),
                                           enable_async_checkpointing=False)
    kept = []
    with ocp.CheckpointManager(f"{root}/mgr", options=options) as mngr:
        for step in range(6):
            mngr.save(step, args=ocp.args.StandardSave({"x": np.full(2, step, np.int32)}))
            kept.append(list(mngr.all_steps()))
    return {"kept": kept}


def custom_policy_log_read(ocp: Any, root: str) -> Any:
    with ocp.CheckpointManager(f"{root}/mgr") as mngr:
        return {"steps": list(mngr.all_steps()), "latest": describe_array(mngr.restore(mngr.latest_step())["x"])}


# ---- 4. emergency manager: the persistent tier saves its first step too ------------------

def _emergency(ocp: Any) -> Any:
    if ocp.__name__.startswith("ocdbt_py"):
        from ocdbt_py.orbax import emergency
    else:
        from orbax.checkpoint.experimental.emergency import checkpoint_manager as emergency
    return emergency


def _replica_mesh() -> Any:
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("replica", "model"))


def _emergency_state(step: int) -> dict[str, Any]:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _replica_mesh()
    return {"w": jax.device_put(np.arange(8, dtype=np.float32) + step, NamedSharding(mesh, P("model")))}


def emergency_persistent_write(ocp: Any, root: str) -> Any:
    import os

    import jax

    em = _emergency(ocp)
    os.makedirs(f"{root}/local", exist_ok=True)
    os.makedirs(f"{root}/persistent", exist_ok=True)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            _emergency_state(0))
    options = em.CheckpointManagerOptions(persistent=em.PersistentCheckpointOptions(save_interval_steps=4))
    mgr = em.CheckpointManager(f"{root}/local", f"{root}/persistent", _replica_mesh(), abstract, options=options)
    saved = [s for s in range(1, 7) if mgr.save(s, args=ocp.args.Composite(
        state=ocp.args.PyTreeSave(_emergency_state(s))))]
    mgr.wait_until_finished()
    out = {"saved": saved, "all_steps": sorted(int(s) for s in mgr.all_steps()), "latest": mgr.latest_step(),
           "persistent_dirs": sorted(int(d) for d in os.listdir(f"{root}/persistent") if d.isdigit())}
    mgr.close()
    return out


def emergency_persistent_read(ocp: Any, root: str) -> Any:
    import jax

    em = _emergency(ocp)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            _emergency_state(0))
    mgr = em.CheckpointManager(f"{root}/local", f"{root}/persistent", _replica_mesh(), abstract,
                               options=em.CheckpointManagerOptions())
    out = {"all_steps": sorted(int(s) for s in mgr.all_steps()),
           "first": describe_array(mgr.restore(1).state["w"])}
    mgr.close()
    return out
