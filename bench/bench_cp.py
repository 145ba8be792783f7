"""``ocdbt cp`` of a per-parameter checkpoint into OCDBT Zarr v3 on local disk, vs Orbax.

The source is a per-parameter (``use_ocdbt=False``, Zarr v2, zstd) checkpoint of ``--mib``
MiB of float32 in ``--arrays`` arrays (written by ``ocdbt_py.checkpoint.save``, which writes
the files Orbax's ``PyTreeCheckpointHandler(use_ocdbt=False)`` writes; ``--orbax-source``
has Orbax write it).  Measured, each in a fresh child process under ``/usr/bin/time -v``:

* ``ocdbt cp SRC DST --ocdbt --zarr3`` (the zstd frames are kept: no decode/encode), also
  with ``--no-sync`` (no fsync of the new files: the share of the disk's flush);
* ``ocdbt cp ... --compression zstd:3`` (every chunk decoded and encoded again);
* Orbax: ``PyTreeCheckpointer().restore(SRC)`` then
  ``PyTreeCheckpointHandler(use_zarr3=True)`` save (the way to convert with Orbax alone).

Reported: wall seconds of the whole process (interpreter start included; ``copy()`` alone in
brackets), GB/s of array data, peak RSS, and ours/Orbax.  The source stays in
the page cache for every run (it is read once before timing).

    python bench/bench_cp.py --mib 64          # smoke run
    python bench/bench_cp.py --mib 1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

_ORBAX = """
import sys, numpy as np, orbax.checkpoint as ocp
src, dst = sys.argv[1], sys.argv[2]
tree = ocp.PyTreeCheckpointer().restore(src)
ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=True)).save(dst, args=ocp.args.PyTreeSave(tree))
"""

_ORBAX_SOURCE = """
import sys, numpy as np, orbax.checkpoint as ocp
sys.path.insert(0, sys.argv[3])
from bench_cp import build_tree
tree = build_tree(int(sys.argv[2]), int(sys.argv[4]))
ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(sys.argv[1], args=ocp.args.PyTreeSave(tree))
"""


def build_tree(mib: int, arrays: int) -> dict[str, Any]:
    """``arrays`` float32 arrays (rows of 1024) totalling ``mib`` MiB, normally distributed."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = max(1, (mib << 20) // arrays // 4096)
    return {"layers": {f"l{i}": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(arrays)}}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _timed(argv: list[str]) -> tuple[float, float, str]:
    """Run ``argv`` under ``/usr/bin/time -v``: (wall seconds, peak RSS MiB, stdout)."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True, env=_env())
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed:\n{p.stderr[-3000:]}")
    rss = next(int(line.split(":")[1]) / 1024 for line in p.stderr.splitlines() if "Maximum resident" in line)
    return wall, rss, p.stdout


def _read_all(path: Path) -> int:
    n = 0
    for f in path.rglob("*"):
        if f.is_file():
            n += len(f.read_bytes())
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--arrays", type=int, default=16)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--orbax-source", action="store_true", help="have Orbax write the source")
    ap.add_argument("--skip-orbax", action="store_true")
    ap.add_argument("--skip-reencode", action="store_true")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_cp_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    if args.orbax_source:
        subprocess.run([sys.executable, "-c", _ORBAX_SOURCE, str(src), str(args.mib), str(REPO / "bench"),
                        str(args.arrays)], check=True, env=_env())
    else:
        sys.path.insert(0, str(REPO))
        from ocdbt_py.checkpoint import save

        save(src, build_tree(args.mib, args.arrays), use_ocdbt=False)
    logical = args.mib << 20
    stored = _read_all(src)  # also warms the page cache
    load = os.getloadavg()
    results: dict[str, Any] = {"mib": args.mib, "arrays": args.arrays, "stored_bytes": stored,
                               "loadavg_before": load, "cpus": os.cpu_count(), "runs": {}}
    cp = [sys.executable, "-m", "ocdbt_py.cli", "cp", str(src)]
    extra = ["--workers", str(args.workers)] if args.workers else []
    runs = [("cp_ocdbt_zarr3", cp + [str(work / "dst_cp"), "--ocdbt", "--zarr3", "--json", *extra]),
            ("cp_ocdbt_zarr3_nosync", cp + [str(work / "dst_ns"), "--ocdbt", "--zarr3", "--no-sync", "--json",
                                            *extra])]
    if not args.skip_reencode:
        runs.append(("cp_reencode_zstd3", cp + [str(work / "dst_re"), "--ocdbt", "--zarr3", "--compression",
                                                "zstd:3", "--json", *extra]))
    if not args.skip_orbax:
        runs.append(("orbax_restore_save", [sys.executable, "-c", _ORBAX, str(src), str(work / "dst_orbax")]))
    for name, argv in runs:
        shutil.rmtree(argv[5] if name.startswith("cp") else work / "dst_orbax", ignore_errors=True)
        wall, rss, out = _timed(argv)
        results["runs"][name] = {"seconds": round(wall, 3), "gb_per_s": round(logical / wall / 1e9, 3),
                                 "peak_rss_mib": round(rss, 1)}
        inner = ""
        if name.startswith("cp"):
            summary = json.loads(out)
            results["runs"][name]["summary"] = summary
            inner = f"  (copy() alone {summary['seconds']:.2f} s, {logical / summary['seconds'] / 1e9:.3f} GB/s)"
        print(f"{name:22s} {wall:7.2f} s  {logical / wall / 1e9:6.3f} GB/s  peak RSS {rss:7.1f} MiB{inner}",
              flush=True)
    if "orbax_restore_save" in results["runs"]:
        base = results["runs"]["orbax_restore_save"]["seconds"]
        for name, r in results["runs"].items():
            r["vs_orbax"] = round(r["seconds"] / base, 3)
            print(f"{name:22s} {r['seconds'] / base:.3f}x Orbax's time")
    results["loadavg_after"] = os.getloadavg()
    print(f"load average before/after: {load} / {results['loadavg_after']} on {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
