"""zarr3 writes of many small chunks: the cost per chunk must stay flat as the count grows.

Writes a 1-D ``uint8`` array of N chunks of 16 bytes (``bytes`` codec only, so the figure is
per-chunk overhead, not codec work) to an in-memory store, ours (``zarr3`` on ``MemoryStore``) and TensorStore's
``zarr3`` driver on its ``memory`` kvstore, in fresh processes, best of ``--repeat``:

    python bench/bench_zarr3_chunks.py [--counts 5000,20000,80000] [--repeat 2]

Until session 7 our write kept every queued write's future and scanned them all on each
submit: 20,000 chunks took 242 s (1.66 s after the fix), so this is the regression check.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(lib: str, n: int) -> float:
    import numpy as np

    data = np.arange(n * 16, dtype=np.uint8)
    codecs = [{"name": "bytes"}]
    if lib == "ts":
        import tensorstore as ts

        t0 = time.perf_counter()
        arr = ts.open({"driver": "zarr3", "kvstore": "memory://",
                       "metadata": {"shape": [n * 16], "data_type": "uint8",
                                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16]}},
                                    "codecs": codecs}}, create=True).result()
        arr.write(data).result()
        return time.perf_counter() - t0
    sys.path.insert(0, str(REPO))
    import zarr3

    t0 = time.perf_counter()
    from ocdbt_py.kvstore import MemoryStore

    a = zarr3.create(MemoryStore(), shape=(n * 16,), dtype="uint8", chunks=(16,), codecs=codecs)
    a[...] = data
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="5000,20000,80000")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    rows = []
    for n in [int(c) for c in args.counts.split(",") if c]:
        best = {}
        for lib in ("ours", "ts"):
            times = []
            for _ in range(args.repeat):
                p = subprocess.run([sys.executable, __file__, "--child", lib, str(n)], capture_output=True,
                                   text=True, timeout=3600)
                if p.returncode != 0:
                    raise SystemExit(f"{lib} {n} failed:\n{p.stderr[-2000:]}")
                times.append(float(p.stdout.strip().splitlines()[-1]))
            best[lib] = min(times)
        rows.append({"chunks": n, "ours_s": best["ours"], "ts_s": best["ts"]})
        print(f"{n} chunks: ours {best['ours']:.2f} s ({1e6 * best['ours'] / n:.0f} us/chunk), "
              f"TensorStore {best['ts']:.2f} s ({1e6 * best['ts'] / n:.0f} us/chunk)", file=sys.stderr)
    print("| chunks | ours s | ours us/chunk | TensorStore s | TensorStore us/chunk | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['chunks']} | {r['ours_s']:.2f} | {1e6 * r['ours_s'] / r['chunks']:.0f} | {r['ts_s']:.2f} | "
              f"{1e6 * r['ts_s'] / r['chunks']:.0f} | {r['ours_s'] / r['ts_s']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
