"""One of N ``jax.distributed`` processes saving a sharded tree to an object-store URL.

Usage: python _mp_save_worker.py URLS_JSON NUM_PROCESSES PROCESS_ID PORT DEVICES_PER_PROCESS.
The same tree is saved to every URL in turn.  Endpoints and credentials come only from the
services' environment variables.
"""

from __future__ import annotations

import json
import os
import sys

URLS = json.loads(sys.argv[1])
N, PID, PORT, DPP = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DPP}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=N, process_id=PID)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ocdbt_py.checkpoint import save  # noqa: E402
from tests.objectstores.mp_values import SPECS, global_values  # noqa: E402


def main() -> dict:
    devices = np.array(jax.devices())
    mesh = Mesh(devices.reshape(len(devices) // 2, 2), ("data", "model"))
    vals = global_values()
    tree: dict = {}
    for name, spec in SPECS.items():
        v = vals[name]
        tree[name] = jax.make_array_from_callback(v.shape, NamedSharding(mesh, P(*spec)), lambda idx, v=v: v[idx])
    tree["step"] = 3
    for url in URLS:
        save(url, tree)
    return {"process": PID, "ok": True}


if __name__ == "__main__":
    print(json.dumps(main()))
    jax.distributed.shutdown()
