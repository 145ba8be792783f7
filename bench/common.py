"""Shared helpers for the benchmarks: best-of-N timing, peak RSS, result tables."""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def best_of(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    """Best wall time of ``fn`` over ``repeat`` runs, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux: ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_peak_rss(argv: list[str]) -> tuple[float, str]:
    """Run a command under ``/usr/bin/time -v``; returns (peak RSS MiB, stdout)."""
    p = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True, check=True)
    for line in p.stderr.splitlines():
        if "Maximum resident set size" in line:
            return int(line.split(":")[1]) / 1024, p.stdout
    raise RuntimeError("no RSS figure from /usr/bin/time")


def table(rows: list[tuple[str, float, float]], unit: str = "s") -> str:
    """Markdown table of (case, ours, theirs) with the ratio ours/theirs."""
    out = ["| case | ours | TensorStore | ours/TS |", "|---|---:|---:|---:|"]
    for name, ours, theirs in rows:
        out.append(f"| {name} | {ours:.4f} {unit} | {theirs:.4f} {unit} | {ours / theirs:.2f}x |")
    return "\n".join(out)


def python() -> str:
    """The running interpreter, for subprocess measurements."""
    return sys.executable
