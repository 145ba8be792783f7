"""One of 2 ``jax.distributed`` processes in a loop with a ``Preemption`` save policy; process 1
receives SIGTERM at step 20.  Usage: python _mp_preempt_worker.py ROOT PROCESS_ID PORT."""

from __future__ import annotations

import os
import sys

ROOT, PID, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=2, process_id=PID)

import numpy as np  # noqa: E402

from ocdbt_py.checkpoint.manager import CheckpointManager, FixedInterval, Preemption, SaveAnyOf  # noqa: E402


def main() -> dict:
    mgr = CheckpointManager(ROOT, save_policy=SaveAnyOf(FixedInterval(1000), Preemption()))
    saved, stop = [], None
    for step in range(1, 400):
        if PID == 1 and step == 20:
            os.kill(os.getpid(), signal.SIGTERM)  # only this process hears the notice
        time.sleep(0.01)
        if mgr.save(step, {"default": {"w": np.full(4, step, np.float32)}}):
            saved.append(step)
        if mgr.reached_preemption(step):
            stop = step
            break
    mgr.close()
    return {"pid": PID, "saved": saved, "stop": stop}


if __name__ == "__main__":
    try:
        res = main()
    except BaseException as e:  # noqa: BLE001
        res = {"pid": PID, "error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(res), flush=True)
    jax.distributed.shutdown()
