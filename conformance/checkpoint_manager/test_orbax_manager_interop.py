"""Step directories stay interchangeable with Orbax's ``CheckpointManager`` in both directions.

One subprocess (``_interop_worker.py``: JAX on 8 CPU devices, orbax-checkpoint 0.12.8) does
the Orbax side of everything; this process (NumPy only) does ours:

(a) our manager saves NumPy trees here (and sharded ``jax.Array`` trees in the worker):
    composite pytree items, a ``JsonItem`` and metrics, with and without step prefixes and
    fixed-length names, zarr3 on and off, sync and async, with retention.  Orbax's manager
    (same naming options, ``best_fn``/``best_mode`` matching our ``BestN``) must list the same
    ``all_steps()``/``latest_step()``/``best_step()`` and restore every item exactly, with
    ``Composite(StandardRestore/JsonRestore)`` args and with no args;
(b) Orbax saves (sync, async, commit-file atomicity, zarr3, single-item, prefixes,
    ``max_to_keep``/``best_fn``/``keep_period``): our read-only and writable managers list the
    same steps and best step and restore exactly; our retention applied to an Orbax-written
    root deletes what Orbax's own options delete on the same history;
(c) Orbax and our manager take turns saving steps into one root; both see every step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _mgr_trees as T  # noqa: E402

from ocdbt_py.checkpoint import JsonItem  # noqa: E402
from ocdbt_py.checkpoint.manager import (  # noqa: E402
    BestN,
    CheckpointManager,
    EveryNSteps,
    KeepAnyOf,
    LatestN,
)

pytestmark = [pytest.mark.orbax, pytest.mark.timeout(900)]

FULL = {"params": "params", "opt_state": "opt_state", "config": "json"}
TWO = {"params": "params", "config": "json"}

#: Roots our manager writes in this process (NumPy trees), then Orbax reads.
#: ``keep``: our preservation policy; ``best``: the matching Orbax best_fn/best_mode;
#: ``expect``: the steps that must remain.
OURS: dict[str, dict[str, Any]] = {
    "np_plain_sync_zarr2_best3": dict(items=FULL, metrics=True, steps=range(6), async_save=False, zarr3=False,
                                      keep=BestN(3, "loss", "min"), best={"metric": "loss", "mode": "min"},
                                      expect=[2, 4, 5], best_step=5),
    "np_prefix_fixed_async_zarr3_bestacc": dict(prefix="ckpt", fixed=6, items=FULL, metrics=True, steps=range(5),
                                                async_save=True, zarr3=True, keep=BestN(2, "acc", "max"),
                                                best={"metric": "acc", "mode": "max"}, expect=[3, 4], best_step=3),
    "np_prefix_async_latest2": dict(prefix="step", items=TWO, metrics=False, steps=range(5), async_save=True,
                                    zarr3=False, keep=LatestN(2), expect=[3, 4], best_step=4),
    "np_fixed_default_item": dict(fixed=3, items={"default": "params"}, metrics=False, steps=[0, 7, 12],
                                  async_save=False, zarr3=True, keep=None, expect=[0, 7, 12], best_step=12),
    # the reference example: keep_period=4 keeps 0 and 4, best-2 by loss are 2 and 5
    "np_reference_example": dict(items=TWO, metrics=True, steps=range(6), async_save=True, zarr3=False,
                                 keep=KeepAnyOf(EveryNSteps(4), BestN(2, "loss", "min")),
                                 best={"metric": "loss", "mode": "min"}, expect=[0, 2, 4, 5], best_step=5),
}

#: Our manager saving sharded jax.Arrays (in the worker).
OURS_JAX: dict[str, dict[str, Any]] = {
    "jax_sync_zarr2_best2": dict(items=TWO, metrics=True, steps=[0, 1, 2, 3], **{"async": False}, zarr3=False,
                                 keep={"best": {"n": 2, "metric": "loss", "mode": "min"}},
                                 best={"metric": "loss", "mode": "min"}, expect=[2, 3], best_step=2),
    "jax_async_zarr3_prefix": dict(prefix="ckpt", fixed=4, items=FULL, metrics=True, steps=[0, 2, 4],
                                   **{"async": True}, zarr3=True, best={"metric": "acc", "mode": "max"},
                                   expect=[0, 2, 4], best_step=4),
}

#: Orbax saving (in the worker); ``expect`` is what Orbax keeps and we must list.
ORBAX: dict[str, dict[str, Any]] = {
    "orbax_sync_best3": dict(items=TWO, metrics=True, steps=list(range(6)), max_to_keep=3,
                             best={"metric": "loss", "mode": "min"}, expect=[2, 4, 5], best_step=5),
    "orbax_async_prefix_bestacc": dict(prefix="ckpt", fixed=6, items=FULL, metrics=True, steps=list(range(6)),
                                       max_to_keep=2, best={"metric": "acc", "mode": "max"}, expect=[3, 4],
                                       best_step=3, **{"async": True}),
    "orbax_commit_file_default": dict(prefix="step", items={"default": "params"}, metrics=False,
                                      steps=[0, 1, 2, 3], max_to_keep=2, commit_file=True, expect=[2, 3],
                                      best_step=3),
    "orbax_zarr3_fixed": dict(fixed=3, items=TWO, metrics=True, steps=[0, 1, 2], zarr3=True, expect=[0, 1, 2],
                              best={"metric": "acc", "mode": "max"}, best_step=1, **{"async": True}),
    # the same 6-step history with Orbax's retention options (the references) ...
    "ref_latest2": dict(items=TWO, metrics=True, steps=list(range(6)), max_to_keep=2, expect=[4, 5], best_step=5),
    "ref_best2_loss": dict(items=TWO, metrics=True, steps=list(range(6)), max_to_keep=2,
                           best={"metric": "loss", "mode": "min"}, expect=[2, 5], best_step=5),
    "ref_best3_acc": dict(items=TWO, metrics=True, steps=list(range(6)), max_to_keep=3,
                          best={"metric": "acc", "mode": "max"}, expect=[3, 4, 5], best_step=3),
    "ref_example": dict(items=TWO, metrics=True, steps=list(range(6)), max_to_keep=2, keep_period=4,
                        best={"metric": "loss", "mode": "min"}, expect=[0, 2, 4, 5], best_step=5),
    "ref_best2_acc": dict(items=TWO, metrics=True, steps=list(range(6)), max_to_keep=2,
                          best={"metric": "acc", "mode": "max"}, expect=[3, 4], best_step=3),
    # ... and its first five steps without retention, which our manager then continues (Orbax
    # writes metrics only when it has a best_fn)
    "history_src": dict(items=TWO, metrics=True, steps=list(range(5)), best={"metric": "loss", "mode": "min"},
                        expect=[0, 1, 2, 3, 4], best_step=2),
}

#: Our policy for each Orbax reference.
OUR_RETENTION: dict[str, Any] = {
    "ref_latest2": LatestN(2),
    "ref_best2_loss": BestN(2, "loss", "min"),
    "ref_best3_acc": BestN(3, "acc", "max"),
    "ref_example": KeepAnyOf(EveryNSteps(4), BestN(2, "loss", "min")),
    "ref_best2_acc": BestN(2, "acc", "max"),
}

MIXED: dict[str, dict[str, Any]] = {
    "mixed_sync": dict(items=TWO, steps=list(range(6)), best={"metric": "acc", "mode": "max"}, **{"async": False}),
    "mixed_async_prefix": dict(prefix="ckpt", fixed=4, items=TWO, steps=[0, 3, 5, 6, 9],
                               best={"metric": "loss", "mode": "min"}, **{"async": True}),
}


def _have_oracle() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("jax", "orbax.checkpoint", "tensorstore"))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop("XLA_FLAGS", None)
    return env


def _our_items(step: int, items: dict[str, str]) -> dict[str, Any]:
    want = T.expected(step, items, False)
    return {n: JsonItem(v) if items[n] == "json" else v for n, v in want.items()}


def _naming(case: dict[str, Any]) -> dict[str, Any]:
    return {"step_prefix": case.get("prefix"), "step_format_fixed_length": case.get("fixed")}


class Interop:
    """The roots of every case and the worker's report."""

    def __init__(self, base: Path, report: dict[str, Any]):
        self.base = base
        self.report = report

    def root(self, name: str) -> Path:
        return self.base / name

    def errors(self, name: str) -> list[str]:
        assert name in self.report, f"job {name!r} missing from the worker report"
        errs: list[str] = self.report[name]["errors"]
        return errs

    def info(self, name: str) -> dict[str, Any]:
        info: dict[str, Any] = self.report[name]["info"]
        return info


@pytest.fixture(scope="module")
def interop(tmp_path_factory: pytest.TempPathFactory) -> Interop:
    if not _have_oracle():
        pytest.skip("orbax-checkpoint, jax and tensorstore are needed")
    base = tmp_path_factory.mktemp("manager_interop")
    jobs: list[dict[str, Any]] = []
    for name, case in OURS.items():  # (a) ours, NumPy, in this process
        root = base / name
        with CheckpointManager(root, async_save=case["async_save"], preservation=case["keep"],
                               save_options={"use_zarr3": case["zarr3"]}, **_naming(case)) as mgr:
            for step in case["steps"]:
                assert mgr.save(step, _our_items(step, case["items"]),
                                metrics=T.metrics(step) if case["metrics"] else None)
        jobs.append({"name": name, "kind": "orbax_reads", "root": str(root), **_job_fields(case)})
    for name, case in OURS_JAX.items():
        jobs.append({"name": name, "kind": "ours_jax", "root": str(base / name), **case})
    for name, case in ORBAX.items():
        jobs.append({"name": name, "kind": "orbax_save", "root": str(base / name), **case})
    for name, case in MIXED.items():
        jobs.append({"name": name, "kind": "mixed", "root": str(base / name), **case})
    jobs_file, report_file = base / "jobs.json", base / "report.json"
    jobs_file.write_text(json.dumps(jobs, default=list))
    proc = subprocess.run([sys.executable, str(HERE / "_interop_worker.py"), str(jobs_file), str(report_file)],
                          env=_env(), capture_output=True, text=True, timeout=800)
    if proc.returncode != 0 or not report_file.exists():
        pytest.fail(f"interop worker failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    report = json.loads(report_file.read_text())
    assert sorted(report) == sorted(j["name"] for j in jobs)
    return Interop(base, report)


def _job_fields(case: dict[str, Any]) -> dict[str, Any]:
    keys = ("prefix", "fixed", "items", "metrics", "best")
    return {k: case[k] for k in keys if k in case}


# -- (a) we save, Orbax lists and restores --------------------------------------------------------
@pytest.mark.parametrize("name", list(OURS))
def test_orbax_lists_and_restores_our_numpy_steps(interop: Interop, name: str) -> None:
    case = OURS[name]
    assert interop.errors(name) == []
    info = interop.info(name)
    assert info["all_steps"] == case["expect"]
    assert info["latest_step"] == case["expect"][-1]
    assert info["best_step"] == case["best_step"]
    with CheckpointManager(interop.root(name), read_only=True, preservation=case["keep"], **_naming(case)) as mgr:
        assert mgr.all_steps() == info["all_steps"]
        assert mgr.latest_step() == info["latest_step"]
        assert mgr.best_step() == info["best_step"]


@pytest.mark.parametrize("name", list(OURS_JAX))
def test_orbax_lists_and_restores_our_sharded_jax_steps(interop: Interop, name: str) -> None:
    case = OURS_JAX[name]
    assert interop.errors(name) == []
    info = interop.info(name)
    assert info["all_steps"] == case["expect"]
    assert info["best_step"] == case["best_step"]
    assert info["ours"] == {k: info[k] for k in ("all_steps", "latest_step", "best_step")}


def test_our_steps_carry_orbax_layout(interop: Interop) -> None:
    """What Orbax's listing keys on: names, markers, ``_CHECKPOINT_METADATA`` handlers."""
    root = interop.root("np_prefix_fixed_async_zarr3_bestacc")
    assert sorted(p.name for p in root.iterdir()) == ["ckpt_000003", "ckpt_000004"]
    step = root / "ckpt_000004"
    assert (step / "commit_success.txt").is_file()
    meta = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    assert set(meta["item_handlers"]) == {"params", "opt_state", "config", "metrics"}
    assert "JsonCheckpointHandler" in meta["item_handlers"]["metrics"]
    assert json.loads((step / "metrics" / "metrics").read_text()) == T.metrics(4)
    assert meta["commit_timestamp_nsecs"] >= meta["init_timestamp_nsecs"] > 0


@pytest.mark.parametrize(("name", "step", "zarr3"), [
    ("np_prefix_fixed_async_zarr3_bestacc", "ckpt_000004", True),
    ("np_plain_sync_zarr2_best3", "5", False),
    ("jax_async_zarr3_prefix", "ckpt_0004", True),
    ("jax_sync_zarr2_best2", "3", False),
    ("orbax_zarr3_fixed", "002", True),
])
def test_zarr_version_as_requested(interop: Interop, name: str, step: str, zarr3: bool) -> None:
    import ocdbt_py

    keys = [k.decode() for k in ocdbt_py.open(interop.root(name) / step / "params").list()]
    assert any(k.endswith("/zarr.json") for k in keys) == zarr3
    assert any(k.endswith("/.zarray") for k in keys) == (not zarr3)


# -- (b) Orbax saves, we list and restore -----------------------------------------------------------
def _check_our_view(mgr: CheckpointManager, case: dict[str, Any]) -> None:
    assert mgr.all_steps() == case["expect"]
    assert mgr.latest_step() == case["expect"][-1]
    assert mgr.best_step() == case["best_step"]
    single = list(case["items"]) == ["default"]
    for step in mgr.all_steps():
        want = T.expected(step, case["items"], case["metrics"])
        got = mgr.restore(step)
        assert T.compare({"default": got} if single else got, want) == []
        for item in want:
            assert T.compare(mgr.restore(step, items=item), want[item]) == [], item
        if case["metrics"]:
            assert mgr.metrics(step) == T.metrics(step)
            assert T.compare(mgr.restore(step, items=["metrics", *case["items"]]), want) == []
        else:
            assert mgr.metrics(step) is None
    last = T.expected(case["expect"][-1], case["items"], case["metrics"])
    got = mgr.restore()
    assert T.compare({"default": got} if single else got, last) == []


def _our_best(case: dict[str, Any]) -> BestN | None:
    best = case.get("best")
    return BestN(case.get("max_to_keep") or 1, best["metric"], best["mode"]) if best else None


@pytest.mark.parametrize("name", [n for n in ORBAX if not n.startswith("ref_")])
def test_we_list_and_restore_orbax_steps_read_only(interop: Interop, name: str) -> None:
    case = ORBAX[name]
    assert interop.errors(name) == []
    info = interop.info(name)
    assert info["all_steps"] == case["expect"] and info["best_step"] == case["best_step"]
    with CheckpointManager(interop.root(name), read_only=True, preservation=_our_best(case),
                           **_naming(case)) as mgr:
        _check_our_view(mgr, case)


@pytest.mark.parametrize("name", [n for n in ORBAX if not n.startswith("ref_")])
def test_we_list_and_restore_orbax_steps_writable(interop: Interop, name: str, tmp_path: Path) -> None:
    """A writable manager (cleanup on) opens an Orbax root without touching its steps."""
    case = ORBAX[name]
    root = tmp_path / name
    shutil.copytree(interop.root(name), root)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with CheckpointManager(root, preservation=_our_best(case), **_naming(case)) as mgr:
        _check_our_view(mgr, case)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_orbax_commit_file_step_without_marker_is_not_ours(interop: Interop, tmp_path: Path) -> None:
    """Orbax's COMMIT_FILE mode writes in place: a step missing its marker is unfinished."""
    case = ORBAX["orbax_commit_file_default"]
    root = tmp_path / "cf"
    shutil.copytree(interop.root("orbax_commit_file_default"), root)
    (root / "step_3" / "commit_success.txt").unlink()
    with CheckpointManager(root, read_only=True, **_naming(case)) as mgr:
        assert mgr.all_steps() == [2]


@pytest.mark.parametrize("ref", list(OUR_RETENTION))
def test_our_retention_on_orbax_root_matches_orbax(interop: Interop, ref: str, tmp_path: Path) -> None:
    """Orbax wrote steps 0-4 with no retention; our manager saves step 5 with the policy that
    mirrors Orbax's options.  The steps left equal those Orbax's own options left on the same
    six-step history, except that we never delete the newest step (see ``ref_best2_acc``)."""
    assert interop.errors("history_src") == [] and interop.errors(ref) == []
    root = tmp_path / "root"
    shutil.copytree(interop.root("history_src"), root)
    orbax_kept = interop.info(ref)["all_steps"]
    assert orbax_kept == ORBAX[ref]["expect"]
    with CheckpointManager(root, preservation=OUR_RETENTION[ref]) as mgr:
        assert mgr.all_steps() == [0, 1, 2, 3, 4]
        assert mgr.save(5, _our_items(5, TWO), metrics=T.metrics(5))
        mgr.wait_until_finished()
        kept = mgr.all_steps()
        assert mgr.best_step() == interop.info(ref)["best_step"]
    assert sorted(int(p.name) for p in root.iterdir()) == kept  # deleted from disk, no leftovers
    if ref == "ref_best2_acc":
        # Orbax deletes the newest step when it is not among the best; we keep it by design
        assert 5 not in orbax_kept and kept == sorted({*orbax_kept, 5})
    else:
        assert kept == orbax_kept
    for step in kept:
        with CheckpointManager(root, read_only=True) as mgr:
            assert T.compare(mgr.restore(step), T.expected(step, TWO, True)) == []


def test_reference_example_same_as_orbax(interop: Interop) -> None:
    """orbax-layout.md section 5: max_to_keep=2, keep_period=4, best_fn=loss, best_mode='min'
    over 6 steps keeps [0, 2, 4, 5]; ``KeepAnyOf(EveryNSteps(4), BestN(2, 'loss'))`` too."""
    assert interop.info("ref_example")["all_steps"] == [0, 2, 4, 5]
    assert interop.info("np_reference_example")["all_steps"] == [0, 2, 4, 5]
    assert sorted(int(p.name) for p in interop.root("np_reference_example").iterdir()) == [0, 2, 4, 5]


# -- (c) mixed writers --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MIXED))
def test_orbax_and_we_alternate_in_one_root(interop: Interop, name: str) -> None:
    case = MIXED[name]
    assert interop.errors(name) == []
    info = interop.info(name)
    assert info["writers"] == ["orbax", "ours"] * (len(case["steps"]) // 2) + ["orbax"] * (len(case["steps"]) % 2)
    assert info["orbax"]["all_steps"] == info["ours"]["all_steps"] == case["steps"]
    if case.get("best"):
        assert info["orbax"]["best_step"] == info["ours"]["best_step"]
    with CheckpointManager(interop.root(name), read_only=True, **_naming(case)) as mgr:
        assert mgr.all_steps() == case["steps"]
        for step in case["steps"]:
            assert T.compare(mgr.restore(step), T.expected(step, case["items"], True)) == []
