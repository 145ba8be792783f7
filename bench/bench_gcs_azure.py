"""Checkpoint restore from GCS and Azure (issue 20): ours (obstore where it takes the URL, else
the fsspec clients) vs the peers, on
local emulators, in the same run.

Usage::

    python bench/bench_gcs_azure.py [--dir /tmp/bench_ckpt] [--repeat 3] [--quick] [--stores gcs,azure]
                                    [--cases big,medium] [--json out.json]

Checkpoints (written once by Orbax via ``bench/bench_restore.py``'s maker, the same as
``bench_objectstore.py``): ``big`` = 1 GiB in 8 float32 arrays, ``medium`` = 4000 arrays of
64 KiB; and, for the zarr-python peer, the same trees in Orbax's per-parameter Zarr layout
(``use_ocdbt=False``; suffix ``-dirs``).

* **GCS** (fake-gcs-server on 127.0.0.1): ours = ``checkpoint.restore("gs://bench/<case>")``
  (gcsfs: obstore cannot write to the emulator, so it is not taken there) vs TensorStore 0.1.86's
  own ``gcs`` driver pointed at the same emulator (``TENSORSTORE_GCS_HTTP_URL``; its only
  endpoint override), every array opened as ``zarr`` over ``ocdbt`` with the options Orbax
  uses for remote storage, all concurrently.
* **Azure** (azurite on 127.0.0.1): TensorStore 0.1.86 has no Azure driver, so the peer is
  adlfs + zarr-python 3, which cannot read OCDBT: it reads the ``-dirs`` checkpoint, every
  array opened and read concurrently on its event loop.  Ours reads both the ``-dirs``
  checkpoint (like for like: ``ours-dirs/zarr``) and the OCDBT one (``ours-ocdbt/zarr``, what
  an Orbax user has).  Shared Key auth (azurite's development account).

Each run is a fresh subprocess; the sides alternate (who goes first flips each round); best of
``--repeat`` and the median of the back-to-back pair ratios.  Target: ours <= 0.7x.  The
emulators are single processes sharing the machine's cores with the clients: quote ratios.
Each run also records the emulator's CPU time (its process tree, from ``/proc``), and the table
gives two derived ratios: the CPU-floor ratio ((client + emulator CPU) ours / peer: the wall
ratio when both sides keep the cores busy) and the client-CPU ratio (the emulator elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
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
    env.update(extra or {})
    return env


def _tree_cpu(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` and its live descendants (the emulator, which
    shares the machine's cores with the client under test; azurite may run under a launcher)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, (0, 0.0))[1]
        todo.extend(c for c, (pp, _) in stats.items() if pp == p)
    return total


def _call(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _result(dt: float, r0: Any, nbytes: int, arrays: int, **extra: Any) -> dict[str, Any]:
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    # the kernel's share: first-touch page faults of fresh memory (outputs, receive buffers)
    # and the socket copies; on the development VM a fault's cost varies several-fold with
    # whether the hypervisor still backs the page (free page reporting), for either client
    return {"seconds": dt, "cpu_seconds": cpu, "sys_seconds": r1.ru_stime - r0.ru_stime,
            "minor_faults": r1.ru_minflt - r0.ru_minflt, "bytes": nbytes, "arrays": arrays, **extra}


# -- workers (fresh processes) -------------------------------------------------------------------

def run_ours(url: str, options_json: str) -> dict[str, Any]:
    import ml_dtypes  # noqa: F401  (imports outside the timing, as for the peers)
    import numpy  # noqa: F401

    import ocdbt_py.checkpoint.restore.api  # noqa: F401
    import ocdbt_py.store  # noqa: F401
    import zarr3.array  # noqa: F401
    from ocdbt_py import checkpoint
    from ocdbt_py.kvstore import open_kvstore

    kv = open_kvstore(url, json.loads(options_json), read_only=True)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    out = checkpoint.restore(kv)
    dt = time.perf_counter() - t0
    return _result(dt, r0, sum(v.nbytes for v in out.values()), len(out), store=type(kv).__name__)


def run_ts_gcs(name: str, names_file: str) -> dict[str, Any]:
    import tensorstore as ts

    names = json.loads(Path(names_file).read_text())
    ctx = ts.Context({"cache_pool#ocdbt": {"total_bytes_limit": 100_000_000}})
    kv = {"driver": "ocdbt", "base": {"driver": "gcs", "bucket": BUCKET, "path": f"{name}/"},
          "cache_pool": "cache_pool#ocdbt",
          "experimental_read_coalescing_threshold_bytes": 1000000,
          "experimental_read_coalescing_merged_bytes": 500000000000,
          "experimental_read_coalescing_interval": "1ms"}
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    opens = [ts.open({"driver": "zarr", "kvstore": dict(kv, path=f"{n}/"),
                      "recheck_cached_data": False, "recheck_cached_metadata": False}, context=ctx, open=True)
             for n in names]
    arrays = [f.result() for f in opens]
    out = [r.result() for r in [a.read() for a in arrays]]
    dt = time.perf_counter() - t0
    return _result(dt, r0, sum(int(a.nbytes) for a in out), len(out))


def run_zarr_azure(name: str, names_file: str, options_json: str) -> dict[str, Any]:
    import adlfs  # noqa: F401  (imports outside the timing)
    import zarr
    import zarr.api.asynchronous as za
    from zarr.storage import FsspecStore

    names = json.loads(Path(names_file).read_text())
    opts = json.loads(options_json)

    async def read_all() -> list[Any]:
        store = FsspecStore.from_url(f"az://{BUCKET}/{name}", storage_options=opts, read_only=True)

        async def one(n: str) -> Any:
            arr = await za.open_array(store=store, path=n, zarr_format=2)
            return await arr.getitem(...)
        return await asyncio.gather(*(one(n) for n in names))

    zarr.config.set({"async.concurrency": 64})
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    out = asyncio.run(read_all())
    dt = time.perf_counter() - t0
    return _result(dt, r0, sum(int(a.nbytes) for a in out), len(out))


def make_dirs(src: str, dst: str) -> dict[str, Any]:
    """The OCDBT checkpoint ``src`` rewritten by Orbax in its per-parameter Zarr layout."""
    import orbax.checkpoint as ocp

    from ocdbt_py import checkpoint

    tree = checkpoint.restore(src)
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)) as c:
        c.save(dst, args=ocp.args.PyTreeSave(tree), force=True)
    return {}


def worker(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    fns = {"ours": run_ours, "ts-gcs": run_ts_gcs, "zarr-azure": run_zarr_azure, "make-dirs": make_dirs}
    print(json.dumps(fns[kind](*rest)))


# -- driver --------------------------------------------------------------------------------------


def _compare(runs: dict[str, list[dict[str, Any]]], a: str, b: str, loads: list[float]) -> dict[str, Any]:
    best = {k: min(r["seconds"] for r in v) for k, v in runs.items()}
    pairs = [x["seconds"] / y["seconds"] for x, y in zip(runs[a], runs[b])]
    cpu = {k: min(r["cpu_seconds"] for r in runs[k]) for k in (a, b)}
    server = {k: min(r["server_cpu_seconds"] for r in runs[k]) for k in (a, b)}
    return {"ours_s": best[a], "peer_s": best[b], "ratio": best[a] / best[b], "pair_ratios": pairs,
            "median_pair_ratio": statistics.median(pairs),
            "ours_cpu_s": cpu[a], "peer_cpu_s": cpu[b],
            # the emulator's CPU during each side's runs: it shares the 2 cores with the client
            "ours_server_cpu_s": server[a], "peer_server_cpu_s": server[b],
            # both sides at their floor on 2 cores shared with the emulator / with it elsewhere
            "cpu_floor_ratio": (cpu[a] + server[a]) / (cpu[b] + server[b]),
            "client_cpu_ratio": cpu[a] / cpu[b], "load": loads,
            # median system CPU seconds and minor faults per run, per side (see _result)
            "ours_sys_s": statistics.median(r.get("sys_seconds", 0.0) for r in runs[a]),
            "peer_sys_s": statistics.median(r.get("sys_seconds", 0.0) for r in runs[b]),
            "ours_faults": statistics.median(r.get("minor_faults", 0) for r in runs[a]),
            "peer_faults": statistics.median(r.get("minor_faults", 0) for r in runs[b])}


def _rounds(sides: dict[str, list[str]], env: dict[str, str], repeat: int, tag: str,
            server_pid: int) -> dict[str, list[Any]]:
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    order = list(sides)
    for i in range(repeat):
        for side in order if i % 2 == 0 else order[::-1]:
            s0 = _tree_cpu(server_pid)
            res = _call(sides[side], env)
            res["server_cpu_seconds"] = _tree_cpu(server_pid) - s0  # includes the worker's start-up
            runs[side].append(res)
            print(f"[{tag}] {side}: {res['seconds']:.3f} s (cpu {res['cpu_seconds']:.2f} s, "
                  f"sys {res.get('sys_seconds', 0.0):.2f} s, {res.get('minor_faults', 0)} faults, emulator "
                  f"{res['server_cpu_seconds']:.2f} s), {res['arrays']} arrays, {res['bytes'] / 2**20:.0f} MiB",
                  file=sys.stderr, flush=True)
    return runs


def bench_gcs(root: Path, cases: list[str], repeat: int) -> dict[str, Any]:
    # gcsfs reads this when imported: no gRPC bucket-type probe of the emulator
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs

    from tests.objectstores import servers

    srv = servers.start_gcs()
    out: dict[str, Any] = {}
    try:
        srv.make_bucket(BUCKET)
        os.environ.update(srv.env())  # gcsfs: the emulator, and no gRPC bucket-type probe
        fs = gcsfs.GCSFileSystem(skip_instance_cache=True, **srv.storage_options())
        env = _env({**srv.env(), "TENSORSTORE_GCS_HTTP_URL": srv.endpoint,
                    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "ocdbt-bench"})
        opts = json.dumps(srv.storage_options())
        for case in cases:
            upload_dir(fs, root / case, f"{BUCKET}/{case}")
            names = root / f"{case}.names.json"
            names.write_text(json.dumps(zarr_array_names(root / case)))
            l0 = os.getloadavg()[0]
            runs = _rounds({"ours": ["ours", f"gs://{BUCKET}/{case}", opts],
                            "ts": ["ts-gcs", case, str(names)]}, env, repeat, f"gcs {case}",
                           srv.proc.proc.pid)
            out[case] = {"ours/TensorStore gcs": _compare(runs, "ours", "ts", [l0, os.getloadavg()[0]])}
    finally:
        srv.stop()
    return out


def bench_azure(root: Path, cases: list[str], repeat: int) -> dict[str, Any]:
    import adlfs

    from tests.objectstores import servers

    srv = servers.start_azure()
    out: dict[str, Any] = {}
    try:
        srv.make_container(BUCKET)
        fs = adlfs.AzureBlobFileSystem(skip_instance_cache=True, **srv.storage_options())
        env = _env()
        opts = json.dumps(srv.storage_options())
        for case in cases:
            dirs = f"{case}-dirs"
            if not (root / dirs / "_METADATA").exists():
                _call(["make-dirs", str(root / case), str(root / dirs)], env)
            upload_dir(fs, root / case, f"{BUCKET}/{case}")
            upload_dir(fs, root / dirs, f"{BUCKET}/{dirs}")
            names = root / f"{case}.names.json"
            names.write_text(json.dumps(zarr_array_names(root / case)))
            l0 = os.getloadavg()[0]
            runs = _rounds({"ours-dirs": ["ours", f"az://{BUCKET}/{dirs}", opts],
                            "ours-ocdbt": ["ours", f"az://{BUCKET}/{case}", opts],
                            "zarr": ["zarr-azure", dirs, str(names), opts]}, env, repeat, f"azure {case}",
                           srv.proc.proc.pid)
            loads = [l0, os.getloadavg()[0]]
            out[case] = {"ours-dirs/zarr-python": _compare(runs, "ours-dirs", "zarr", loads),
                         "ours-ocdbt/zarr-python": _compare(runs, "ours-ocdbt", "zarr", loads)}
    finally:
        srv.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/bench_ckpt")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="big = 128 MiB (figures then miss the targets' case)")
    ap.add_argument("--cases", default="big,medium")
    ap.add_argument("--stores", default="gcs,azure")
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(REPO))
    # the maker writes a case once and reuses it: quick (128 MiB) and full (1 GiB) checkpoints
    # must not share a directory, or a full run would measure a quick run's smaller "big"
    root = Path(args.dir) / ("quick" if args.quick else "full")
    root.mkdir(parents=True, exist_ok=True)
    big_bytes = (128 << 20) if args.quick else GIB
    maker = subprocess.run([sys.executable, str(REPO / "bench" / "bench_restore.py"), "--worker", "make",
                            str(root), str(big_bytes)],
                           env=_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}),
                           capture_output=True, text=True)
    if maker.returncode != 0:
        raise SystemExit(f"making checkpoints failed:\n{maker.stderr[-3000:]}")
    cases = [c for c in args.cases.split(",") if c]
    results: dict[str, Any] = {"repeat": args.repeat}
    stores = [s for s in args.stores.split(",") if s]
    if "gcs" in stores:
        results["gcs"] = bench_gcs(root, cases, args.repeat)
    if "azure" in stores:
        results["azure"] = bench_azure(root, cases, args.repeat)
    lines = ["| store | case | comparison | best ours / peer (s) | ratio | pairs: median (range) | CPU s ours / peer "
             "| emulator CPU s ours / peer | CPU-floor ratio (client + emulator) | client-CPU ratio "
             "| sys s (median) ours / peer | faults (median) ours / peer | load |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for store in ("gcs", "azure"):
        for case, row in results.get(store, {}).items():
            for label, r in row.items():
                pr = r["pair_ratios"]
                lines.append(f"| {store} | {case} | {label} | {r['ours_s']:.3f} / {r['peer_s']:.3f} | "
                             f"{r['ratio']:.2f}x | {r['median_pair_ratio']:.2f}x ({min(pr):.2f}–{max(pr):.2f}) | "
                             f"{r['ours_cpu_s']:.2f} / {r['peer_cpu_s']:.2f} | "
                             f"{r['ours_server_cpu_s']:.2f} / {r['peer_server_cpu_s']:.2f} | "
                             f"{r['cpu_floor_ratio']:.2f}x | {r['client_cpu_ratio']:.2f}x | "
                             f"{r['ours_sys_s']:.2f} / {r['peer_sys_s']:.2f} | "
                             f"{r['ours_faults'] / 1000:.0f}k / {r['peer_faults'] / 1000:.0f}k | "
                             f"{r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
