"""Benchmark zarr3 against TensorStore on the same data in the same run.

    .venv/bin/python bench/bench_zarr3.py [--size-mib 1024] [--repeat 3] [--rounds 2]

Arrays hold ``normal(0, 0.02)`` weights (like a checkpoint) as bf16 or f32, zstd level 3,
4 MiB chunks, either unsharded (``bytes`` + ``zstd``) or Orbax-style sharded (one inner chunk
per shard).  TensorStore writes each dataset once; then both libraries read it, and both
write it to fresh directories on local files (writing inside OCDBT is not part of zarr3).
Reads are also measured inside an OCDBT database written by TensorStore, opened with
``ocdbt_py.open(path)`` and read through its ``as_kvstore()`` view.

Every measurement runs in its own child process (so the two libraries never share a heap),
``--repeat`` times in a row; TensorStore and zarr3 children alternate for ``--rounds``
rounds and the best wall time is reported, with the CPU time (all threads) of that run.
Peak RSS is the child's ``VmHWM`` (the peak that ``/usr/bin/time -v`` reports as "Maximum
resident set size"; ``ru_maxrss`` would include the parent's memory across fork) minus its
RSS just before the first timed operation, i.e. the memory the operation needs beyond its
input: for reads the output array plus everything in flight.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

CHUNK_BYTES = 4 << 20
COLS = 8192
CHUNK_COLS = 2048


def layout(dtype: str, size_mib: int) -> tuple[list[int], list[int]]:
    """Array shape and chunk shape: ``size_mib`` MiB in 4 MiB chunks of 2048 columns."""
    item = 2 if dtype == "bfloat16" else 4
    rows = max(1, (size_mib << 20) // (COLS * item))
    chunk_rows = CHUNK_BYTES // (CHUNK_COLS * item)
    return [rows, COLS], [min(chunk_rows, rows), CHUNK_COLS]


def inner_codecs() -> list[dict[str, Any]]:
    return [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "zstd", "configuration": {"level": 3, "checksum": False}},
    ]


def metadata(dtype: str, shape: list[int], chunks: list[int], sharded: bool) -> dict[str, Any]:
    codecs = inner_codecs()
    if sharded:
        codecs = [{"name": "sharding_indexed", "configuration": {"chunk_shape": chunks, "codecs": codecs}}]
    return {
        "shape": shape,
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "codecs": codecs,
    }


def make_data(dtype: str, shape: list[int]) -> np.ndarray:
    """``normal(0, 0.02)`` weights, generated block by block (no full-size temporaries)."""
    rng = np.random.default_rng(0)
    out = np.empty(shape, dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    step = 1024
    for i in range(0, shape[0], step):
        n = min(step, shape[0] - i)
        out[i : i + n] = rng.standard_normal((n, shape[1]), dtype=np.float32) * 0.02
    return out


def ts_spec(path: Path, store: str) -> dict[str, Any]:
    if store == "ocdbt":
        kv: dict[str, Any] = {"driver": "ocdbt", "base": f"file://{path}/", "path": "arr/"}
    else:
        kv = {"driver": "file", "path": str(path)}
    return {"driver": "zarr3", "kvstore": kv}


# -- the operations timed ------------------------------------------------------------------
def ts_write(path: Path, data: np.ndarray, dtype: str, chunks: list[int], sharded: bool, store: str = "file") -> None:
    import tensorstore as ts

    spec = ts_spec(path, store)
    spec["metadata"] = metadata(dtype, list(data.shape), chunks, sharded)
    t = ts.open(spec, create=True).result()
    t.write(data).result()


def ours_write(path: Path, data: np.ndarray, dtype: str, chunks: list[int], sharded: bool) -> None:
    import zarr3

    kw: dict[str, Any] = {"shards": chunks} if sharded else {}
    a = zarr3.create(str(path), shape=data.shape, dtype=dtype, chunks=chunks, codecs=inner_codecs(), **kw)
    a[...] = data


def ts_read(path: Path, store: str) -> np.ndarray:
    import tensorstore as ts

    return ts.open(ts_spec(path, store)).result().read().result()


def ours_read(path: Path, store: str) -> np.ndarray:
    import zarr3

    if store == "ocdbt":
        import ocdbt_py

        return zarr3.open(ocdbt_py.open(str(path)), "arr")[...]
    return zarr3.open(str(path))[...]


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` memory field in KiB (VmRSS, VmHWM = peak RSS of this process)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


# -- child process: one library, one case, `repeat` timed runs ----------------------------------
def child(args: argparse.Namespace) -> None:
    op, lib, dtype, lay, store, path = args.child
    import tensorstore  # noqa: F401  (import cost outside the timing, for both)

    import zarr3  # noqa: F401

    sharded = lay == "sharded"
    shape, chunks = layout(dtype, args.size_mib)
    data = make_data(dtype, shape) if op == "write" else None
    try:  # reset the peak-RSS counter (VmHWM) so set-up does not count
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    base_rss = _status_kib("VmRSS")
    best: tuple[float, float] | None = None
    for i in range(args.repeat):
        target = Path(f"{path}_{i}") if op == "write" else Path(path)
        if op == "write":
            shutil.rmtree(target, ignore_errors=True)
        gc.collect()
        c0 = time.process_time()
        t0 = time.perf_counter()
        if op == "read":
            out = (ts_read if lib == "ts" else ours_read)(target, store)
        elif lib == "ts":
            assert data is not None
            ts_write(target, data, dtype, chunks, sharded)
        else:
            assert data is not None
            ours_write(target, data, dtype, chunks, sharded)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if op == "read":
            assert out.shape == tuple(shape)
            del out
        else:
            shutil.rmtree(target, ignore_errors=True)
        if best is None or wall < best[0]:
            best = (wall, cpu)
    # VmHWM, not ru_maxrss: on Linux ru_maxrss keeps the parent's peak across fork + exec
    peak = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert best is not None
    print(json.dumps({"wall": best[0], "cpu": best[1], "extra_rss_kib": max(0, peak - base_rss)}))


def run_child(argv: list[str]) -> dict[str, Any]:
    res = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"child {argv} failed:\n{res.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return result


def measure(args: argparse.Namespace, op: str, dtype: str, lay: str, store: str, path: Path) -> dict[str, Any]:
    best: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for lib in ("ts", "ours"):
            target = path if op == "read" else path.parent / f"{path.name}_{lib}"
            r = run_child(
                [
                    "--size-mib",
                    str(args.size_mib),
                    "--repeat",
                    str(args.repeat),
                    "--child",
                    op,
                    lib,
                    dtype,
                    lay,
                    store,
                    str(target),
                ]
            )
            if lib not in best or r["wall"] < best[lib]["wall"]:
                rss = max(r["extra_rss_kib"], best.get(lib, {}).get("extra_rss_kib", 0))
                best[lib] = dict(r, extra_rss_kib=rss)
    return {
        "op": op,
        "dtype": dtype,
        "layout": lay,
        "store": store,
        "ts": best["ts"]["wall"],
        "ours": best["ours"]["wall"],
        "ts_cpu": best["ts"]["cpu"],
        "ours_cpu": best["ours"]["cpu"],
        "ts_rss_mib": best["ts"]["extra_rss_kib"] / 1024,
        "ours_rss_mib": best["ours"]["extra_rss_kib"] / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024, help="array size in MiB (default 1024)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per child process (default 3)")
    p.add_argument("--rounds", type=int, default=2, help="alternating TS/zarr3 child rounds (default 2)")
    p.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--layouts", default="unsharded,sharded")
    p.add_argument("--stores", default="file,ocdbt")
    p.add_argument("--ops", default="read,write")
    p.add_argument("--json", default=None, help="also write the results as JSON to this file")
    p.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return

    import tensorstore as ts

    import zarr3

    base = Path(args.dir or tempfile.mkdtemp(prefix="bench_zarr3_"))
    base.mkdir(parents=True, exist_ok=True)
    ops = args.ops.split(",")
    print(
        f"zarr3 vs TensorStore {getattr(ts, '__version__', '0.1.86')}: {args.size_mib} MiB arrays, "
        f"4 MiB chunks, zstd 3; best of {args.rounds} rounds x {args.repeat} runs; "
        f"{zarr3.num_threads()} zarr3 threads, {os.cpu_count()} CPUs",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    try:
        for dtype in args.dtypes.split(","):
            shape, chunks = layout(dtype, args.size_mib)
            data = make_data(dtype, shape)
            for lay in args.layouts.split(","):
                sharded = lay == "sharded"
                if "write" in ops:
                    rows.append(measure(args, "write", dtype, lay, "file", base / "w"))
                    # check what zarr3 writes reads back right in TensorStore
                    check = base / "check"
                    shutil.rmtree(check, ignore_errors=True)
                    ours_write(check, data, dtype, chunks, sharded)
                    assert ts_read(check, "file").tobytes() == data.tobytes(), "TensorStore read mismatch"
                    shutil.rmtree(check, ignore_errors=True)
                    print(fmt_row(rows[-1]), flush=True)
                if "read" in ops:
                    for store in args.stores.split(","):
                        src = base / f"r_{dtype}_{lay}_{store}"
                        shutil.rmtree(src, ignore_errors=True)
                        ts_write(src, data, dtype, chunks, sharded, store)
                        assert ours_read(src, store).tobytes() == data.tobytes(), "zarr3 read mismatch"
                        rows.append(measure(args, "read", dtype, lay, store, src))
                        shutil.rmtree(src, ignore_errors=True)
                        print(fmt_row(rows[-1]), flush=True)
            del data
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(HEADER)
    for r in rows:
        print(fmt_row(r))
    print(
        f"RSS: peak RSS beyond the child's RSS before the first operation; outputs are "
        f"{args.size_mib} MiB, chunks 4 MiB."
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"size_mib": args.size_mib, "rows": rows}, indent=1))


HEADER = (
    f"{'op':<6}{'dtype':<10}{'layout':<11}{'store':<7}{'TS s':>7}{'ours s':>8}{'ratio':>7}{'target':>8}"
    f"{'TS cpu':>8}{'our cpu':>8}{'TS RSS':>8}{'our RSS':>8}"
)


def fmt_row(r: dict[str, Any]) -> str:
    ratio = r["ours"] / r["ts"]
    target = "<=0.6" if r["op"] == "read" else "<=1.0"
    return (
        f"{r['op']:<6}{r['dtype']:<10}{r['layout']:<11}{r['store']:<7}{r['ts']:>7.2f}{r['ours']:>8.2f}"
        f"{ratio:>7.2f}{target:>8}{r['ts_cpu']:>8.2f}{r['ours_cpu']:>8.2f}"
        f"{r['ts_rss_mib']:>7.0f}M{r['ours_rss_mib']:>7.0f}M"
    )


if __name__ == "__main__":
    main()
