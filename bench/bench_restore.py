"""Restore speed and memory: ``ocdbt_py.checkpoint`` vs Orbax on the same checkpoints, to NumPy.

Usage::

    python bench/bench_restore.py [--dir /tmp/bench_ckpt] [--repeat 3] [--json out.json] [--quick]

Orbax (with 8 forced CPU devices) writes the checkpoints once into ``--dir``; every
measurement then runs in a fresh subprocess (so imports and caches of one run cannot help
another, and peak RSS is that run's own), alternating which side goes first, after reading
the checkpoint's files once so both find them in the page cache; best of ``--repeat``.
Both sides restore to host NumPy arrays (Orbax with ``RestoreArgs(restore_type=np.ndarray)``).

Cases and targets (issue 20; ``tiny`` from issue 4):

* ``quarter``: 256 MiB in 4 float32 NumPy arrays                       ours <= 0.45x Orbax
* ``small16k``: 2000 arrays of 16 KiB                                  ours <= 0.08x
* ``big``: 1 GiB in 8 float32 arrays, each sharded over 8 devices     ours <= 0.5x
* ``medium``: 4000 arrays of 64 KiB                                    ours <= 0.15x
* ``tiny``: 2000 arrays of 4 floats                                    ours <= 0.1x

Besides wall times (best of ``--repeat``), each run records its process CPU seconds: on a
loaded machine the CPU ratio moves much less than the wall ratio.
* peak RSS of ours on ``big``                                          <= 1.2x the restored bytes
* ``metadata()`` of a 10k-parameter checkpoint                         < 0.2 s
* export of ``big`` to safetensors, peak RSS                           < 300 MiB

``--quick`` shrinks ``big`` to 128 MiB for a fast smoke run (figures then do not address the
targets).  Timings depend on the machine and its load: quote the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from common import call_worker, repo_env, warm_page_cache  # bench/common.py (bench/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30


# -- workers (run in fresh processes) ---------------------------------------------------------


#: workers see 8 CPU devices, as Orbax wrote the checkpoints
_JAX_ENV = repo_env(jax_devices=8)

def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make(root: Path, big_bytes: int) -> dict[str, Any]:
    """Write the benchmark checkpoints with Orbax."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    rng = np.random.default_rng(0)
    made = {}

    def save(name: str, tree: Any) -> None:
        path = root / name
        if (path / "_METADATA").exists():
            return
        with ocp.StandardCheckpointer() as c:
            c.save(path, tree)
        made[name] = True

    rows = big_bytes // 8 // 4 // 1024
    big = {f"w{i}": jax.device_put(rng.standard_normal((rows, 1024), dtype=np.float32),
                                   NamedSharding(mesh, P("d"))) for i in range(8)}
    save("big", big)
    del big
    save("medium", {f"layer{i:04d}": rng.standard_normal(16384, dtype=np.float32) for i in range(4000)})
    save("tiny", {f"p{i:04d}": np.arange(4, dtype=np.float32) + i for i in range(2000)})
    quarter_rows = big_bytes // 4 // 4 // 4 // 1024  # a quarter of big's bytes, in 4 arrays
    save("quarter", {f"q{i}": rng.standard_normal((quarter_rows, 1024), dtype=np.float32) for i in range(4)})
    save("small16k", {f"s{i:04d}": rng.standard_normal(4096, dtype=np.float32) for i in range(2000)})
    save("meta10k", {f"block{i // 100:03d}": {f"w{j:02d}": np.full(8, j, np.float32) for j in range(100)}
                     for i in range(0, 10000, 100)})
    return {"made": sorted(made)}


def _orbax_numpy_args(path: Path) -> Any:
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    with ocp.PyTreeCheckpointer() as c:
        meta = c.metadata(path)
    tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
    return jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)


def run_orbax(path: Path) -> dict[str, Any]:
    import orbax.checkpoint as ocp

    restore_args = _orbax_numpy_args(path)  # (reads _METADATA: also warms Orbax up)
    t0, c0 = time.perf_counter(), time.process_time()
    with ocp.PyTreeCheckpointer() as c:
        out = c.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    nbytes = sum(v.nbytes for v in _leaves(out))
    return {"seconds": dt, "cpu_s": cpu, "peak_mib": _peak_mib(), "bytes": nbytes}


def _preimport() -> None:
    """Import our modules before timing (Orbax's imports are outside its timing as well)."""
    import ml_dtypes  # noqa: F401
    import numpy  # noqa: F401
    import zstandard  # noqa: F401

    import ocdbt_py.checkpoint.export  # noqa: F401
    import ocdbt_py.checkpoint.meta  # noqa: F401
    import ocdbt_py.checkpoint.restore.api  # noqa: F401
    import ocdbt_py.store  # noqa: F401
    import zarr3.array  # noqa: F401


def run_ours(path: Path) -> dict[str, Any]:
    from ocdbt_py import checkpoint

    _preimport()
    base = _peak_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    out = checkpoint.restore(path)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    nbytes = sum(v.nbytes for v in _leaves(out))
    return {"seconds": dt, "cpu_s": cpu, "peak_mib": _peak_mib(), "base_mib": base, "bytes": nbytes}


def run_meta(path: Path) -> dict[str, Any]:
    from ocdbt_py import checkpoint

    _preimport()
    t0 = time.perf_counter()
    md = checkpoint.metadata(path)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "leaves": len(_leaves(md))}


def run_export(path: Path, out: Path) -> dict[str, Any]:
    from ocdbt_py import bridges

    _preimport()
    base = _peak_mib()
    t0 = time.perf_counter()
    names = bridges.export_safetensors(path, out)
    dt = time.perf_counter() - t0
    size = out.stat().st_size
    out.unlink()
    return {"seconds": dt, "peak_mib": _peak_mib(), "base_mib": base, "tensors": len(names), "bytes": size}


def _leaves(tree: Any) -> list[Any]:
    out, stack = [], [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        else:
            out.append(x)
    return out


def worker(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "make":
        res = make(Path(argv[1]), int(argv[2]))
    elif mode == "orbax":
        res = run_orbax(Path(argv[1]))
    elif mode == "ours":
        res = run_ours(Path(argv[1]))
    elif mode == "meta":
        res = run_meta(Path(argv[1]))
    elif mode == "export":
        res = run_export(Path(argv[1]), Path(argv[2]))
    else:
        raise SystemExit(f"unknown worker mode {mode}")
    print(json.dumps(res))


# -- driver ---------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/ocdbt_bench_restore")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="quarter,small16k,big,medium,tiny")
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return 0
    root = Path(a.dir) / ("quick" if a.quick else "full")
    root.mkdir(parents=True, exist_ok=True)
    big_bytes = (GIB // 8) if a.quick else GIB
    print(f"writing checkpoints into {root} (once) ...", file=sys.stderr)
    call_worker(__file__, ["make", str(root), str(big_bytes)], _JAX_ENV)
    results: dict[str, Any] = {}
    targets = {"quarter": 0.45, "small16k": 0.08, "big": 0.5, "medium": 0.15, "tiny": 0.1}
    for case in a.cases.split(","):
        ours, theirs = [], []
        for i in range(a.repeat):
            # alternate who goes first, and warm the page cache before each run, so that neither
            # side reads from disk what the other just brought into memory
            for who in (("ours", "orbax") if i % 2 == 0 else ("orbax", "ours")):
                warm_page_cache(root / case)
                (ours if who == "ours" else theirs).append(call_worker(__file__, [who, str(root / case)], _JAX_ENV))
        bo = min(ours, key=lambda r: r["seconds"])
        bt = min(theirs, key=lambda r: r["seconds"])
        assert bo["bytes"] == bt["bytes"], (bo, bt)
        ratio = bo["seconds"] / bt["seconds"]
        cpu_ratio = min(r["cpu_s"] for r in ours) / min(r["cpu_s"] for r in theirs)
        results[case] = {"ours_s": bo["seconds"], "orbax_s": bt["seconds"], "ratio": ratio, "cpu_ratio": cpu_ratio,
                         "load": os.getloadavg()[0],
                         "target_ratio": targets[case], "restored_bytes": bo["bytes"],
                         "ours_peak_mib": max(r["peak_mib"] for r in ours),
                         "orbax_peak_mib": max(r["peak_mib"] for r in theirs)}
        print(f"{case:8s} ours {bo['seconds']:.3f}s  orbax {bt['seconds']:.3f}s  ratio {ratio:.2f}x "
              f"(target <= {targets[case]}x)  CPU ratio {cpu_ratio:.2f}x  load {os.getloadavg()[0]:.1f}  "
              f"peak RSS ours {results[case]['ours_peak_mib']:.0f} MiB "
              f"orbax {results[case]['orbax_peak_mib']:.0f} MiB", file=sys.stderr)
    if "big" in results:
        r = results["big"]
        rss_ratio = r["ours_peak_mib"] * (1 << 20) / r["restored_bytes"]
        results["big_rss"] = {"peak_over_restored": rss_ratio, "target": 1.2}
        print(f"big     peak RSS / restored bytes = {rss_ratio:.2f} (target <= 1.2)", file=sys.stderr)
    warm_page_cache(root / "meta10k")
    metas = [call_worker(__file__, ["meta", str(root / "meta10k")], _JAX_ENV) for _ in range(a.repeat)]
    meta = min(metas, key=lambda r: r["seconds"])
    results["metadata_10k"] = {**meta, "target_s": 0.2}
    print(f"metadata() of {meta['leaves']} leaves: {meta['seconds']:.3f}s (target < 0.2 s)", file=sys.stderr)
    warm_page_cache(root / "big")
    exp = call_worker(__file__, ["export", str(root / "big"), str(root / "export.safetensors")], _JAX_ENV)
    results["export_big"] = {**exp, "target_peak_mib": 300}
    print(f"export of big: {exp['seconds']:.2f}s, peak RSS {exp['peak_mib']:.0f} MiB (target < 300 MiB)",
          file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(_table(results))
    return 0


def _table(results: dict[str, Any]) -> str:
    """A markdown table of every measurement with its target."""
    rows = ["| measurement | ours | Orbax | ratio | target | met | CPU ratio | load |",
            "|---|---:|---:|---:|---:|:---:|---:|---:|"]
    for case in ("quarter", "small16k", "big", "medium", "tiny"):
        r = results.get(case)
        if r:
            met = "yes" if r["ratio"] <= r["target_ratio"] else "NO"
            rows.append(f"| restore {case} to NumPy | {r['ours_s']:.3f} s | {r['orbax_s']:.3f} s | "
                        f"{r['ratio']:.2f}x | <= {r['target_ratio']}x | {met} | {r['cpu_ratio']:.2f}x | "
                        f"{r['load']:.1f} |")
    if "big_rss" in results:
        r = results["big_rss"]
        rows.append(f"| peak RSS / restored bytes (big) | {r['peak_over_restored']:.2f} | | | <= 1.2 | "
                    f"{'yes' if r['peak_over_restored'] <= 1.2 else 'NO'} | | |")
    if "metadata_10k" in results:
        r = results["metadata_10k"]
        rows.append(f"| metadata() of {r['leaves']} leaves | {r['seconds']:.3f} s | | | < 0.2 s | "
                    f"{'yes' if r['seconds'] < 0.2 else 'NO'} | | |")
    if "export_big" in results:
        r = results["export_big"]
        rows.append(f"| export big to safetensors: peak RSS | {r['peak_mib']:.0f} MiB ({r['seconds']:.2f} s) | | | "
                    f"< 300 MiB | {'yes' if r['peak_mib'] < 300 else 'NO'} | | |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
