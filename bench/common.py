"""Shared helpers for the benchmarks: best-of-N timing, peak RSS, result tables."""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
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


#: The checkout the benchmarks run from (workers import ocdbt_py from here).
REPO = Path(__file__).resolve().parents[1]


def repo_env(extra: dict[str, str] | None = None, *, jax_devices: int | None = None) -> dict[str, str]:
    """The environment of a worker process: this checkout first on ``PYTHONPATH``, JAX on CPU
    (``jax_devices`` forced host devices), then ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if jax_devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={jax_devices}"
    env.update(extra or {})
    return env


def call_worker(script: str, args: Sequence[str], env: dict[str, str] | None = None,
                timeout: float = 3600) -> Any:
    """Run ``script --worker ARGS`` in a fresh process; its last stdout line is JSON."""
    p = subprocess.run([sys.executable, script, "--worker", *args], env=env or repo_env(), capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"worker {list(args)} failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def warm_page_cache(path: Path) -> None:
    """Read every file below ``path``, so that the measured runs find them in the page cache."""
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass


def upload_dir(fs: Any, local: Path, dest: str) -> None:
    """Copy a checkpoint directory to ``dest`` on an fsspec filesystem (skipped when there)."""
    if fs.exists(f"{dest}/_METADATA"):
        return
    files = [p for p in sorted(local.rglob("*")) if p.is_file()]
    fs.put([str(p) for p in files], [f"{dest}/{p.relative_to(local).as_posix()}" for p in files])


def zarr_array_names(local: Path) -> list[str]:
    """The Zarr v2 arrays stored in the OCDBT item at ``local``."""
    import ocdbt_py  # the checkout's (see repo_env); imported where a driver needs it

    db = ocdbt_py.open(local)
    return sorted({k.decode().rsplit("/", 1)[0] for k in db.list() if k.endswith(b"/.zarray")})
