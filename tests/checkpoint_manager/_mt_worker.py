"""One process of a multi-tier checkpointing job (``jax.distributed`` on 127.0.0.1, gloo).

Usage: python _mt_worker.py JOB_JSON PROCESS_ID PORT.  The job names the process count,
devices per process, the directories, the policies and a list of actions:

* ``{"do": "save", "steps": [...]}``: save the state of each step (values from
  ``_mt_values``) with this process's own JSON state (:func:`process_state`); reports which
  steps any tier saved;
* ``{"do": "restore", "step": null}``: restore (the newest step by default) onto the mesh and
  compare every addressable shard with the expected values bit for bit; reports the source
  and the JSON state restored;
* ``{"do": "orbax"}`` (single process): Orbax's plain ``CheckpointManager`` restores the
  persistent tier onto an 8-device mesh;
* ``{"do": "orbax_emergency_save", "steps": [...]}``: Orbax's own emergency
  ``CheckpointManager`` saves the steps (local on replica 1, persistent on replica 0);
  ``{"do": "orbax_emergency_restore"}``: it restores the latest step;
* ``{"do": "face", "steps": [...]}``: ``ocdbt_py.orbax.emergency.CheckpointManager`` saves
  the steps with Orbax's ``args`` (the state and a per-process ``dataset`` JSON item), then
  restores the latest step with its ``dataset``.

Prints one JSON line with the results.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

JOB = json.loads(Path(sys.argv[1]).read_text())
PID, PORT = int(sys.argv[2]), int(sys.argv[3])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={JOB['devices']}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if JOB["processes"] > 1:
    jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=JOB["processes"], process_id=PID)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mt_values import nest, values, walk  # noqa: E402

from ocdbt_py.checkpoint.manager import FixedInterval, LatestN, MultiTierCheckpointManager  # noqa: E402

warnings.filterwarnings("ignore")


def mesh() -> Mesh:
    devices = np.array(jax.devices())
    replicas = JOB.get("replicas", 2)
    if JOB.get("swap_replicas"):  # same devices, replicas in the other order
        devices = devices.reshape(replicas, -1)[::-1].reshape(-1)
    return Mesh(devices.reshape(replicas, -1), ("replica", "model"))


def abstract(m: Mesh) -> dict[str, Any]:
    flat = {}
    for path, shape, dtype, spec in walk():
        dt = jax.numpy.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        flat[path] = jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(m, P(*spec)))
    return nest(flat)


def state(m: Mesh, step: int) -> dict[str, Any]:
    vals = values(step)
    flat = {}
    for path, shape, _, spec in walk():
        flat[path] = jax.make_array_from_callback(shape, NamedSharding(m, P(*spec)), vals[path].__getitem__)
    return nest(flat)


def compare(tree: dict[str, Any], target: dict[str, Any], step: int) -> list[str]:
    """Every addressable shard against the expected values, bit for bit."""
    vals = values(step)
    errs = []
    got = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    want = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
    if sorted(got) != sorted(want):
        return [f"leaves {sorted(got)} != {sorted(want)}"]
    for path, _, _, _ in walk():
        key = "".join(f"['{p}']" for p in path.split("."))
        arr, t = got[key], want[key]
        if not isinstance(arr, jax.Array) or arr.sharding != t.sharding or arr.dtype != t.dtype:
            errs.append(f"{path}: {type(arr).__name__} {getattr(arr, 'sharding', None)} {getattr(arr, 'dtype', None)}")
            continue
        for sh in arr.addressable_shards:
            a = np.ascontiguousarray(np.asarray(sh.data))
            b = np.ascontiguousarray(vals[path][sh.index])
            if a.shape != b.shape or a.tobytes() != b.tobytes():
                errs.append(f"{path}: shard {sh.index} on device {sh.device.id} differs")
    return errs


def process_state(step: int) -> dict[str, Any]:
    """This process's non-tensor state at ``step`` (a data iterator's position)."""
    return {"process": PID, "position": step * 1000 + PID, "shard": f"part-{PID}-of-{JOB['processes']}"}


def compare_values(tree: dict[str, Any], step: int) -> list[str]:
    """Every addressable shard against the expected values, as numbers: Orbax's emergency
    restore copies across replicas with a sum, which turns ``-0.0`` into ``0.0``, NaN payloads
    into the plain NaN and bools into int32, even for the steps it wrote itself."""
    vals = values(step)
    got = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    errs = []
    for path, _, _, _ in walk():
        arr = got.get("".join(f"['{p}']" for p in path.split(".")))
        if arr is None:
            errs.append(f"{path}: missing")
            continue
        for sh in arr.addressable_shards:
            want = np.asarray(vals[path][sh.index])
            kind = np.complex128 if want.dtype.kind == "c" else np.float64
            if not np.array_equal(np.asarray(sh.data).astype(kind), want.astype(kind), equal_nan=True):
                errs.append(f"{path}: shard {sh.index} on device {sh.device.id} differs")
    return errs


def manager(m: Mesh) -> MultiTierCheckpointManager:
    return MultiTierCheckpointManager(
        JOB["local"], JOB["persistent"], global_mesh=m, abstract_state=abstract(m),
        local_policy=FixedInterval(JOB.get("local_every", 1)), local_preservation=LatestN(JOB.get("local_keep", 3)),
        persistent_policy=FixedInterval(JOB.get("persistent_every", 2)),
        persistent_preservation=LatestN(JOB["persistent_keep"]) if JOB.get("persistent_keep") else None,
        async_save=JOB.get("async", True), coordination_timeout_secs=JOB.get("timeout", 60))


def orbax_restore() -> dict[str, Any]:
    import orbax.checkpoint as ocp

    m = Mesh(np.array(jax.devices()).reshape(2, -1), ("replica", "model"))
    target = abstract(m)
    mgr = ocp.CheckpointManager(JOB["persistent"])
    steps = [int(s) for s in mgr.all_steps()]
    step = max(steps)
    rargs = ocp.checkpoint_utils.construct_restore_args(target)
    # a single-item (``default``) manager, as Orbax's emergency manager keeps its persistent tier
    got = mgr.restore(step, args=ocp.args.PyTreeRestore(item=target, restore_args=rargs))
    return {"steps": steps, "step": step, "errors": compare(got, target, step)}


def orbax_emergency_save(m: Mesh, steps: list[int]) -> dict[str, Any]:
    from orbax.checkpoint import args as ocp_args
    from orbax.checkpoint._src.multihost import multihost
    from orbax.checkpoint.experimental.emergency import checkpoint_manager as em

    multihost.initialize_runtime_to_distributed_ids()  # as Orbax's emergency tests do
    multihost.initialize_distributed_to_device_ids()
    local = JOB["local"].replace("{process_index}", str(PID))
    os.makedirs(local, exist_ok=True)
    os.makedirs(JOB["persistent"], exist_ok=True)
    mgr = em.CheckpointManager(local, JOB["persistent"], m, abstract(m), options=_emergency_options(em))
    saved = [s for s in steps if mgr.save(s, args=ocp_args.Composite(state=ocp_args.PyTreeSave(state(m, s))))]
    mgr.wait_until_finished()
    out = {"saved": saved, "all_steps": sorted(int(s) for s in mgr.all_steps())}
    mgr.close()
    return out


def _emergency_options(em: Any) -> Any:
    return em.CheckpointManagerOptions(
        local=em.LocalCheckpointOptions(save_interval_steps=JOB.get("local_every", 1),
                                        max_to_keep=JOB.get("local_keep", 3)),
        persistent=em.PersistentCheckpointOptions(save_interval_steps=JOB.get("persistent_every", 2)))


def orbax_emergency_restore(m: Mesh) -> dict[str, Any]:
    from absl import flags
    from orbax.checkpoint._src.multihost import multihost
    from orbax.checkpoint.experimental.emergency import checkpoint_manager as em

    if not flags.FLAGS.is_parsed():  # Orbax's local restore reads an absl flag
        flags.FLAGS.mark_as_parsed()
    multihost.initialize_runtime_to_distributed_ids()
    multihost.initialize_distributed_to_device_ids()
    local = JOB["local"].replace("{process_index}", str(PID))
    mgr = em.CheckpointManager(local, JOB["persistent"], m, abstract(m), options=_emergency_options(em))
    step = mgr.latest_step()
    got = mgr.restore(step)
    out = {"step": step, "all_steps": sorted(int(s) for s in mgr.all_steps()),
           "errors": compare_values(got.state, step)}
    mgr.close()
    return out


def face(m: Mesh, steps: list[int]) -> dict[str, Any]:
    from orbax.checkpoint import args as ocp_args

    from ocdbt_py.orbax import emergency as em

    mgr = em.CheckpointManager(JOB["local"], JOB["persistent"], m, abstract(m), options=_emergency_options(em))
    saved = [s for s in steps if mgr.save(s, args=ocp_args.Composite(
        state=ocp_args.PyTreeSave(state(m, s)), dataset=ocp_args.JsonSave(process_state(s))))]
    mgr.wait_until_finished()
    got = mgr.restore(None, args=ocp_args.Composite(dataset=ocp_args.JsonRestore()))
    info = mgr.multitier.last_restore
    assert info is not None
    out = {"saved": saved, "all_steps": list(mgr.all_steps()), "step": info.step, "source": info.source,
           "errors": compare(got.state, abstract(m), info.step), "dataset": got["dataset"],
           "in_primary_slice": mgr.in_primary_slice}
    mgr.close()
    return out


def main() -> dict[str, Any]:
    out: dict[str, Any] = {"process": PID, "actions": []}
    if JOB["actions"] and JOB["actions"][0]["do"] == "orbax":
        out["actions"].append(orbax_restore())
        return out
    first = JOB["actions"][0] if JOB["actions"] else {}
    if first.get("do") == "orbax_emergency_save":
        out["actions"].append(orbax_emergency_save(mesh(), first["steps"]))
        return out
    if first.get("do") == "orbax_emergency_restore":
        out["actions"].append(orbax_emergency_restore(mesh()))
        return out
    if first.get("do") == "face":
        out["actions"].append(face(mesh(), first["steps"]))
        return out
    m = mesh()
    with manager(m) as mgr:
        out["replica"] = mgr.replica
        out["initial_steps"] = mgr.all_steps()
        for act in JOB["actions"]:
            t0 = time.perf_counter()
            if act["do"] == "save":
                saved = [s for s in act["steps"] if mgr.save(s, state(m, s), metrics={"loss": float(s)},
                                                             process_state=process_state(s))]
                mgr.wait_until_finished()
                res: dict[str, Any] = {"saved": saved}
            elif act["do"] == "restore":
                target = abstract(m)
                try:
                    tree, doc = mgr.restore(act.get("step"), target, with_process_state=True)
                except Exception as e:  # noqa: BLE001 - reported to the test
                    res = {"error": f"{type(e).__name__}: {e}"}
                else:
                    info = mgr.last_restore
                    assert info is not None
                    res = {"step": info.step, "source": info.source, "replica": info.replica,
                           "notes": list(info.notes), "errors": compare(tree, target, info.step),
                           "process_state": doc}
            else:
                raise ValueError(act)
            res["seconds"] = time.perf_counter() - t0
            out["actions"].append(res)
        out["local_steps"] = mgr.local_steps()
        out["persistent_steps"] = mgr.persistent_steps()
        out["all_steps"] = mgr.all_steps()
    return out


if __name__ == "__main__":
    try:
        result = main()
    except Exception:  # noqa: BLE001
        result = {"process": PID, "crash": traceback.format_exc()}
    print(json.dumps(result), flush=True)
    if JOB["processes"] > 1:
        jax.distributed.shutdown()
