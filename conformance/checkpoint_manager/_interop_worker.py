"""The Orbax/JAX side of the CheckpointManager interop tests, run once in a subprocess.

Usage: ``python _interop_worker.py JOBS.json REPORT.json`` (8 forced CPU devices).  The
report maps each job's ``name`` to ``{"errors": [...], "info": {...}}``.  Job kinds:

* ``orbax_reads``: Orbax's ``CheckpointManager`` (read-only, same naming options, ``best_fn``
  matching our ``BestN``) lists a root our manager wrote and restores every step, with
  ``Composite(StandardRestore/JsonRestore)`` args and with no args;
* ``ours_jax``: our manager saves ``jax.Array`` trees sharded over 8 devices, then the
  ``orbax_reads`` checks run on the root and our manager restores onto the same shardings;
* ``orbax_save``: Orbax saves a history of steps (sync/async, naming, retention options,
  commit-file atomicity, zarr3); the report records what Orbax lists afterwards;
* ``mixed``: Orbax and our manager take turns saving steps into one root; both must list
  every step after each save and restore every step.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import _mgr_trees as T  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ocdbt_py.checkpoint import JsonItem  # noqa: E402
from ocdbt_py.checkpoint.manager import BestN, CheckpointManager, KeepAnyOf, LatestN  # noqa: E402

warnings.filterwarnings("ignore")
jax.config.update("jax_enable_x64", True)  # int64/float64 leaves stay 64-bit on device


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def _sharding_for(x: np.ndarray, mesh: Mesh) -> NamedSharding:
    spec: list[str | None] = [None] * x.ndim
    if x.ndim >= 1 and x.shape[0] % 4 == 0:
        spec[0] = "data"
    if x.ndim >= 2 and x.shape[1] % 2 == 0:
        spec[1] = "model"
    return NamedSharding(mesh, P(*spec))


def _shard(tree: Any, mesh: Mesh) -> Any:
    return jax.tree.map(lambda x: jax.device_put(x, _sharding_for(np.asarray(x), mesh)), tree)


def _orbax_options(job: dict[str, Any], **extra: Any) -> ocp.CheckpointManagerOptions:
    kw: dict[str, Any] = {"step_prefix": job.get("prefix"), "step_format_fixed_length": job.get("fixed")}
    best = job.get("best")
    if best:
        metric = best["metric"]
        kw["best_fn"] = lambda m, metric=metric: m[metric]
        kw["best_mode"] = best["mode"]
    kw.update(extra)
    return ocp.CheckpointManagerOptions(**kw)


def _restore_args(items: dict[str, str], with_metrics: bool, abstract: dict[str, Any] | None = None) -> Any:
    args: dict[str, Any] = {}
    for name, kind in items.items():
        if kind == "json":
            args[name] = ocp.args.JsonRestore()
        else:
            args[name] = ocp.args.StandardRestore(abstract.get(name) if abstract else None)
    if with_metrics:
        args["metrics"] = ocp.args.JsonRestore()
    return ocp.args.Composite(**args)


def _plain(x: Any) -> Any:
    if isinstance(x, ocp.args.Composite):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _check_orbax_reads(job: dict[str, Any], *, mesh: Mesh | None = None) -> tuple[list[str], dict[str, Any]]:
    """Orbax lists and restores a root (``job``: root, items, metrics, naming, best)."""
    errs: list[str] = []
    items: dict[str, str] = job["items"]
    with_metrics = bool(job.get("metrics"))
    single = list(items) == ["default"] and not with_metrics
    opts = _orbax_options(job, read_only=True)
    with ocp.CheckpointManager(job["root"], options=opts) as mgr:
        info = {"all_steps": mgr.all_steps(), "latest_step": mgr.latest_step(), "best_step": mgr.best_step()}
        for step in mgr.all_steps():
            want = T.expected(step, items, with_metrics)
            abstract = None
            if mesh is not None:  # restore onto the sharded layout the arrays were saved with
                abstract = {n: jax.tree.map(lambda x: jax.ShapeDtypeStruct(
                    np.shape(x), np.asarray(x).dtype, sharding=_sharding_for(np.asarray(x), mesh)), want[n])
                    for n, k in items.items() if k != "json"}
            if single:  # a single-item manager: the item's own args, the bare tree back
                ab = abstract.get("default") if abstract else None
                got = {"default": _plain(mgr.restore(step, args=ocp.args.StandardRestore(ab)))}
            else:
                got = _plain(mgr.restore(step, args=_restore_args(items, with_metrics, abstract)))
            errs += [f"step {step} (args): {e}" for e in T.compare(got, want)]
            if abstract is not None:
                for n, tree in abstract.items():
                    for leaf, ab in zip(jax.tree.leaves(got[n]), jax.tree.leaves(tree)):
                        if not isinstance(leaf, jax.Array) or not leaf.sharding.is_equivalent_to(
                                ab.sharding, leaf.ndim):
                            errs.append(f"step {step}: {n} leaf not restored with the requested sharding")
            got = _plain(mgr.restore(step))
            if single:
                got = {"default": got}
            errs += [f"step {step} (no args): {e}" for e in T.compare(got, want)]
            if with_metrics:
                m = mgr.metrics(step)
                if m != T.metrics(step):
                    errs.append(f"step {step}: metrics {m} != {T.metrics(step)}")
    return errs, info


def job_orbax_reads(job: dict[str, Any]) -> dict[str, Any]:
    errs, info = _check_orbax_reads(job)
    return {"errors": errs, "info": info}


def _policy(spec: dict[str, Any] | None) -> Any:
    if not spec:
        return None
    policies: list[Any] = []
    if spec.get("latest"):
        policies.append(LatestN(spec["latest"]))
    if spec.get("best"):
        policies.append(BestN(spec["best"]["n"], spec["best"]["metric"], spec["best"]["mode"]))
    return policies[0] if len(policies) == 1 else KeepAnyOf(*policies)


def job_ours_jax(job: dict[str, Any]) -> dict[str, Any]:
    """Our manager saves sharded jax.Arrays; Orbax and we read them back."""
    mesh = _mesh()
    items: dict[str, str] = job["items"]
    with_metrics = bool(job.get("metrics"))
    errs: list[str] = []
    with CheckpointManager(job["root"], async_save=job["async"], step_prefix=job.get("prefix"),
                           step_format_fixed_length=job.get("fixed"), preservation=_policy(job.get("keep")),
                           save_options={"use_zarr3": job.get("zarr3", False)}) as mgr:
        for step in job["steps"]:
            want = T.expected(step, items, False)
            tree = {n: (JsonItem(v) if items[n] == "json" else _shard(v, mesh)) for n, v in want.items()}
            started = mgr.save(step, tree, metrics=T.metrics(step) if with_metrics else None)
            if not started:
                errs.append(f"save({step}) returned False")
            del tree  # async: the arrays may go away once save() returned
        mgr.wait_until_finished()
        ours = {"all_steps": mgr.all_steps(), "latest_step": mgr.latest_step(), "best_step": mgr.best_step()}
        for step in mgr.all_steps():  # our restore onto JAX targets with the saved shardings
            want = T.expected(step, items, with_metrics)
            target = {n: jax.tree.map(lambda x: jax.ShapeDtypeStruct(
                np.shape(x), np.asarray(x).dtype, sharding=_sharding_for(np.asarray(x), mesh)), want[n])
                for n, k in items.items() if k != "json"}
            got = mgr.restore(step, items=list(target), target=target)
            for n in target:
                errs += [f"ours step {step}: {e}" for e in T.compare(got[n], want[n])]
                if not all(isinstance(x, jax.Array) for x in jax.tree.leaves(got[n])):
                    errs.append(f"ours step {step}: {n} not restored as jax.Array")
    more, info = _check_orbax_reads(job, mesh=mesh)
    errs += more
    if info != ours:
        errs.append(f"Orbax lists {info}, we list {ours}")
    return {"errors": errs, "info": {**info, "ours": ours}}


def _save_args(step: int, items: dict[str, str]) -> Any:
    want = T.expected(step, items, False)
    if list(items) == ["default"]:
        return ocp.args.StandardSave(want["default"])
    return ocp.args.Composite(**{n: (ocp.args.JsonSave(v) if items[n] == "json" else ocp.args.StandardSave(v))
                                 for n, v in want.items()})


def job_orbax_save(job: dict[str, Any]) -> dict[str, Any]:
    """Orbax saves ``steps``; the report records what it lists (and keeps) afterwards."""
    items: dict[str, str] = job["items"]
    extra: dict[str, Any] = {"enable_async_checkpointing": job.get("async", False)}
    for k in ("max_to_keep", "keep_period"):
        if job.get(k) is not None:
            extra[k] = job[k]
    if job.get("commit_file"):
        extra["atomicity_options"] = ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)
    handlers = None
    if job.get("zarr3"):
        handlers = {n: ocp.JsonCheckpointHandler() if k == "json" else ocp.PyTreeCheckpointHandler(use_zarr3=True)
                    for n, k in items.items()}
    opts = _orbax_options(job, **extra)
    errs: list[str] = []
    with ocp.CheckpointManager(job["root"], options=opts, item_handlers=handlers) as mgr:
        for step in job["steps"]:
            args = _save_args(step, items)
            if job.get("zarr3"):
                args = ocp.args.Composite(**{n: (ocp.args.PyTreeSave(v.item) if isinstance(v, ocp.args.StandardSave)
                                                  else v) for n, v in args.items()})
            ok = mgr.save(step, args=args, metrics=T.metrics(step) if job.get("metrics") else None)
            if not ok:
                errs.append(f"Orbax did not save step {step}")
        mgr.wait_until_finished()
        info = {"all_steps": mgr.all_steps(), "latest_step": mgr.latest_step(), "best_step": mgr.best_step()}
    return {"errors": errs, "info": info}


def job_mixed(job: dict[str, Any]) -> dict[str, Any]:
    """Orbax and our manager alternate saving steps into one root."""
    items: dict[str, str] = job["items"]
    errs: list[str] = []
    theirs = ocp.CheckpointManager(job["root"], options=_orbax_options(job, enable_async_checkpointing=job["async"]))
    ours = CheckpointManager(job["root"], async_save=job["async"], step_prefix=job.get("prefix"),
                             step_format_fixed_length=job.get("fixed"),
                             preservation=_policy(job.get("keep")))
    writers: list[str] = []
    for i, step in enumerate(job["steps"]):
        theirs.reload()
        ours.reload()
        if i % 2 == 0:
            ok = theirs.save(step, args=_save_args(step, items), metrics=T.metrics(step))
            theirs.wait_until_finished()
            writers.append("orbax")
        else:
            want = T.expected(step, items, False)
            ok = ours.save(step, {n: JsonItem(v) if items[n] == "json" else v for n, v in want.items()},
                           metrics=T.metrics(step))
            ours.wait_until_finished()
            writers.append("ours")
        if not ok:
            errs.append(f"{writers[-1]} did not save step {step}")
        theirs.reload()
        ours.reload()
        seen = list(job["steps"][: i + 1])
        if theirs.all_steps() != seen or ours.all_steps() != seen:
            errs.append(f"after step {step}: Orbax lists {theirs.all_steps()}, we list {ours.all_steps()}, "
                        f"saved {seen}")
    for step in job["steps"]:
        want = T.expected(step, items, True)
        errs += [f"Orbax restore {step}: {e}" for e in T.compare(_plain(theirs.restore(step)), want)]
        errs += [f"our restore {step}: {e}" for e in T.compare(ours.restore(step), want)]
    best = job.get("best")
    our_best = ours.best_step(best["metric"], best["mode"]) if best else ours.best_step()
    info = {"orbax": {"all_steps": theirs.all_steps(), "best_step": theirs.best_step()},
            "ours": {"all_steps": ours.all_steps(), "best_step": our_best}, "writers": writers}
    theirs.close()
    ours.close()
    return {"errors": errs, "info": info}


JOBS = {"orbax_reads": job_orbax_reads, "ours_jax": job_ours_jax, "orbax_save": job_orbax_save, "mixed": job_mixed}


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    report: dict[str, Any] = {}
    for job in jobs:
        try:
            report[job["name"]] = JOBS[job["kind"]](job)
        except Exception:  # noqa: BLE001 - reported per job
            report[job["name"]] = {"errors": [traceback.format_exc()], "info": {}}
    Path(sys.argv[2]).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
