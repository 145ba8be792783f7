"""Save decision and preservation policies, and step names, on their own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ocdbt_py.checkpoint.manager import preservation as keep
from ocdbt_py.checkpoint.manager import save_policy as sp
from ocdbt_py.checkpoint.manager.naming import StepNameFormat


def ctx(step: int, now: float = 1000.0, previous: tuple[sp.SavedStep, ...] = (), in_progress: bool = False,
        preempted: bool = False) -> sp.SaveContext:
    return sp.SaveContext(step, now, previous, in_progress, preempted)


def saved(step: int, start: float, commit: float | None = None) -> sp.SavedStep:
    return sp.SavedStep(step, start, commit)


# ---- save decisions ---------------------------------------------------------------------------

def test_fixed_interval() -> None:
    p = sp.FixedInterval(5)
    assert [s for s in range(23) if p.should_save(ctx(s))] == [0, 5, 10, 15, 20]
    assert sp.is_deterministic(p)
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError):
            sp.FixedInterval(bad)  # type: ignore[arg-type]


def test_specific_steps() -> None:
    p = sp.SpecificSteps([3, 7, 7, 100])
    assert [s for s in range(200) if p.should_save(ctx(s))] == [3, 7, 100]


def test_every_n_seconds_counts_from_the_last_save_start() -> None:
    p = sp.EveryNSeconds(60)
    assert not sp.is_deterministic(p)
    assert p.should_save(ctx(0))  # nothing saved yet
    prev = (saved(0, 1000.0, 1030.0),)
    assert not p.should_save(ctx(1, now=1059.9, previous=prev))
    assert p.should_save(ctx(1, now=1060.0, previous=prev))
    with pytest.raises(ValueError):
        sp.EveryNSeconds(0)


def test_continuous_never_two_in_flight_and_respects_minimum_interval() -> None:
    p = sp.Continuous()
    assert p.should_save(ctx(0))
    prev = (saved(0, 1000.0, None),)
    assert not p.should_save(ctx(1, now=5000.0, previous=prev, in_progress=True))
    assert p.should_save(ctx(1, now=1000.1, previous=(saved(0, 1000.0, 1000.05),)))
    q = sp.Continuous(minimum_interval_secs=30)
    done = (saved(0, 1000.0, 1001.0),)
    assert not q.should_save(ctx(1, now=1029.0, previous=done))
    assert q.should_save(ctx(1, now=1030.0, previous=done))
    assert not q.should_save(ctx(1, now=1030.0, previous=done, in_progress=True))


def test_initial_save_and_preemption() -> None:
    assert sp.InitialSave().should_save(ctx(17))
    assert not sp.InitialSave().should_save(ctx(17, previous=(saved(3, 1.0, 2.0),)))
    assert sp.Preemption().should_save(ctx(5, preempted=True))
    assert not sp.Preemption().should_save(ctx(5))


def test_any_of_combines_and_flattens() -> None:
    p = sp.AnyOf(sp.FixedInterval(10), [sp.SpecificSteps([3]), sp.InitialSave()])
    assert [s for s in range(25) if p.should_save(ctx(s, previous=(saved(0, 0, 1),)))] == [0, 3, 10, 20]
    assert p.should_save(ctx(7))  # InitialSave: nothing saved yet
    assert p.deterministic
    assert not sp.AnyOf(sp.FixedInterval(10), sp.Continuous()).deterministic
    nested = sp.AnyOf(sp.AnyOf(sp.Preemption()), sp.FixedInterval(2))
    assert sp.uses(nested, sp.Preemption) and not sp.uses(nested, sp.Continuous)
    with pytest.raises(ValueError):
        sp.AnyOf()
    with pytest.raises(TypeError):
        sp.AnyOf(sp.FixedInterval(1), object())  # type: ignore[arg-type]


def test_custom_policy_is_treated_as_local_state() -> None:
    class Odd:
        def should_save(self, c: sp.SaveContext) -> bool:
            return c.step % 2 == 1

    assert isinstance(Odd(), sp.SavePolicy)
    assert not sp.is_deterministic(Odd())
    assert sp.AnyOf(Odd()).should_save(ctx(3))


# ---- preservation -----------------------------------------------------------------------------

def infos(*steps: int, losses: dict[int, float] | None = None, times: dict[int, float] | None = None
          ) -> list[keep.StepInfo]:
    out = []
    for s in steps:
        m = None if losses is None or s not in losses else {"loss": losses[s]}
        out.append(keep.StepInfo(s, (times or {}).get(s, float(s)), m))
    return out


def test_latest_n() -> None:
    assert keep.LatestN(2).keep(infos(0, 5, 3, 9)) == {5, 9}
    assert keep.LatestN(10).keep(infos(0, 1)) == {0, 1}
    assert keep.LatestN(5).keep(infos(0, 1, 2)) == {0, 1, 2}
    assert keep.LatestN(0).keep(infos(0, 1)) == set()
    with pytest.raises(ValueError):
        keep.LatestN(-1)


def test_every_n_steps() -> None:
    assert keep.EveryNSteps(4).keep(infos(*range(13))) == {0, 4, 8, 12}
    assert keep.EveryNSteps(4, max_to_keep=2).keep(infos(*range(13))) == {8, 12}
    assert keep.EveryNSteps(4, max_to_keep=0).keep(infos(*range(13))) == set()
    assert keep.EveryNSteps(4, max_to_keep=5).keep(infos(*range(9))) == {0, 4, 8}


def test_every_n_seconds_keeps_one_per_period() -> None:
    times = {0: 0.0, 1: 10.0, 2: 59.0, 3: 61.0, 4: 100.0, 5: 125.0, 6: 300.0}
    assert keep.EveryNSeconds(60).keep(infos(*times, times=times)) == {0, 3, 5, 6}  # 125 - 61 >= 60


def test_best_n_min_and_max() -> None:
    losses = {0: 5.0, 1: 3.0, 2: 4.0, 3: 1.0, 4: 2.0}
    st = infos(*losses, losses=losses)
    assert keep.BestN(2, "loss").keep(st) == {3, 4}
    assert keep.BestN(2, "loss", mode="max").keep(st) == {0, 2}
    assert keep.BestN(1, lambda m: -m["loss"], mode="min").keep(st) == {0}
    assert [s.step for s in keep.BestN(5, "loss").ranked(st)] == [3, 4, 1, 2, 0]


def test_best_n_ties_prefer_newer_and_missing_metrics() -> None:
    st = infos(0, 1, 2, 3, losses={0: 1.0, 1: 1.0, 2: math.nan})
    assert keep.BestN(1, "loss").keep(st) == {1, 2, 3}  # 2 (NaN) and 3 (none) are kept unranked
    assert keep.BestN(1, "loss", keep_checkpoints_without_metrics=False).keep(st) == {1}
    numpy_metric = [keep.StepInfo(0, 0.0, {"loss": np.float32(0.5)}), keep.StepInfo(1, 1.0, {"loss": "bad"})]
    assert keep.BestN(1, "loss", keep_checkpoints_without_metrics=False).keep(numpy_metric) == {0}
    with pytest.raises(ValueError):
        keep.BestN(1, "loss", mode="lowest")
    with pytest.raises(TypeError):
        keep.BestN(1, 3)  # type: ignore[arg-type]


def test_preservation_any_of_is_a_union() -> None:
    losses = {0: 9.0, 1: 8.0, 2: 1.0, 3: 7.0, 4: 6.0, 5: 2.0}
    p = keep.AnyOf(keep.EveryNSteps(4), keep.BestN(2, "loss"))
    assert p.keep(infos(*losses, losses=losses)) == {0, 2, 4, 5}
    assert keep.AnyOf(keep.LatestN(1), keep.CustomSteps([0, 77])).keep(infos(0, 1, 2)) == {0, 2}
    assert keep.PreserveAll().keep(infos(1, 2)) == {1, 2}
    with pytest.raises(TypeError):
        keep.AnyOf(keep.LatestN(1), "x")  # type: ignore[arg-type]


# ---- names ------------------------------------------------------------------------------------

def test_plain_step_names() -> None:
    f = StepNameFormat()
    assert f.name(12) == "12" and f.parse("12") == 12 and f.parse("0") == 0
    for bad in ("012", "12a", "", "-1", "1.orbax-checkpoint-tmp", "١٢", "ckpt_12"):
        assert f.parse(bad) is None, bad
    with pytest.raises(ValueError):
        f.name(-1)


def test_prefixed_fixed_length_names_follow_orbax() -> None:
    f = StepNameFormat("ckpt", 6)
    assert f.name(12) == "ckpt_000012"
    assert f.parse("ckpt_000012") == 12
    assert f.parse("ckpt_1234567") == 1234567  # outgrew the padding
    for bad in ("ckpt_12", "ckpt_0123456", "other_000012", "000012", "ckpt_000012.orbax-checkpoint-tmp"):
        assert f.parse(bad) is None, bad
    for name in ("ckpt_000012", "ckpt_1234567", "ckpt_12", "ckpt_0123456"):
        assert bool(f.pattern.match(name)) == (f.parse(name) is not None)
    with pytest.raises(ValueError):
        StepNameFormat("a/b")
    with pytest.raises(ValueError):
        StepNameFormat(None, 0)
