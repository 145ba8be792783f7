"""One of 2 ``jax.distributed`` processes running a training loop with a CheckpointManager.

Usage: python _mp_manager_worker.py ROOT PROCESS_ID PORT.  The loop saves sharded
``jax.Array`` state with ``Continuous`` (clock- and timing-dependent: process 0 decides and
shares) and retention ``LatestN(2)``; it prints the decisions and what it restores.
"""

from __future__ import annotations

import os
import sys

PID, PORT = int(sys.argv[2]), int(sys.argv[3])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=2, process_id=PID)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ocdbt_py.checkpoint import JsonItem  # noqa: E402
from ocdbt_py.checkpoint.manager import CheckpointManager, Continuous, LatestN  # noqa: E402


def state(step: int, sharding: NamedSharding) -> dict:
    full = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) + step
    return {"w": jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])}


def main() -> dict:
    root = sys.argv[1]
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    mgr = CheckpointManager(root, save_policy=Continuous(), preservation=LatestN(2))
    decisions = []
    for step in range(12):
        # process 1 is slower, so the processes' own views of "a save is in flight" differ
        time.sleep(0.02 if PID == 0 else 0.05)
        decisions.append(mgr.save(step, {"state": state(step, sharding), "cfg": JsonItem({"step": step})}))
    mgr.wait_until_finished()
    steps = mgr.all_steps()
    latest = mgr.latest_step()
    abstract = {"w": jax.ShapeDtypeStruct((64, 8), np.float32, sharding=sharding)}
    got = mgr.restore(latest, "state", abstract)
    local = [np.asarray(s.data).tolist() for s in got["w"].addressable_shards]
    expect = [(np.arange(64 * 8, dtype=np.float32).reshape(64, 8) + latest)[s.index].tolist()
              for s in got["w"].addressable_shards]
    mgr.close()
    return {"pid": PID, "decisions": decisions, "steps": steps, "latest": latest, "restored_ok": local == expect,
            "sharded": isinstance(got["w"], jax.Array) and len(got["w"].addressable_shards) == 2}


if __name__ == "__main__":
    try:
        res = main()
    except BaseException as e:  # noqa: BLE001
        res = {"pid": PID, "error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(res), flush=True)
    jax.distributed.shutdown()
