"""Fixtures for the checkpoint save tests.

``oracle`` saves the NumPy test trees with ``ocdbt_py.checkpoint.save`` in this (JAX-free)
process, then runs ``_orbax_worker.py`` once in a subprocess (8 forced CPU devices) which
restores them with Orbax, opens them with TensorStore, and does the JAX-side jobs (sharded
saves compared byte for byte with Orbax's, async saves, chunk-shape agreement).  Tests look
up their job in the report.  ``mp_report`` does the same for real 2- and 4-process
``jax.distributed`` saves.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _trees  # noqa: E402

__all__ = ["run_worker", "subprocess_env", "have_oracle", "free_port", "Report"]


def have_oracle() -> bool:
    """Whether Orbax, TensorStore and JAX are installed (else those tests skip)."""
    return all(importlib.util.find_spec(m) is not None for m in ("jax", "orbax.checkpoint", "tensorstore"))


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for helper subprocesses: this repo importable, quiet JAX on CPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop("XLA_FLAGS", None)
    env.update(extra)
    return env


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_worker(jobs: list[dict[str, Any]], workdir: Path, timeout: float = 900) -> dict[str, Any]:
    """Run ``_orbax_worker.py`` on ``jobs``; returns the report."""
    jobs_file, report_file = workdir / "jobs.json", workdir / "report.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, str(HERE / "_orbax_worker.py"), str(jobs_file), str(report_file)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not report_file.exists():
        pytest.fail(f"Orbax worker failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    report: dict[str, Any] = json.loads(report_file.read_text())
    return report


class Report:
    """A worker report, with the checkpoints it was run on."""

    def __init__(self, report: dict[str, Any], paths: dict[str, Path]):
        self.report = report
        self.paths = paths

    def errors(self, name: str) -> list[str]:
        """The errors of job ``name`` (fails if the job did not run)."""
        assert name in self.report, f"job {name!r} missing from the worker report"
        errs: list[str] = self.report[name]["errors"]
        return errs

    def info(self, name: str) -> dict[str, Any]:
        """The info of job ``name``."""
        info: dict[str, Any] = self.report[name].get("info", {})
        return info


def _numpy_cases(root: Path) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    """Save the NumPy trees here (no JAX in this process) and list the jobs checking them."""
    from ocdbt_py.checkpoint import JsonItem, save

    jobs: list[dict[str, Any]] = []
    paths: dict[str, Path] = {}

    def case(name: str, builder: str, via: str = "pytree", **kw: Any) -> None:
        p = root / name
        save(p, getattr(_trees, builder)(), **kw)
        paths[name] = p
        jobs.append({"name": name, "kind": "restore", "path": str(p), "tree": builder, "via": via})

    case("rich_zarr2", "rich_tree")
    case("rich_zarr3", "rich_tree", use_zarr3=True)
    case("rich_uncompressed", "rich_tree", use_compression=False)
    case("numeric_standard", "numeric_tree", via="standard")
    case("numeric_zarr3_standard", "numeric_tree", via="standard", use_zarr3=True)
    case("chunked", "chunked_tree", chunk_byte_size=4096, ocdbt_target_data_file_size=20000)
    case("chunked_zarr3", "chunked_tree", use_zarr3=True, chunk_byte_size=1000)
    case("target_only", "chunked_tree", ocdbt_target_data_file_size=70000)
    # in place (commit-file mode) through a non-local KvStore wrapper
    from ocdbt_py.kvstore import LocalStore
    from ocdbt_py.testing.faults import FaultyStore

    p = root / "in_place"
    save(FaultyStore(LocalStore(str(p))), _trees.rich_tree())
    paths["in_place"] = p
    jobs.append({"name": "in_place", "kind": "restore", "path": str(p), "tree": "rich_tree", "via": "pytree"})
    # a CheckpointManager root of composite steps, one overwritten with force=True
    mgr = root / "manager"
    for step in (1, 2, 3):
        save(mgr / str(step), {"params": _trees.numeric_tree(), "extra": _trees.rich_tree(),
                               "meta": JsonItem({"step": step, "lr": [0.1, 0.01]})}, composite=True)
    save(mgr / "2", {"params": _trees.chunked_tree(), "extra": _trees.rich_tree(),
                     "meta": JsonItem({"step": 2, "v": 2})}, composite=True, force=True)
    (mgr / "4.orbax-checkpoint-tmp").mkdir()  # an interrupted save: ignored
    paths["manager"] = mgr
    jobs.append({"name": "manager", "kind": "restore", "via": "manager", "path": str(mgr), "steps": [1, 2, 3],
                 "step": 2, "items": {"params": {"tree": "chunked_tree"}, "extra": {"tree": "rich_tree"},
                                      "meta": {"json": {"step": 2, "v": 2}}}})
    single = root / "manager_default"
    save(single / "5", {"default": _trees.numeric_tree()}, composite=True)
    jobs.append({"name": "manager_default", "kind": "restore", "via": "manager", "path": str(single),
                 "steps": [5], "step": 5, "items": {"default": {"tree": "numeric_tree"}}})
    jobs.append({"name": "ts_zarr2", "kind": "tensorstore", "path": str(paths["rich_zarr2"]), "tree": "rich_tree",
                 "arrays": ["big", "dtypes.bfloat16", "dtypes.int4", "layouts.big_endian", "scalars.np_u64"]})
    jobs.append({"name": "ts_zarr3", "kind": "tensorstore", "path": str(paths["rich_zarr3"]), "tree": "rich_tree",
                 "zarr3": True, "arrays": ["big", "dtypes.complex128", "dtypes.float8_e5m2", "zeros_big"]})
    jobs.append({"name": "ts_chunked", "kind": "tensorstore", "path": str(paths["chunked"]),
                 "tree": "chunked_tree", "arrays": ["a", "b", "c"]})
    return jobs, paths


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """Our NumPy-tree checkpoints checked by Orbax/TensorStore, plus the JAX-side jobs."""
    if not have_oracle():
        pytest.skip("orbax-checkpoint, jax and tensorstore are needed for the oracle tests")
    root = tmp_path_factory.mktemp("save_oracle")
    jobs, paths = _numpy_cases(root)
    jobs += [
        {"name": "jax_zarr2", "kind": "jax_layout", "dir": str(root / "jax_zarr2"), "options": {}},
        {"name": "jax_zarr3", "kind": "jax_layout", "dir": str(root / "jax_zarr3"), "options": {"use_zarr3": True}},
        {"name": "jax_chunked", "kind": "jax_layout", "dir": str(root / "jax_chunked"),
         "options": {"chunk_byte_size": 64, "ocdbt_target_data_file_size": 600}},
        {"name": "jax_async", "kind": "jax_async", "path": str(root / "jax_async")},
        {"name": "jax_repeat", "kind": "jax_repeat", "dir": str(root / "jax_repeat")},
        {"name": "jax_pytrees", "kind": "jax_pytrees", "dir": str(root / "jax_pytrees")},
        {"name": "chunk_shapes", "kind": "chunk_shapes", "count": 400},
    ]
    paths["jax_zarr2"] = root / "jax_zarr2" / "ours"
    paths["jax_zarr3"] = root / "jax_zarr3" / "ours"
    paths["jax_async"] = root / "jax_async"
    return Report(run_worker(jobs, root), paths)


def run_mp_save(out: Path, processes: int, devices_per_process: int, timeout: float = 420) -> list[dict[str, Any]]:
    """Run ``_mp_save_worker.py`` in ``processes`` jax.distributed processes; their results."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(HERE / "_mp_save_worker.py"), str(out), str(processes), str(i),
                               str(port), str(devices_per_process)], env=subprocess_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(processes)]
    results = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            if p.returncode != 0:
                pytest.fail(f"process failed ({p.returncode}):\n{e[-5000:]}")
            results.append(json.loads(o.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


@pytest.fixture(scope="session")
def mp_report(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], tuple[Report, Path]]:
    """``mp_report(n)``: an n-process save (then restored by Orbax on other meshes); the
    processes' own results are in ``report.info("processes")``."""
    if not have_oracle():
        pytest.skip("orbax-checkpoint, jax and tensorstore are needed for the multi-process tests")
    cache: dict[int, tuple[Report, Path]] = {}

    def get(n: int) -> tuple[Report, Path]:
        if n not in cache:
            out = tmp_path_factory.mktemp(f"mp{n}")
            results = run_mp_save(out, n, 8 // n)
            job = {"name": f"mp{n}", "kind": "mp_restore", "root": str(out), "processes": n, "manager": True,
                   "paths": [["zarr2", False], ["chunked", False], ["steps/1/state", True],
                                                   ["perparam", False, False], ["perparam3", True, False],
                                                   ["ocp_sync", False], ["ocp_async", False]]}
            report = run_worker([job], out)
            report["processes"] = {"errors": [], "info": {"results": results}}
            cache[n] = (Report(report, {}), out)
        return cache[n]

    return get
