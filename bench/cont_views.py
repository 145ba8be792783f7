"""Host copy vs holding zero-copy views of CPU ``jax.Array`` shards (issue 20, continuous).

For the bench_manager JAX model (304 MiB, 8 CPU devices), interleaved rounds of:

* ``copy``: what ``save()`` does today, a host copy of every shard into the kept buffer,
  then the step's donated update (``x.at[0].add``), which reuses the donated buffers;
* ``views``: hold ``np.asarray(shard.data)`` views instead (no copy in ``save()``); the
  donated update cannot reuse a buffer with a live view, so XLA writes new buffers (a full
  copy inside the update, into freshly allocated memory, and the dispatch itself waits for
  it); the views are then dropped (as a background save would after encoding) and the next
  update donates again.

Reported: wall and process CPU per round of (copy or views) + update, best and median.

    flock /work/m20/bench.lock python bench/cont_views.py --repeat 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402
from bench_manager import _leaves, build_params, make_update, model_shapes  # noqa: E402

from ocdbt_py.checkpoint.saving import host_copy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    import jax

    params = build_params(model_shapes(1024, 5, 16384), "jax")
    upd = make_update("jax")
    params = upd(params, 0)
    jax.block_until_ready(params)

    def shards(p: Any) -> list[np.ndarray]:
        return [np.asarray(s.data) for x in _leaves(p) for s in x.addressable_shards if s.replica_id == 0]

    def copy_round(p: Any) -> tuple[Any, float, float]:
        t0 = time.perf_counter()
        views = shards(p)
        _, arena = host_copy.copy_arrays(views, 4, reuse=True)
        del views
        t1 = time.perf_counter()
        p = upd(p, 0)
        dispatch["copy"].append(time.perf_counter() - t1)
        jax.block_until_ready(p)
        host_copy.keep_arena(arena)
        return p, t1 - t0, time.perf_counter() - t1

    dispatch: dict[str, list[float]] = {"copy": [], "views": []}

    def views_round(p: Any) -> tuple[Any, float, float]:
        t0 = time.perf_counter()
        views = shards(p)
        t1 = time.perf_counter()
        p = upd(p, 0)
        dispatch["views"].append(time.perf_counter() - t1)  # the training thread's share
        jax.block_until_ready(p)
        t2 = time.perf_counter()
        del views  # the background save is done with them
        return p, t1 - t0, t2 - t1

    rounds = {"copy": copy_round, "views": views_round}
    res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in rounds}
    for _ in range(2):
        for fn in rounds.values():
            params, _, _ = fn(params)
    load0 = os.getloadavg()[0]
    for _ in range(args.repeat):
        for k, fn in rounds.items():
            c0 = time.process_time()
            params, a, b = fn(params)
            # a plain step after (donation works again): the steady state in between saves
            params = upd(params, 0)
            jax.block_until_ready(params)
            res[k].append((a, b, time.process_time() - c0))
    t0 = time.perf_counter()
    for _ in range(args.repeat):
        params = upd(params, 0)
        jax.block_until_ready(params)
    plain = (time.perf_counter() - t0) / args.repeat
    print(f"jax {jax.__version__}; load {load0:.2f} -> {os.getloadavg()[0]:.2f}; plain donated update "
          f"{1000 * plain:.1f} ms (mean of {args.repeat})")
    print("| round | save() part ms (best · median) | update ms (best · median) | of which dispatch (median) "
          "| sum best · median | CPU ms median |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, rs in res.items():
        a = sorted(r[0] for r in rs)
        b = sorted(r[1] for r in rs)
        s = sorted(r[0] + r[1] for r in rs)
        print(f"| {k} | {1000 * a[0]:.1f} · {1000 * statistics.median(a):.1f} | {1000 * b[0]:.1f} · "
              f"{1000 * statistics.median(b):.1f} | {1000 * statistics.median(dispatch[k]):.1f} | "
              f"{1000 * s[0]:.1f} · {1000 * statistics.median(s):.1f} | "
              f"{1000 * statistics.median(r[2] for r in rs):.1f} |")


if __name__ == "__main__":
    main()
