"""Cost of ``checkpoint.save(checksum=True)``: best-of-N interleaved A/B of save time.

Usage: ``python bench/bench_checksum.py [--mib 256] [--rounds 7] [--zarr3] [--dir /tmp/x]``.
Each round saves the same tree once without and once with checksums (alternating which goes
first), to a fresh directory, ``sync=False`` off (fsync on, as a real save).  Prints the best
and median time of each and the ratio of the bests, with the 1-minute load average before and
after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ocdbt_py import checkpoint  # noqa: E402


def tree(mib: int) -> dict[str, np.ndarray]:
    """Checkpoint-like data: float32/bfloat16-ish weights (partly compressible) in a few arrays."""
    rng = np.random.default_rng(0)
    n = (mib << 20) // 4 // 8
    out = {}
    for i in range(8):
        w = rng.standard_normal(n).astype(np.float32)
        w[: n // 3] = np.round(w[: n // 3], 1)  # some structure, like trained weights
        out[f"layer{i}/kernel"] = w.reshape(-1, 1024)
    return out


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(t: dict[str, np.ndarray], where: Path, checksum: bool, zarr3: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds of all threads) of one save."""
    if where.exists():
        shutil.rmtree(where)
    t0, c0 = time.perf_counter(), _cpu()
    checkpoint.save(where, t, use_zarr3=zarr3, checksum=checksum)
    dt, dc = time.perf_counter() - t0, _cpu() - c0
    shutil.rmtree(where)
    return dt, dc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--zarr3", action="store_true")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    t = tree(a.mib)
    base = Path(a.dir or tempfile.mkdtemp(prefix="ckbench"))
    load0 = os.getloadavg()[0]
    one(t, base / "warm", False, a.zarr3)
    wall: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for c in order:
            w, u = one(t, base / f"ck{int(c)}", c, a.zarr3)
            wall[c].append(w)
            cpu[c].append(u)
    load1 = os.getloadavg()[0]
    print(f"{a.mib} MiB, zarr{'3' if a.zarr3 else '2'}, {a.rounds} rounds, load {load0:.1f} -> {load1:.1f}")
    for name, d in (("wall", wall), ("cpu", cpu)):
        b0, b1 = min(d[False]), min(d[True])
        m0, m1 = statistics.median(d[False]), statistics.median(d[True])
        print(f"  {name}: without best {b0:.3f} s / median {m0:.3f} s; with best {b1:.3f} s / median "
              f"{m1:.3f} s; ratio of bests {b1 / b0:.3f}, of medians {m1 / m0:.3f}")


if __name__ == "__main__":
    main()
