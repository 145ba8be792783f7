"""A training loop that receives SIGTERM at step 7 and saves there (run by test_preemption)."""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

from ocdbt_py.checkpoint.manager import CheckpointManager, FixedInterval, Preemption, SaveAnyOf


def main(root: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    mgr = CheckpointManager(root, save_policy=SaveAnyOf(FixedInterval(100), Preemption()))
    saved, stopped = [], None
    for step in range(1, 30):
        if step == 7:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's notice, mid-step
        if mgr.save(step, {"default": {"w": np.full(4, step, np.float32)}}):
            saved.append(step)
        if mgr.reached_preemption(step):
            stopped = step
            break
    mgr.close()
    restored = signal.getsignal(signal.SIGTERM) == before
    print(json.dumps({"saved": saved, "stopped": stopped, "steps": CheckpointManager(root).all_steps(),
                      "handler_restored": restored}))


if __name__ == "__main__":
    main(sys.argv[1])
