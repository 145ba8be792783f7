"""The floor of continuous checkpointing's per-save cost: copying the bench_manager model.

Measures, in one process and interleaved (best and median of ``--repeat`` rounds, per-call
wall and process CPU time, load average recorded):

* ``memcpy 1/2 threads``: one 304 MiB ``np.copyto`` between two warm buffers (one thread, or
  split in halves over two threads): the machine's memory bandwidth, the least any
  checkpointer that snapshots mutable state pays per save;
* ``copy_arrays w=N``: ``host_copy.copy_arrays`` of the model's 53 arrays into the kept
  buffer with N copy threads (what ``save()`` blocks on);
* ``copy_arrays w=2, 4 KiB-page sources``: the same from copies of the arrays placed on
  ordinary pages (a caller's arrays often are; XLA's CPU buffers always are), against
  ``..., huge-page sources`` (the floor's own buffers are huge-page advised);
* ``save() blocked``: ``save(..., blocking=False)`` of the model (the handle's
  ``blocking_seconds``; the save is waited for outside the timing), NumPy and, with
  ``--jax``, the 8-device ``jax.Array`` tree.

    flock /work/m20/bench.lock python bench/cont_floor.py --repeat 15 [--jax] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from bench_manager import _leaves, build_params, model_shapes  # noqa: E402

from ocdbt_py.checkpoint.saving import host_copy  # noqa: E402


def _memcpy(dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    if threads == 1:
        np.copyto(dst, src)
        return
    step = -(-src.size // threads)
    ts = [threading.Thread(target=np.copyto, args=(dst[i:i + step], src[i:i + step]))
          for i in range(step, src.size, step)]
    for t in ts:
        t.start()
    np.copyto(dst[:step], src[:step])
    for t in ts:
        t.join()


def _placed(arrays: list[np.ndarray], huge: bool) -> list[np.ndarray]:
    """Copies of ``arrays`` in one mapping advised for huge pages or against them."""
    total = sum(-(-a.nbytes // 4096) * 4096 for a in arrays)
    m = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        m.madvise(advice)
    buf = np.frombuffer(m, dtype=np.uint8)
    out, off = [], 0
    for a in arrays:
        dst = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
        dst[...] = a
        out.append(dst)
        off += -(-a.nbytes // 4096) * 4096
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--jax", action="store_true")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--json", default=None, help="also write best/median wall ms per case to this file")
    args = ap.parse_args()
    shapes = model_shapes(1024, 5, 16384)
    params = build_params(shapes, "numpy")
    arrays = _leaves(params)
    nbytes = sum(a.nbytes for a in arrays)
    src = host_copy._arena(nbytes)
    dst = host_copy._arena(nbytes)
    src[:] = 1
    dst[:] = 2
    cases: dict[str, Callable[[], Any]] = {
        "memcpy 1 thread": lambda: _memcpy(dst, src, 1),
        "memcpy 2 threads": lambda: _memcpy(dst, src, 2),
    }
    for w in (1, 2, 4):
        def cp(w: int = w, arrays: list[np.ndarray] = arrays) -> None:
            _, arena = host_copy.copy_arrays(arrays, w, reuse=True)
            host_copy.keep_arena(arena)
        cases[f"copy_arrays w={w}"] = cp
    for label, huge in (("4 KiB-page", False), ("huge-page", True)):
        placed = _placed(arrays, huge)

        def cp_placed(placed: list[np.ndarray] = placed) -> None:
            _, arena = host_copy.copy_arrays(placed, 2, reuse=True)
            host_copy.keep_arena(arena)
        cases[f"copy_arrays w=2, {label} sources"] = cp_placed
    tmp = tempfile.mkdtemp(prefix="cont_floor_")
    if not args.no_save:
        from ocdbt_py.checkpoint import save

        trees = {"save() numpy": params}
        if args.jax:
            trees["save() jax"] = build_params(shapes, "jax")
        counter = [0]

        for label, tree in trees.items():
            def sv(tree: Any = tree) -> float:
                counter[0] += 1
                h = save(os.path.join(tmp, str(counter[0])), {"state": tree}, composite=True, blocking=False)
                b = h.blocking_seconds
                h.wait()
                return b
            cases[label] = sv
    for fn in cases.values():  # warm: buffers mapped, pools started
        fn()
        fn()
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    load0 = os.getloadavg()[0]
    for _ in range(args.repeat):
        for k, fn in cases.items():
            c0 = time.process_time()
            t0 = time.perf_counter()
            r = fn()
            t = time.perf_counter() - t0
            wall[k].append(r if isinstance(r, float) else t)
            cpu[k].append(time.process_time() - c0)
    load1 = os.getloadavg()[0]
    print(f"{nbytes / 2**20:.0f} MiB in {len(arrays)} arrays; {args.repeat} interleaved rounds; "
          f"load {load0:.2f} -> {load1:.2f}")
    print("| what | wall best · median ms | GB/s (best) | CPU median ms |")
    print("|---|---:|---:|---:|")
    for k in cases:
        w = sorted(wall[k])
        note = " (blocked)" if k.startswith("save()") else ""
        print(f"| {k}{note} | {1000 * w[0]:.1f} · {1000 * statistics.median(w):.1f} | "
              f"{nbytes / w[0] / 1e9:.1f} | {1000 * statistics.median(cpu[k]):.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "nbytes": nbytes, "arrays": len(arrays), "load": [load0, load1],
            "cases": {k: {"best_ms": 1000 * min(v), "median_ms": 1000 * statistics.median(v)}
                      for k, v in wall.items()}}, indent=1))


if __name__ == "__main__":
    main()
