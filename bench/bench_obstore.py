"""Checkpoint restore through the obstore backend (issue 29): ours vs TensorStore's ``s3``
driver on the same moto server in the same run, credentials from a named profile in a shared
credentials file, with the plain concurrent range-GET floor and ours through s3fs (the fsspec
route, for users without obstore) beside them; azurite (ours through obstore vs ours through
adlfs, and the floor) where Node.js is there.

Usage::

    python bench/bench_obstore.py [--repeat 3] [--cases r256,small] [--json out.json]

Cases (written once with ``ocdbt_py.checkpoint.save`` into ``--dir``, uploaded to the server):
``r256``: 256 MiB in 4 float32 arrays; ``small``: 4000 arrays of 64 KiB.  Every measurement is
a fresh process; sides alternate who goes first; best of ``--repeat``.

* ours: ``checkpoint.restore("s3://bench/<case>")`` to NumPy, with only ``AWS_PROFILE`` (and
  the endpoint) in the environment: the profile's keys are in a shared credentials file;
* TensorStore 0.1.86: every array opened as ``zarr`` over ``ocdbt`` over its ``s3`` kvstore
  (same profile, through its own credential chain), all opened and read concurrently, with the
  read-coalescing options Orbax sets for remote storage;
* floor: every data file of the checkpoint fetched with plain concurrent ranged GETs (8 MiB
  ranges, all in flight; obstore's client, the fastest one here): the bytes alone, nothing
  parsed or decoded.

Every worker also reports its process's peak RSS (interpreter, imports and the restored
arrays included; ours and TensorStore's are tabulated).

The server is moto with ``--fast-ranges`` (``tests/objectstores/moto_main.py``).  The S3 server
is single-process Python sharing the machine's 2 cores with the client: quote ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench"
PROFILE = "bench-profile"
MIB = 1 << 20


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env.update(extra)
    return env


def _call(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{p.stderr[-4000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


# -- workers -----------------------------------------------------------------------------------
def _cpu() -> float:
    """CPU seconds (user + system, all threads) this process has used."""
    t = os.times()
    return t.user + t.system


def _server_cpu(pid: int) -> float:
    """CPU seconds the server process has used (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run_ours(url: str, backend: str) -> dict[str, Any]:
    import numpy  # noqa: F401  (imports outside the timing, as for TensorStore)

    import ocdbt_py.checkpoint.restore.api  # noqa: F401
    import ocdbt_py.kvstore.obstore_store  # noqa: F401
    from ocdbt_py import checkpoint
    from ocdbt_py.kvstore import open_kvstore

    kv = open_kvstore(url)
    c0 = _cpu()
    t0 = time.perf_counter()
    out = checkpoint.restore(url)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "cpu_s": _cpu() - c0, "bytes": sum(v.nbytes for v in out.values()), "arrays": len(out),
            "store": type(kv).__name__, "backend": backend}


def run_ts(case: str, endpoint: str, names_file: str) -> dict[str, Any]:
    import tensorstore as ts

    names = json.loads(Path(names_file).read_text())
    ctx = ts.Context({"file_io_concurrency": {"limit": 128}, "cache_pool#ocdbt": {"total_bytes_limit": 100_000_000}})
    from tests.objectstores.servers import S3_REGION

    # credentials: the same named profile (TensorStore 0.1.86's profile provider needs both file
    # paths spelled out: it fails to resolve them from AWS_SHARED_CREDENTIALS_FILE/AWS_CONFIG_FILE)
    profile = {"type": "profile", "profile": PROFILE, "credentials_file": os.environ["AWS_SHARED_CREDENTIALS_FILE"],
               "config_file": os.environ["AWS_CONFIG_FILE"]}
    base = {"driver": "s3", "bucket": BUCKET, "path": f"{case}/", "endpoint": endpoint, "aws_region": S3_REGION,
            "aws_credentials": profile}
    kv = {"driver": "ocdbt", "base": base, "cache_pool": "cache_pool#ocdbt",
          "experimental_read_coalescing_threshold_bytes": 1000000,
          "experimental_read_coalescing_merged_bytes": 500000000000,
          "experimental_read_coalescing_interval": "1ms"}
    c0 = _cpu()
    t0 = time.perf_counter()
    opens = [ts.open({"driver": "zarr", "kvstore": dict(kv, path=f"{n}/"), "recheck_cached_data": False,
                      "recheck_cached_metadata": False}, context=ctx, open=True) for n in names]
    arrays = [f.result() for f in opens]
    out = [r.result() for r in [a.read() for a in arrays]]
    dt = time.perf_counter() - t0
    return {"seconds": dt, "cpu_s": _cpu() - c0, "bytes": sum(int(a.nbytes) for a in out), "arrays": len(out)}


def run_floor(url: str, files_json: str) -> dict[str, Any]:
    import asyncio

    import obstore

    from ocdbt_py.kvstore import open_kvstore

    kv: Any = open_kvstore(url)
    files = json.loads(files_json)  # [(key, size)]
    step = 8 * MIB

    async def main() -> int:
        ranges = [(k, s, min(s + step, n)) for k, n in files for s in range(0, n, step)]
        got = await asyncio.gather(*(obstore.get_range_async(kv.store, k, start=a, end=b) for k, a, b in ranges))
        return sum(len(g) for g in got)

    c0 = _cpu()
    t0 = time.perf_counter()
    nbytes = asyncio.run(main())
    return {"seconds": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "bytes": nbytes,
            "requests": sum(-(-n // step) for _, n in files)}


def worker(argv: list[str]) -> None:
    import resource

    kind = argv[0]
    if kind == "ours":
        res = run_ours(argv[1], argv[2])
    elif kind == "ts":
        res = run_ts(argv[1], argv[2], argv[3])
    elif kind == "floor":
        res = run_floor(argv[1], argv[2])
    else:
        raise SystemExit(f"unknown worker {kind}")
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the whole process
    print(json.dumps(res))


# -- driver ------------------------------------------------------------------------------------
def make_cases(root: Path, cases: list[str]) -> None:
    import numpy as np

    from ocdbt_py import checkpoint

    rng = np.random.default_rng(0)
    for case in cases:
        path = root / case
        if path.exists():
            continue
        if case == "r256":
            tree = {f"a{i}": rng.standard_normal(16 * MIB).astype(np.float32) for i in range(4)}  # 4 x 64 MiB
        else:
            tree = {f"p{i:04d}": rng.standard_normal(16 * 1024).astype(np.float32) for i in range(4000)}  # 64 KiB
        checkpoint.save(path, tree)


def _names(root: Path) -> list[str]:
    import ocdbt_py

    db = ocdbt_py.open(root)
    return sorted({k.decode().rsplit("/", 1)[0] for k in db.list() if k.endswith((b"/.zarray", b"/zarr.json"))})


def _data_files(kv: Any) -> list[tuple[str, int]]:
    return [(k, int(n or 0)) for k, n in kv.list_sized("") if "/d/" in f"/{k}" and n]


def _best(runs: list[dict[str, Any]]) -> float:
    return min(r["seconds"] for r in runs)


def bench_s3(root: Path, cases: list[str], repeat: int) -> list[dict[str, Any]]:
    from ocdbt_py.kvstore import open_kvstore
    from tests.objectstores import servers

    srv = servers.start_s3(fast_ranges=True)
    rows = []
    try:
        srv.make_bucket(BUCKET)
        tmp = Path(tempfile.mkdtemp(prefix="bench-obstore-"))
        (tmp / "credentials").write_text(f"[{PROFILE}]\naws_access_key_id = {servers.S3_KEY}\n"
                                         f"aws_secret_access_key = {servers.S3_SECRET}\n")
        (tmp / "config").write_text(f"[profile {PROFILE}]\nregion = {servers.S3_REGION}\n")
        env = _env({"AWS_SHARED_CREDENTIALS_FILE": str(tmp / "credentials"), "AWS_CONFIG_FILE": str(tmp / "config"),
                     "AWS_PROFILE": PROFILE, "AWS_ENDPOINT_URL": srv.endpoint})
        for case in cases:
            url = f"s3://{BUCKET}/{case}"
            kv = open_kvstore(url, srv.storage_options())
            for f in sorted((root / case).rglob("*")):
                if f.is_file():
                    kv.set(f.relative_to(root / case).as_posix(), f.read_bytes())
            names_file = tmp / f"{case}.names.json"
            names_file.write_text(json.dumps(_names(root / case)))
            files = json.dumps(_data_files(kv))
            runs: dict[str, list[dict[str, Any]]] = {"ours": [], "ts": [], "floor": [], "fsspec": []}
            for i in range(repeat):
                order = ("ours", "ts", "floor", "fsspec") if i % 2 == 0 else ("ts", "ours", "fsspec", "floor")
                for side in order:
                    argv = {"ours": ["ours", url, "obstore"], "ts": ["ts", case, srv.endpoint, str(names_file)],
                            "floor": ["floor", url, files], "fsspec": ["ours", url, "fsspec"]}[side]
                    s0 = _server_cpu(srv.proc.proc.pid)
                    res = _call(argv, dict(env, OCDBT_PY_BACKEND="fsspec") if side == "fsspec" else env)
                    res["server_cpu_s"] = _server_cpu(srv.proc.proc.pid) - s0
                    runs[side].append(res)
                    print(f"[s3 {case}] {side}: {res['seconds']:.3f} s, CPU {res['cpu_s']:.2f} s (server "
                          f"{res['server_cpu_s']:.2f} s), peak RSS {res['peak_rss_mib']:.0f} MiB "
                          f"{res.get('store', '')}", file=sys.stderr)
            assert all(r["store"] == "ObstoreStore" for r in runs["ours"]), runs["ours"]
            assert all(r["store"] == "S3Store" for r in runs["fsspec"]), runs["fsspec"]
            pairs = [o["seconds"] / t["seconds"] for o, t in zip(runs["ours"], runs["ts"])]
            rows.append({"service": "S3 (moto)", "case": case, "ours_s": _best(runs["ours"]),
                         "peer": "TensorStore s3", "peer_s": _best(runs["ts"]), "floor_s": _best(runs["floor"]),
                         "ratio": _best(runs["ours"]) / _best(runs["ts"]),
                         "median_pair_ratio": statistics.median(pairs),
                         "fsspec_s": _best(runs["fsspec"]), "bytes": runs["ours"][0]["bytes"],
                         "ours_rss_mib": max(r["peak_rss_mib"] for r in runs["ours"]),
                         "ours_cpu_s": min(r["cpu_s"] for r in runs["ours"]),
                         "peer_cpu_s": min(r["cpu_s"] for r in runs["ts"]),
                         "floor_cpu_s": min(r["cpu_s"] for r in runs["floor"]),
                         "server_cpu_s": {k: min(r["server_cpu_s"] for r in v) for k, v in runs.items()},
                         "peer_rss_mib": max(r["peak_rss_mib"] for r in runs["ts"])})
    finally:
        srv.stop()
    return rows


def bench_azure(root: Path, cases: list[str], repeat: int) -> list[dict[str, Any]]:
    from ocdbt_py.kvstore import open_kvstore
    from tests.objectstores import servers

    try:
        srv = servers.start_azure()
    except servers.ServerStartError as e:
        print(f"azurite not reachable: {e}", file=sys.stderr)
        return []
    rows = []
    try:
        srv.make_container(BUCKET)
        env = _env(srv.env())
        for case in cases:
            url = f"az://{BUCKET}/{case}"
            kv = open_kvstore(url, srv.storage_options())
            for f in sorted((root / case).rglob("*")):
                if f.is_file():
                    kv.set(f.relative_to(root / case).as_posix(), f.read_bytes())
            files = json.dumps(_data_files(kv))
            runs: dict[str, list[dict[str, Any]]] = {"obstore": [], "fsspec": [], "floor": []}
            for _ in range(repeat):
                for side in ("obstore", "fsspec", "floor"):
                    argv = ["floor", url, files] if side == "floor" else ["ours", url, side]
                    res = _call(argv, dict(env, OCDBT_PY_BACKEND=side) if side != "floor" else env)
                    runs[side].append(res)
                    print(f"[azure {case}] {side}: {res['seconds']:.3f} s", file=sys.stderr)
            rows.append({"service": "Azure (azurite)", "case": case, "ours_s": _best(runs["obstore"]),
                         "peer": "ours via adlfs", "peer_s": _best(runs["fsspec"]), "floor_s": _best(runs["floor"]),
                         "ratio": _best(runs["obstore"]) / _best(runs["fsspec"]),
                         "bytes": runs["obstore"][0]["bytes"]})
    finally:
        srv.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/bench_obstore")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="r256,small")
    ap.add_argument("--services", default="s3,azure")
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(REPO))
    root = Path(args.dir)
    cases = [c for c in args.cases.split(",") if c]
    make_cases(root, cases)
    rows: list[dict[str, Any]] = []
    if "s3" in args.services:
        rows += bench_s3(root, cases, args.repeat)
    if "azure" in args.services:
        rows += bench_azure(root, cases, args.repeat)
    print("| service | case | ours (obstore) | peer | peer time | ours/peer | floor | ours/floor | ours via fsspec "
          "| peak RSS ours / peer |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        fs = f"{r['fsspec_s']:.3f} s" if "fsspec_s" in r else "—"
        rss = f"{r['ours_rss_mib']:.0f} / {r['peer_rss_mib']:.0f} MiB" if "peer_rss_mib" in r else "—"
        print(f"| {r['service']} | {r['case']} | {r['ours_s']:.3f} s | {r['peer']} | {r['peer_s']:.3f} s "
              f"| {r['ratio']:.2f}x | {r['floor_s']:.3f} s | {r['ours_s'] / r['floor_s']:.2f}x | {fs} | {rss} |")
    for r in rows:
        if "peer_cpu_s" in r:
            print(f"{r['service']} {r['case']}: client CPU ours {r['ours_cpu_s']:.2f} s, TensorStore "
                  f"{r['peer_cpu_s']:.2f} s, floor {r['floor_cpu_s']:.2f} s; server CPU (least) "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in r["server_cpu_s"].items()))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
