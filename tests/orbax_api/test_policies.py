"""Orbax's policies and options, checked on their own (no storage)."""

from __future__ import annotations

import datetime

import pytest

import ocdbt_py.orbax as ocp
from ocdbt_py.orbax.checkpoint_managers import preservation_policy as pp
from ocdbt_py.orbax.checkpoint_managers import save_decision_policy as sdp
from ocdbt_py.orbax.manager import CheckpointInfo, default_preservation_policy, default_save_decision_policy

T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
CTX = pp.PreservationContext()


def infos(steps, metrics=None, gap=10.0):
    return [CheckpointInfo(s, T0 + datetime.timedelta(seconds=gap * i),
                           None if metrics is None else metrics[i]) for i, s in enumerate(steps)]


def test_names_importable_from_package_and_submodules() -> None:
    cm = ocp.checkpoint_managers
    for name in ("ContinuousCheckpointingPolicy", "FixedIntervalPolicy", "SpecificStepsPolicy",
                 "PreemptionCheckpointingPolicy", "InitialSavePolicy", "AnySavePolicy", "SaveDecisionPolicy",
                 "DecisionContext"):
        assert getattr(cm, name) is getattr(cm.save_decision_policy, name)
    for name in ("LatestN", "EveryNSeconds", "EveryNSteps", "EveryNStepsClosest", "LatestDuration", "BestN",
                 "CustomSteps", "AnyPreservationPolicy", "PreserveAll", "PreservationPolicy", "PreservationContext",
                 "PolicyCheckpointInfo"):
        assert getattr(cm, name) is getattr(cm.preservation_policy, name)
    from ocdbt_py.orbax.checkpoint_managers import CheckpointManagerOptions  # noqa: F401


def test_latest_n_and_every_n_steps() -> None:
    cps = infos(range(6))
    assert pp.LatestN(2).should_preserve(cps, context=CTX) == [False] * 4 + [True] * 2
    assert pp.LatestN().should_preserve(cps, context=CTX) == [True] * 6
    assert pp.EveryNSteps(2).should_preserve(cps, context=CTX) == [True, False] * 3
    assert pp.EveryNSteps(2, max_to_keep=1).should_preserve(cps, context=CTX) == [False] * 4 + [True, False]
    cps = infos([0, 3, 5, 9, 10])
    assert pp.EveryNSteps(4, exact_interval=False).should_preserve(cps, context=CTX) == [True, False, True, True,
                                                                                          False]
    with pytest.raises(ValueError):
        pp.EveryNSteps(0).should_preserve(cps, context=CTX)


def test_every_n_steps_closest_and_seconds() -> None:
    cps = infos([0, 9, 11, 19, 22, 25])
    assert pp.EveryNStepsClosest(10).should_preserve(cps, context=CTX) == [True, False, True, True, False, True]
    cps = infos(range(5), gap=4.0)
    assert pp.EveryNSeconds(interval_secs=8).should_preserve(cps, context=CTX) == [True, False, True, False, True]


def test_best_n_deletes_newest_and_handles_missing_metrics() -> None:
    cps = infos(range(4), [{"l": 3}, None, {"l": 1}, {"l": 5}])
    p = pp.BestN(get_metric_fn=lambda m: m["l"], reverse=True, n=1)  # reverse: lower is better
    assert p.should_preserve(cps, context=CTX) == [False, True, True, False]
    p = pp.BestN(get_metric_fn=lambda m: m["l"], reverse=True, n=1, keep_checkpoints_without_metrics=False)
    assert p.should_preserve(cps, context=CTX) == [False, False, True, False]
    assert pp.BestN(get_metric_fn=lambda m: m["l"], n=0).should_preserve(cps, context=CTX) == [False] * 4


def test_latest_duration_and_any() -> None:
    now = datetime.datetime.now(tz=datetime.timezone.utc)
    cps = [CheckpointInfo(s, now - datetime.timedelta(hours=h), None) for s, h in ((0, 30), (1, 20), (2, 1))]
    assert pp.LatestDuration(datetime.timedelta(hours=24)).should_preserve(cps, context=CTX) == [False, True, True]
    anyp = pp.AnyPreservationPolicy([pp.CustomSteps([0]), pp.LatestN(1)])
    assert anyp.should_preserve(cps, context=CTX) == [True, False, True]


def test_save_decision_policies() -> None:
    ctx = sdp.DecisionContext(is_saving_in_progress=False, reached_preemption=False)
    now = CheckpointInfo(7, T0 + datetime.timedelta(seconds=5), None)
    prev = infos([3])
    assert not sdp.FixedIntervalPolicy(2).should_save(now, prev, context=ctx)
    assert sdp.SpecificStepsPolicy({7}).should_save(now, prev, context=ctx)
    assert sdp.InitialSavePolicy().should_save(now, [], context=ctx)
    assert not sdp.InitialSavePolicy().should_save(now, prev, context=ctx)
    assert sdp.ContinuousCheckpointingPolicy(minimum_interval_secs=5).should_save(now, prev, context=ctx)
    assert not sdp.ContinuousCheckpointingPolicy(minimum_interval_secs=6).should_save(now, prev, context=ctx)
    busy = sdp.DecisionContext(is_saving_in_progress=True, reached_preemption=True)
    assert not sdp.ContinuousCheckpointingPolicy().should_save(now, prev, context=busy)
    assert sdp.PreemptionCheckpointingPolicy().should_save(now, prev, context=busy)
    assert sdp.AnySavePolicy([sdp.FixedIntervalPolicy(2), sdp.SpecificStepsPolicy([7])]).should_save(
        now, prev, context=ctx)


def test_options_build_orbax_default_policies() -> None:
    o = ocp.CheckpointManagerOptions(save_interval_steps=5, save_on_steps=[7], max_to_keep=2, keep_period=10)
    save = default_save_decision_policy(o)
    ctx = sdp.DecisionContext(is_saving_in_progress=False, reached_preemption=False)
    prev = infos([0])
    assert [save.should_save(CheckpointInfo(s, T0, None), prev, context=ctx) for s in (5, 6, 7)] == [True, False,
                                                                                                    True]
    keep = default_preservation_policy(o)
    assert keep.should_preserve(infos([0, 5, 10, 15, 20, 25]), context=CTX) == [True, False, True, False, True, True]
    with pytest.raises(ValueError):
        ocp.CheckpointManagerOptions(best_mode="best")
    with pytest.raises(ValueError):
        ocp.CheckpointManagerOptions(max_to_keep=-1)
    ro = ocp.CheckpointManagerOptions(read_only=True, max_to_keep=3)
    assert ro.max_to_keep is None and ro.save_interval_steps == 0 and ro.create is False


@pytest.mark.parametrize("statement", [
    "from ocdbt_py.orbax.checkpoint_managers import CheckpointManagerOptions",
    "from ocdbt_py.orbax.checkpoint_managers.preservation_policy import BestN",
    "from ocdbt_py.orbax.manager import CheckpointManager",
    "from ocdbt_py.orbax.checkpoint_manager import CheckpointManager",
    "from ocdbt_py.orbax.checkpointers import StandardCheckpointer",
    "import ocdbt_py.orbax as ocp; ocp.checkpoint_managers.AbstractCheckpointManager",
])
def test_every_module_imports_first(statement: str) -> None:
    """No import cycle, whichever module a script imports first."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([repo, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
