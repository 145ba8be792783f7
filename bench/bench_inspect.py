"""``ocdbt stats`` / ``diff`` speed and memory against our own restore of the same checkpoint.

Usage::

    python bench/bench_inspect.py [--dir /tmp/bench_inspect] [--size-mib 1024] [--repeat 1] [--json out.json]

Writes (once, with ``ocdbt_py.checkpoint.save``) a checkpoint of ``--size-mib`` MiB in 8 float32
arrays (one chunk each, or chunks of ``--chunk-mib``) and an identical second copy, then times, each in
a fresh subprocess (its own peak RSS)
after reading the files once so all find them in the page cache, best of ``--repeat``:
(peak RSS is the worker's ``VmHWM``, which includes the interpreter and imports, ~40 MiB)

* ``restore``: ``checkpoint.restore`` to NumPy (the reference);
* ``stats``: :func:`ocdbt_py.inspect.stats` (every chunk decoded and reduced);
* ``diff``: :func:`ocdbt_py.inspect.diff` of the two identical copies (chunk bytes compared,
  nothing decoded).

Targets from the issue: stats throughput >= 0.8x restore's; diff of identical copies <= 0.3x
restore's time; peak RSS a few chunks per worker (far below the checkpoint's size).  The
machine's load average is printed with the figures: quote ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

from common import call_worker, warm_page_cache  # bench/common.py (bench/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _worker(kind: str, a: str, b: str) -> None:
    import numpy as np

    from ocdbt_py import checkpoint
    from ocdbt_py.inspect import diff, stats

    t = time.perf_counter()
    if kind == "restore":
        tree = checkpoint.restore(a)
        n = sum(np.asarray(v).nbytes for v in tree.values())
    elif kind == "stats":
        s = stats(a)
        n = sum(x.size * 4 for x in s.values())
    elif kind == "diff":
        r = diff(a, b)
        assert r.equal, r.changed
        n = 0
    else:
        raise SystemExit(f"unknown kind {kind}")
    dt = time.perf_counter() - t
    rss = _peak_rss()
    print(json.dumps({"seconds": dt, "peak_rss": rss, "bytes": n}))


def _peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` (reset by exec, unlike ``ru_maxrss``, which a
    child inherits from the parent it was forked from)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _make(d: Path, size_mib: int, chunk_mib: int | None) -> tuple[Path, Path]:
    a, b = d / "a", d / "b"
    if (a / "_CHECKPOINT_METADATA").exists() and (b / "_CHECKPOINT_METADATA").exists():
        return a, b
    import numpy as np

    from ocdbt_py import checkpoint

    rng = np.random.default_rng(0)
    per = size_mib * MIB // 8 // 4
    cols = 1024
    tree = {f"w{i}": rng.standard_normal((per // cols, cols), dtype=np.float32) for i in range(8)}
    chunk = None if chunk_mib is None else chunk_mib * MIB
    checkpoint.save(a, tree, force=True, chunk_byte_size=chunk)
    checkpoint.save(b, tree, force=True, chunk_byte_size=chunk)
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/bench_inspect")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--chunk-mib", type=int, default=None, help="chunk size (default: one chunk per array)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    d = Path(args.dir) / (f"{args.size_mib}mib" + (f"-c{args.chunk_mib}" if args.chunk_mib else ""))
    d.mkdir(parents=True, exist_ok=True)
    a, b = _make(d, args.size_mib, args.chunk_mib)
    warm_page_cache(a)
    warm_page_cache(b)
    best: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeat):
        for kind in ("restore", "stats", "diff"):
            r = call_worker(__file__, [kind, str(a), str(b)])
            if kind not in best or r["seconds"] < best[kind]["seconds"]:
                best[kind] = r
    rs, st, df = best["restore"], best["stats"], best["diff"]
    out = {
        "size_mib": args.size_mib, "chunk_mib": args.chunk_mib, "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
        "restore_s": rs["seconds"], "stats_s": st["seconds"], "diff_s": df["seconds"],
        "stats_throughput_vs_restore": rs["seconds"] / st["seconds"],
        "diff_time_vs_restore": df["seconds"] / rs["seconds"],
        "peak_rss_mib": {k: v["peak_rss"] / MIB for k, v in best.items()},
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
