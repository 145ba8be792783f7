"""Checkpoint restore from S3: ``ocdbt_py.checkpoint.restore`` vs TensorStore's own S3 driver
on the same local S3 server (moto), in the same run, with and without injected latency.

Usage::

    python bench/bench_objectstore.py [--dir /tmp/bench_ckpt] [--repeat 3] [--quick] [--json out.json]

Orbax writes the checkpoints once into ``--dir`` (via ``bench/bench_restore.py``'s maker):
``big`` (1 GiB in 8 float32 arrays, sharded over 8 devices) and ``medium`` (4000 arrays of
64 KiB).  They are uploaded to a moto S3 server on 127.0.0.1.  Each measurement runs in a fresh
subprocess, alternating ours and TensorStore's, best of ``--repeat``:

* ours: ``checkpoint.restore("s3://bench/<name>", storage_options=...)`` to NumPy, everything
  included (metadata reads, tree building);
* TensorStore: every array opened as ``zarr`` over ``ocdbt`` over the ``s3`` kvstore with one
  shared context and the OCDBT read-coalescing options Orbax sets for remote storage, all
  opened and read concurrently (the array names are handed to it, so TensorStore does not
  even read ``_METADATA``).

With ``--delay`` (default 0.02 s) a second pass puts a latency proxy in front of the server
(every HTTP request waits that long) and reports the requests each side made and how many of
them were in sequence (the proxy's causal depth).  Targets from the issue: ours <= 0.7x
TensorStore's time; with 20 ms latency the 4000-array restore makes <= 50 round trips in
sequence.  ``--quick`` shrinks ``big`` to 128 MiB.  Quote the ratios: the S3 server is
single-process Python and shares the machine's cores with both clients.

Runs alternate which side goes first; the table gives the ratio of the best times, the median
(and range) of the ratios of each back-to-back pair (robust to bursts of load from other jobs),
each side's client CPU time (user + system; on a loaded machine this shows the work done,
which wall time does not), and the load average over the case.  The JSON also records each
side's peak RSS over the bytes restored.

By default the server runs with ``--fast-ranges`` (``tests/objectstores/moto_main.py``): stock
moto copies the whole object for every ranged GET, serialized per object, which makes a
ranged read of a 100 MiB data file cost ~0.1 s whatever its size and so measures request
counts rather than anything real S3 does.  ``--stock-server`` benchmarks stock moto instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import upload_dir, zarr_array_names  # bench/common.py (bench/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
BUCKET = "bench"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env.update(extra or {})
    return env


def _call(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"worker {args[0]} failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- workers (fresh processes; endpoint and credentials from the AWS_* environment) -------------


def run_ours(name: str, endpoint: str) -> dict[str, Any]:
    import ml_dtypes  # noqa: F401  (imports outside the timing, as for TensorStore)
    import numpy  # noqa: F401
    import s3fs  # noqa: F401

    import ocdbt_py.checkpoint.restore.api  # noqa: F401
    import ocdbt_py.kvstore.s3  # noqa: F401
    import ocdbt_py.store  # noqa: F401
    import zarr3.array  # noqa: F401
    from ocdbt_py import checkpoint

    opts = {"endpoint_url": endpoint}
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    out = checkpoint.restore(f"s3://{BUCKET}/{name}", storage_options=opts)
    dt = time.perf_counter() - t0
    return _result(dt, r0, sum(v.nbytes for v in out.values()), len(out))


def _result(dt: float, r0: Any, nbytes: int, arrays: int) -> dict[str, Any]:
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"seconds": dt, "cpu_seconds": cpu, "bytes": nbytes, "arrays": arrays,
            "peak_rss_over_bytes": _peak_rss() / max(1, nbytes)}


def _peak_rss() -> int:
    """This process's peak RSS in bytes (``VmHWM``: ``ru_maxrss`` carries the parent's peak
    across ``exec`` on Linux, and the driver held the uploaded checkpoint)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_ts(name: str, endpoint: str, names_file: str) -> dict[str, Any]:
    import tensorstore as ts

    names = json.loads(Path(names_file).read_text())
    # the context and OCDBT options Orbax uses for remote storage (read coalescing on)
    ctx = ts.Context({"file_io_concurrency": {"limit": 128},
                      "cache_pool#ocdbt": {"total_bytes_limit": 100_000_000}})
    base = {"driver": "s3", "bucket": BUCKET, "path": f"{name}/", "endpoint": endpoint,
            "aws_region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    kv = {"driver": "ocdbt", "base": base, "cache_pool": "cache_pool#ocdbt",
          "experimental_read_coalescing_threshold_bytes": 1000000,
          "experimental_read_coalescing_merged_bytes": 500000000000,
          "experimental_read_coalescing_interval": "1ms"}
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    opens = [ts.open({"driver": "zarr", "kvstore": dict(kv, path=f"{n}/"),
                      "recheck_cached_data": False, "recheck_cached_metadata": False}, context=ctx, open=True)
             for n in names]
    arrays = [f.result() for f in opens]
    reads = [a.read() for a in arrays]
    out = [r.result() for r in reads]
    dt = time.perf_counter() - t0
    return _result(dt, r0, sum(int(a.nbytes) for a in out), len(out))


def worker(argv: list[str]) -> None:
    if argv[0] == "ours":
        res = run_ours(argv[1], argv[2])
    elif argv[0] == "ts":
        res = run_ts(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(f"unknown worker {argv[0]}")
    print(json.dumps(res))


# -- driver --------------------------------------------------------------------------------------


def _upload(srv: Any, local: Path, name: str) -> None:
    import s3fs

    upload_dir(s3fs.S3FileSystem(skip_instance_cache=True, **srv.storage_options()), local, f"{BUCKET}/{name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/bench_ckpt")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.02)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="big,medium")
    ap.add_argument("--stock-server", action="store_true",
                    help="moto as shipped: every ranged GET copies the whole object (see moto_main)")
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return

    sys.path.insert(0, str(REPO))
    from tests.objectstores import servers
    from tests.objectstores.latency_proxy import start_proxy

    # cases are written once and reused: quick and full runs keep separate directories
    root = Path(args.dir) / ("quick" if args.quick else "full")
    root.mkdir(parents=True, exist_ok=True)
    big_bytes = (128 << 20) if args.quick else GIB
    maker = subprocess.run([sys.executable, str(REPO / "bench" / "bench_restore.py"), "--worker", "make",
                            str(root), str(big_bytes)], env=_env(
                                {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}),
                           capture_output=True, text=True)
    if maker.returncode != 0:
        raise SystemExit(f"making checkpoints failed:\n{maker.stderr[-3000:]}")

    cases = [c for c in args.cases.split(",") if c]
    srv = servers.start_s3(fast_ranges=not args.stock_server)
    results: dict[str, Any] = {"repeat": args.repeat, "delay": args.delay, "stock_server": args.stock_server,
                               "cases": {}}
    try:
        srv.make_bucket(BUCKET)
        env = _env(srv.env())
        for case in cases:
            t = time.perf_counter()
            _upload(srv, root / case, case)
            names_file = root / f"{case}.names.json"
            names_file.write_text(json.dumps(zarr_array_names(root / case)))
            print(f"[{case}] uploaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            row: dict[str, Any] = {}
            for label, delay in (("no latency", 0.0), (f"{args.delay * 1000:.0f} ms latency", args.delay)):
                if delay and not args.delay:
                    continue
                proxy = start_proxy(srv.endpoint, delay) if delay else None
                endpoint = proxy.endpoint if proxy else srv.endpoint
                runs: dict[str, list[dict[str, Any]]] = {"ours": [], "ts": []}
                wire: dict[str, Any] = {}
                load0 = os.getloadavg()[0]
                try:
                    for i in range(args.repeat):
                        # alternate who goes first: neither side always follows the other's load
                        for side in (("ours", "ts") if i % 2 == 0 else ("ts", "ours")):
                            if proxy:
                                proxy.reset()
                            argv = [side, case, endpoint] + ([str(names_file)] if side == "ts" else [])
                            res = _call(argv, env)
                            runs[side].append(res)
                            if proxy:
                                wire[side] = proxy.stats()
                            print(f"[{case} {label}] {side}: {res['seconds']:.3f} s (cpu {res['cpu_seconds']:.2f} s, "
                                  f"peak RSS {res['peak_rss_over_bytes']:.2f}x), {res['arrays']} arrays, "
                                  f"{res['bytes'] / 2**20:.0f} MiB", file=sys.stderr)
                finally:
                    if proxy:
                        proxy.stop()
                best = {k: min(r["seconds"] for r in v) for k, v in runs.items()}
                # ratio of each alternating pair, so that a burst of load hits both sides
                pairs = [o["seconds"] / t["seconds"] for o, t in zip(runs["ours"], runs["ts"])]
                row[label] = {"ours_s": best["ours"], "ts_s": best["ts"], "ratio": best["ours"] / best["ts"],
                              "pair_ratios": pairs, "median_pair_ratio": statistics.median(pairs),
                              "ours_cpu_s": min(r["cpu_seconds"] for r in runs["ours"]),
                              "ts_cpu_s": min(r["cpu_seconds"] for r in runs["ts"]),
                              "ours_peak_rss_over_bytes": max(r["peak_rss_over_bytes"] for r in runs["ours"]),
                              "load": [load0, os.getloadavg()[0]], "wire": wire}
            results["cases"][case] = row
    finally:
        srv.stop()

    lines = ["| case | ours/TS (best) | pairs: median (range) | CPU s ours / TS | requests (ours / TS) "
             "| in sequence (ours / TS) | load |", "|---|---:|---:|---:|---:|---:|---:|"]
    for case, row in results["cases"].items():
        for label, r in row.items():
            w = r["wire"]
            req = f"{w['ours']['requests']} / {w['ts']['requests']}" if w else "-"
            dep = f"{w['ours']['depth']} / {w['ts']['depth']}" if w else "-"
            pr = r["pair_ratios"]
            lines.append(f"| {case}, {label} | {r['ratio']:.2f}x | {r['median_pair_ratio']:.2f}x "
                         f"({min(pr):.2f}–{max(pr):.2f}) | {r['ours_cpu_s']:.2f} / {r['ts_cpu_s']:.2f} | {req} | {dep} "
                         f"| {r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
