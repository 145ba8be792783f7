"""One of N ``jax.distributed`` processes saving a sharded tree with ``ocdbt_py.checkpoint.save``.

Usage: python _mp_save_worker.py OUT_DIR NUM_PROCESSES PROCESS_ID PORT DEVICES_PER_PROCESS.
Every process builds the same global arrays (values from ``global_values()``) over all
devices and calls ``save`` five times: Zarr v2 (sync), Zarr v3 (async, composite with a
JSON item), Zarr v2 with small chunks, and the per-parameter layout (``use_ocdbt=False``,
Zarr v2 and v3); then ``ocdbt_py.orbax``'s ``Checkpointer`` and ``AsyncCheckpointer`` save it
too.  Process 0 commits; all print a JSON result line.
"""

from __future__ import annotations

import os
import sys

N, PID, PORT, DPP = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DPP}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=N, process_id=PID)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mp_values import SPECS, global_values  # noqa: E402

import ocdbt_py.orbax as ocp  # noqa: E402
from ocdbt_py.checkpoint import JsonItem, save  # noqa: E402


def build_tree() -> dict:
    devices = np.array(jax.devices())
    mesh = Mesh(devices.reshape(len(devices) // 2, 2), ("data", "model"))
    vals = global_values()
    tree: dict = {}
    for name, spec in SPECS.items():
        sharding = NamedSharding(mesh, P(*spec))
        v = vals[name]
        tree[name] = jax.make_array_from_callback(v.shape, sharding, lambda idx, v=v: v[idx])
    tree["np_leaf"] = vals["np_leaf"]
    tree["step"] = 7
    tree["note"] = "multi"
    return tree


def main() -> dict:
    out = Path(sys.argv[1])
    tree = build_tree()
    save(out / "zarr2", tree)
    h = save(out / "steps" / "1", {"state": tree, "meta": JsonItem({"n": N})}, composite=True,
             use_zarr3=True, blocking=False)
    h.wait()
    save(out / "chunked", tree, chunk_byte_size=256, ocdbt_target_data_file_size=2048)
    save(out / "perparam", tree, use_ocdbt=False)
    save(out / "perparam3", tree, use_ocdbt=False, use_zarr3=True, chunk_byte_size=256)
    # ocdbt_py.orbax's checkpointers: the primary creates and finalizes the temporary path, and
    # every process returns only once the checkpoint is there
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        ckptr.save(out / "ocp_sync", args=ocp.args.PyTreeSave(tree))
        sync_seen = (out / "ocp_sync").is_dir()
    with ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        ckptr.save(out / "ocp_async", args=ocp.args.PyTreeSave(tree))
        ckptr.wait_until_finished()
        async_seen = (out / "ocp_async").is_dir()
    mine = sorted(p.name for p in (out / "zarr2").iterdir())
    # a failure on one process (the destination exists) fails the save everywhere, promptly
    t0 = time.monotonic()
    try:
        save(out / "zarr2", tree, barrier_timeout=120)
        error = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        error = type(e).__name__
    return {"process": PID, "ok": True, "listing": mine, "exists_error": error,
            "error_seconds": time.monotonic() - t0, "checkpointers_seen": [sync_seen, async_seen]}


if __name__ == "__main__":
    res = main()
    print(json.dumps(res))
    jax.distributed.shutdown()
