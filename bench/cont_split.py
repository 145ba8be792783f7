"""Where ``CheckpointManager.save()`` blocks under ``Continuous()`` (issue 20).

The bench_manager loop (304 MiB model, ``--step-time`` sleep step, NumPy or 8-device JAX)
in one process, with the parts of ``save()`` timed by wrapping them: waiting for the
previous save, planning, the host copy, opening the destination, starting the thread, and
the whole ``ocdbt_py.checkpoint.save`` call (the manager's own bookkeeping is the rest).

    flock /work/m20/bench.lock python bench/cont_split.py numpy 150
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from bench_manager import _block, build_params, make_update, model_shapes  # noqa: E402

from ocdbt_py.checkpoint.manager import CheckpointManager, Continuous, LatestN  # noqa: E402
from ocdbt_py.checkpoint.manager import manager as manager_mod  # noqa: E402
from ocdbt_py.checkpoint.saving import api, async_save  # noqa: E402

T: dict[str, list[float]] = {}


def _wrap(mod: Any, name: str, label: str) -> None:
    f = getattr(mod, name)

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T.setdefault(label, []).append(time.perf_counter() - t)

    setattr(mod, name, timed)


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "numpy"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    step_time = 0.1
    _wrap(async_save, "wait_for_previous", "wait for previous")
    _wrap(api, "_make_plans", "plan")
    _wrap(api, "_copy_shared", "host copy")
    _wrap(api, "open_destination", "destination")
    _wrap(async_save, "start", "start thread")
    _wrap(manager_mod, "save", "ocdbt_py.checkpoint.save (all)")
    params = build_params(model_shapes(1024, 5, 16384), kind)
    upd = make_update(kind)
    params = upd(params, 0)
    _block(params, kind)
    tmp = tempfile.mkdtemp(prefix="cont_split_")
    mgr = CheckpointManager(os.path.join(tmp, "c"), save_policy=Continuous(), preservation=LatestN(2))
    blocked: list[float] = []
    load0 = os.getloadavg()[0]
    try:
        for s in range(steps):
            t0 = time.perf_counter()
            params = upd(params, s)
            time.sleep(max(0.0, step_time - (time.perf_counter() - t0)))
            _block(params, kind)
            b0 = time.perf_counter()
            started = mgr.save(s, {"state": params})
            if s == 10:
                T.clear()
            elif started and s > 10:
                blocked.append(time.perf_counter() - b0)
        mgr.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{kind}: {len(blocked)} saves in {steps - 11} steps; load {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    print("| part | P50 ms | P90 ms | max ms | mean ms |")
    print("|---|---:|---:|---:|---:|")
    T["manager.save() blocked"] = blocked
    for k, v in sorted(T.items(), key=lambda kv: -statistics.fmean(kv[1])):
        o = sorted(v)
        print(f"| {k} | {1000 * statistics.median(o):.1f} | {1000 * o[int(0.9 * (len(o) - 1))]:.1f} | "
              f"{1000 * o[-1]:.1f} | {1000 * statistics.fmean(o):.1f} |")


if __name__ == "__main__":
    main()
