"""Issue 20's target table in one command: every hot-path benchmark, run in turn, each ratio
against its target, for one or more runs.

Usage::

    python bench/targets.py [--runs 2] [--only restore,floor,save,zarr,manager,gcs,azure,metadata]
                            [--quick] [--json out.json]

Each group runs its own benchmark script (``bench_restore.py``, ``floor.py``, ``bench_save.py``,
``bench_zarr3.py``, ``bench_manager.py``, ``bench_gcs_azure.py``, ``bench_metadata.py``) as a
child process with ``--json``, so every figure is measured the way that script documents (ours
and the peer in the same run, fresh processes, best of N); this script only collects the
ratios, compares them with the targets and prints one markdown table per run plus a summary
("met in k of n runs").  The load average before and after each group is recorded: the
targets are meant for a quiet machine.  A full run takes about 15 minutes (the GCS and Azure
group needs fake-gcs-server and azurite, see ``bench_gcs_azure.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GROUPS = ("restore", "floor", "save", "zarr", "manager", "gcs", "azure", "metadata")
Row = dict[str, Any]


def _run(script: str, args: list[str], out: Path) -> Any:
    cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    print(f"# {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{p.stderr[-3000:]}")
    return json.loads(out.read_text())


def _row(workload: str, ratio: float, target: float, detail: str, *, unit: str = "x") -> Row:
    return {"workload": workload, "value": ratio, "target": target, "unit": unit,
            "met": ratio <= target, "detail": detail}


def restore(tmp: Path, quick: bool) -> list[Row]:
    r = _run("bench_restore.py", ["--repeat", "3", "--cases", "quarter,small16k,big,medium"], tmp / "r.json")
    return [_row(f"restore {c} (vs Orbax)", v["ratio"], v["target_ratio"],
                 f"{v['ours_s']:.3f} / {v['orbax_s']:.3f} s, CPU ratio {v['cpu_ratio']:.2f}x")
            for c, v in r.items() if isinstance(v, dict) and "ratio" in v]


def floor(tmp: Path, quick: bool) -> list[Row]:
    r = _run("floor.py", ["--repeat", "3"], tmp / "f.json")
    return [_row(f"restore {v['case']}: ours / floor", v["ours_over_floor"], v["target_over_floor"],
                 f"ours {v['ours_s']:.3f}, floor {v['floor_s']:.3f}, Orbax {v['orbax_s']:.3f} s; "
                 f"target = {v['target_over_floor']:.2f}x the floor") for v in r]


def save(tmp: Path, quick: bool) -> list[Row]:
    args = ["--repeat", "2", "--cases", "quarter,small16k,big,many"] + (["--quick"] if quick else [])
    r = _run("bench_save.py", args, tmp / "s.json")
    return [_row(f"save {v['case']} (vs Orbax, steady state)", v["ratio"], v["target"],
                 f"{v['ours_s']:.3f} / {v['orbax_s']:.3f} s" + (
                     f"; ours / encode floor {v['ours_over_floor']:.2f}x" if v.get("ours_over_floor") else ""))
            for v in r["rows"]]


def zarr(tmp: Path, quick: bool) -> list[Row]:
    size = "256" if quick else "1024"
    r = _run("bench_zarr3.py", ["--size-mib", size, "--dtypes", "float32", "--layouts", "sharded", "--ops", "write",
                                "--rounds", "2"], tmp / "z.json")
    return [_row(f"zarr3 write {v['dtype']} {v['layout']} {r['size_mib']} MiB (vs TensorStore)", v["ours"] / v["ts"],
                 0.9, f"{v['ours']:.3f} / {v['ts']:.3f} s, CPU {v['ours_cpu']:.2f} / {v['ts_cpu']:.2f} s")
            for v in r["rows"]]


def manager(tmp: Path, quick: bool) -> list[Row]:
    steps = "60" if quick else "200"
    r = _run("bench_manager.py", ["--variants", "numpy-sleep,jax-sleep", "--configs", "baseline,continuous",
                                  "--steps", steps], tmp / "m.json")
    # the floor in the same run: a memory-bandwidth copy of the model (2 threads, warm buffers),
    # which save() must make of state the caller mutates or donates next
    fl = _run("cont_floor.py", ["--repeat", "5" if quick else "15", "--no-save"], tmp / "cf.json")
    copy_ms = fl["cases"]["memcpy 2 threads"]["median_ms"]
    out = []
    for v in r["results"]:
        if v["config"] == "continuous" and "overhead" in v:
            u, w, s = v["split_ms"]
            interval = v["interval_p50"] or 0.0
            # one copy per save interval: its share of every step's time
            floor = (f", copy floor {copy_ms:.0f} ms per save = {100 * copy_ms / (1000 * interval):.1f}% "
                     "at this interval") if interval else ""
            strict = (f", {100 * v['overhead_with_update']:+.1f}% counting the update's slowdown"
                      if "overhead_with_update" in v else "")
            out.append(_row(f"Continuous() {v['variant']} step overhead", 100 * v["overhead"], 3.0,
                            f"update / wait / save() {u:+.1f} / {w:+.1f} / {s:+.1f} ms per step{strict}, "
                            f"blocked per save P50 {v['blocked_started_p50_ms'] or 0:.0f} ms, "
                            f"interval {interval:.2f} s" + floor, unit="%"))
    return out


def _objectstore(store: str, tmp: Path, quick: bool) -> list[Row]:
    r = _run("bench_gcs_azure.py", ["--stores", store, "--repeat", "3"] + (["--quick"] if quick else []),
             tmp / f"{store}.json")
    out = []
    for case, row in r.get(store, {}).items():
        for label, v in row.items():
            out.append(_row(f"{store} restore {case}: {label}", v["ratio"], 0.7,
                            f"{v['ours_s']:.3f} / {v['peer_s']:.3f} s, pairs median {v['median_pair_ratio']:.2f}x"
                            + (f", client-CPU ratio {v['client_cpu_ratio']:.2f}x" if "client_cpu_ratio" in v
                               else "")
                            + (f", sys {v['ours_sys_s']:.2f} / {v['peer_sys_s']:.2f} s" if "ours_sys_s" in v
                               else "")))
    return out


def gcs(tmp: Path, quick: bool) -> list[Row]:
    return _objectstore("gcs", tmp, quick)


def azure(tmp: Path, quick: bool) -> list[Row]:
    return _objectstore("azure", tmp, quick)


def metadata(tmp: Path, quick: bool) -> list[Row]:
    count = "10000" if quick else "100000"
    r = _run("bench_metadata.py", ["--count", count, "--rounds", "3"], tmp / "md.json")
    (runs,) = r["runs"].values()
    best = min(x["wall"] for x in runs["metadata"])
    return [_row(f"metadata() of {int(count):,} parameters", best, 1.0 if not quick else 0.2,  # 10k: issue 4 target
                 f"best of {len(runs['metadata'])} fresh processes", unit=" s")]


FUNCS: dict[str, Callable[[Path, bool], list[Row]]] = {
    "restore": restore, "floor": floor, "save": save, "zarr": zarr, "manager": manager, "gcs": gcs,
    "azure": azure, "metadata": metadata,
}


def _fmt(v: float, unit: str) -> str:
    return f"{v:+.1f}%" if unit == "%" else f"{v:.2f}{unit}"


def table(rows: list[Row]) -> str:
    lines = ["| workload | measured | target | met | detail | load |", "|---|---:|---:|:---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {_fmt(r['value'], r['unit'])} | <= {_fmt(r['target'], r['unit'])} | "
                     f"{'yes' if r['met'] else 'NO'} | {r['detail']} | {r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups of {GROUPS}")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (the figures then miss the targets' cases)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    groups = [g for g in a.only.split(",") if g]
    for g in groups:
        if g not in FUNCS:
            ap.error(f"unknown group {g!r}; expected some of {GROUPS}")
    runs: list[list[Row]] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.runs):
            rows: list[Row] = []
            for g in groups:
                load0, t0 = os.getloadavg()[0], time.monotonic()
                try:
                    got = FUNCS[g](Path(d), a.quick)
                except RuntimeError as e:  # one group's failure does not lose the others' figures
                    print(f"# {g} FAILED: {e}", file=sys.stderr)
                    got = [{"workload": f"{g}: failed (see stderr)", "value": float("nan"), "target": float("nan"),
                            "unit": "", "met": False, "detail": str(e).splitlines()[0]}]
                load = (load0, os.getloadavg()[0])
                for r in got:
                    r["load"] = load
                rows += got
                print(f"# {g}: {time.monotonic() - t0:.0f} s, load {load[0]:.1f}–{load[1]:.1f}", file=sys.stderr)
            runs.append(rows)
            print(f"\n### Run {i + 1} of {a.runs} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
            print(table(rows), flush=True)
    if a.runs > 1:
        print("\n### Summary\n\n| workload | target | measured per run | met in |\n|---|---:|---|---:|")
        for k, first in enumerate(runs[0]):
            vals = [run[k] for run in runs if k < len(run) and run[k]["workload"] == first["workload"]]
            print(f"| {first['workload']} | <= {_fmt(first['target'], first['unit'])} | "
                  f"{', '.join(_fmt(v['value'], v['unit']) for v in vals)} | {sum(v['met'] for v in vals)} of "
                  f"{len(vals)} |")
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
