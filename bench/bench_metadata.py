"""``metadata()`` of a checkpoint of many parameters (issue 20: 100k parameters in <= 1 s).

Usage::

    python bench/bench_metadata.py [--dir /tmp/bench_meta] [--count 100000] [--rounds 3]
                                   [--trees /path/to/old/tree,/path/to/new/tree] [--json out.json]

Writes (once, into ``--dir``) a checkpoint of ``--count`` float32 arrays of 256 values in
dicts of 100 with ``ocdbt_py.checkpoint.save`` (the tree of ``bench/scaling.py``), then
measures ``checkpoint.metadata()`` of it in fresh processes, the source trees of ``--trees``
alternating round by round (default: this tree only), and reports per tree the best wall
time, the main thread's CPU seconds of that call, and a split by phase (CPU seconds of each
phase, measured in a separate run, by wrapping the phase functions; a phase called inside
another is subtracted from it; the wrappers cost a few microseconds per call, none of them is
called per leaf).  The load
average (``os.getloadavg()``) is recorded next to every figure.  Also ``restore()`` of the
same checkpoint (``--restore``), which parses the same ``_METADATA``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def build_tree(count: int) -> dict[str, Any]:
    """``count`` arrays of 256 float32 in dicts of 100 (as ``scaling.py``'s ``n<count>``)."""
    import numpy as np

    return {f"layer{k:05d}": {f"w{i:02d}": np.full(256, k * 100 + i, np.float32)
                              for i in range(min(100, count - k * 100))} for k in range(-(-count // 100))}


# -- the worker (runs with one source tree first on sys.path) -----------------------------------

_PHASES = {
    # phase name: (module, attribute) wrapped; whichever exists in the tree being measured
    "resolve (open, list)": [("ocdbt_py.checkpoint.meta", "resolve")],
    "read + parse _METADATA to leaves": [("ocdbt_py.checkpoint.restore.item", "read_bytes"),
                                         ("ocdbt_py.checkpoint.restore.item", "read_json"),
                                         ("ocdbt_py.checkpoint.restore.item", "parse_tree_metadata"),
                                         ("ocdbt_py.checkpoint.restore.item", "parse_tree_metadata_bytes")],
    "open OCDBT (manifest, root)": [("ocdbt_py.checkpoint.restore.item", "open_array_store")],
    "B+tree nodes (read, decode)": [("ocdbt_py.read.node_reader", "NodeReader.btree_node"),
                                    ("ocdbt_py.read.node_reader", "NodeReader.btree_nodes")],
    "B+tree scan (zarr meta, sizes)": [("ocdbt_py.checkpoint.meta", "_scan_ocdbt")],
    "zarr summaries": [("ocdbt_py.checkpoint.meta", "summarize_zarr")],
    "nested tree": [("ocdbt_py.checkpoint.meta", "build_tree")],
    "item_metadata itself (params, rows, a LeafMetadata per leaf)": [("ocdbt_py.checkpoint.meta", "item_metadata")],
    "item open/close (listing, freeing the temporaries)": [("ocdbt_py.checkpoint.meta", "_item_meta")],
    "_sharding, array_metadatas": [("ocdbt_py.checkpoint.restore.item", "PyTreeItem.shardings"),
                                   ("ocdbt_py.checkpoint.restore.item", "PyTreeItem.array_metadatas")],
}


_stack: list[list[float]] = []  # per active phase: [time spent in nested phases]


def _wrap(acc: dict[str, float], phase: str, owner: Any, attr: str) -> None:
    """Count the CPU time of ``owner.attr`` to ``phase``, less that of phases nested in it."""
    fn = getattr(owner, attr)

    def timed(*a: Any, **k: Any) -> Any:
        _stack.append([0.0])
        t = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            took = time.thread_time() - t
            nested = _stack.pop()[0]
            acc[phase] = acc.get(phase, 0.0) + took - nested
            if _stack:
                _stack[-1][0] += took

    setattr(owner, attr, timed)


def _install(acc: dict[str, float]) -> None:
    import importlib

    for phase, targets in _PHASES.items():
        for mod, attr in targets:
            m = importlib.import_module(mod)
            owner: Any = m
            parts = attr.split(".")
            for p in parts[:-1]:
                owner = getattr(owner, p)
            if hasattr(owner, parts[-1]):
                _wrap(acc, phase, owner, parts[-1])


def worker(path: str, op: str, split: bool) -> dict[str, Any]:
    """One measurement in this process: the call's wall and CPU seconds (and phases)."""
    import gc

    from ocdbt_py import checkpoint

    acc: dict[str, float] = {}
    if split:
        _install(acc)
    fn = checkpoint.metadata if op == "metadata" else checkpoint.restore
    gc.collect()
    t0, c0 = time.perf_counter(), time.thread_time()
    out = fn(path)
    c1, t1 = time.thread_time(), time.perf_counter()
    del out
    c2 = time.thread_time()  # freeing the result
    r: dict[str, Any] = {"wall": t1 - t0, "cpu": c1 - c0, "free": c2 - c1, "load": os.getloadavg()[0],
                         "file": __import__("ocdbt_py").__file__}
    if split:
        r["phases"] = acc
    return r


# -- the driver ----------------------------------------------------------------------------------

def _run(tree: Path, path: Path, op: str, split: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path), op, "1" if split else "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=str(tree))
    r: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if not r["file"].startswith(str(tree)):
        raise SystemExit(f"{tree}: imported {r['file']}")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/bench_meta")
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trees", default=str(REPO), help="comma-separated source trees, alternated")
    ap.add_argument("--restore", action="store_true", help="also time restore() of the checkpoint")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], a.worker[1], a.worker[2] == "1")))
        return 0
    path = Path(a.dir) / f"ours_{a.count}"
    if not (path / "_METADATA").exists():
        from ocdbt_py import checkpoint

        checkpoint.save(str(path), build_tree(a.count), force=True)
    for f in path.rglob("*"):  # into the page cache
        if f.is_file():
            f.read_bytes()
    trees = [Path(t).resolve() for t in a.trees.split(",")]
    ops = ["metadata"] + (["restore"] if a.restore else [])
    res: dict[str, dict[str, list[dict[str, Any]]]] = {str(t): {op: [] for op in ops} for t in trees}
    split: dict[str, dict[str, Any]] = {}
    for rnd in range(a.rounds):
        for t in trees if rnd % 2 == 0 else trees[::-1]:
            for op in ops:
                res[str(t)][op].append(_run(t, path, op, False))
    for t in trees:
        split[str(t)] = _run(t, path, "metadata", True)
    report(res, split)
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": res, "split": split}, indent=1))
    return 0


def report(res: dict[str, dict[str, list[dict[str, Any]]]], split: dict[str, dict[str, Any]]) -> None:
    """Markdown tables: best wall / CPU per tree and op, then the phase split per tree."""
    print("| tree | op | best wall s | CPU s of best | min CPU s | all walls | load |")
    print("|---|---|---:|---:|---:|---|---|")
    for t, ops in res.items():
        for op, runs in ops.items():
            best = min(runs, key=lambda r: r["wall"])
            loads = [r["load"] for r in runs]
            walls = ", ".join(f"{r['wall']:.3f}" for r in runs)
            print(f"| {t} | {op} | {best['wall']:.3f} | {best['cpu']:.3f} | {min(r['cpu'] for r in runs):.3f} | "
                  f"{walls} | {min(loads):.1f}–{max(loads):.1f} |")
    names = list(dict.fromkeys(k for s in split.values() for k in s["phases"]))
    print()
    print("| phase (CPU s) | " + " | ".join(Path(t).name for t in split) + " |")
    print("|---|" + "---:|" * len(split))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{s['phases'].get(n, 0.0):.3f}" for s in split.values()) + " |")
    rest = {t: s["cpu"] - sum(s["phases"].values()) for t, s in split.items()}
    print("| everything else (metadata() itself, GC pause) | "
          + " | ".join(f"{v:.3f}" for v in rest.values()) + " |")
    print("| freeing the result | " + " | ".join(f"{s['free']:.3f}" for s in split.values()) + " |")
    print("| **total call (CPU s)** | " + " | ".join(f"{s['cpu']:.3f}" for s in split.values()) + " |")
    print("| load | " + " | ".join(f"{s['load']:.1f}" for s in split.values()) + " |")


if __name__ == "__main__":
    sys.exit(main())
