"""Issue 28 item 1: one family of save and preservation policies (the native one), Orbax's
classes as faces of it, one definition of each shared name."""

from __future__ import annotations

import ast
import datetime
from pathlib import Path

import ocdbt_py
from ocdbt_py.checkpoint.manager import preservation as native_keep
from ocdbt_py.checkpoint.manager.manager import StepAlreadyExistsError
from ocdbt_py.checkpoint.manager.save_policy import SaveContext, SavedStep
from ocdbt_py.orbax import emergency, options
from ocdbt_py.orbax import preservation as pp
from ocdbt_py.orbax import save_decision as sdp
from ocdbt_py.orbax.checkpoint_manager import CheckpointInfo
from ocdbt_py.orbax.checkpoint_manager import StepAlreadyExistsError as OrbaxStepAlreadyExistsError

SRC = Path(ocdbt_py.__file__).resolve().parent
T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)


def _classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(str(f.relative_to(SRC)))
    return found


def test_each_shared_name_is_defined_once() -> None:
    classes = _classes()
    for name in ("MultiprocessingOptions", "StepAlreadyExistsError", "CheckpointInfo"):
        assert len(classes.get(name, [])) == 1, (name, classes.get(name))
    assert emergency.MultiprocessingOptions is options.MultiprocessingOptions
    assert OrbaxStepAlreadyExistsError is StepAlreadyExistsError
    assert issubclass(StepAlreadyExistsError, ValueError)


def test_orbax_managers_keep_no_step_list_or_thread_of_their_own() -> None:
    """The Orbax-facing managers hand policies to the native managers: no threads of their own."""
    for module in ("orbax/manager.py", "orbax/emergency.py"):
        tree = ast.parse((SRC / module).read_text(encoding="utf-8"))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "threading" not in imported, module


def _infos(steps: list[int]) -> list[CheckpointInfo]:
    return [CheckpointInfo(s, T0 + datetime.timedelta(seconds=10 * i)) for i, s in enumerate(steps)]


def test_orbax_policies_answer_as_the_native_ones_they_wrap() -> None:
    cps = _infos([0, 3, 5, 9, 10, 12])
    ctx = pp.PreservationContext()
    native = pp.step_infos(cps)
    pairs = [(pp.LatestN(2), native_keep.LatestN(2)),
             (pp.EveryNSteps(3), native_keep.EveryNSteps(3)),
             (pp.EveryNSteps(4, exact_interval=False), native_keep.EveryNSteps(4, exact=False)),
             (pp.EveryNStepsClosest(5), native_keep.NearestEveryNSteps(5)),
             (pp.CustomSteps([3, 9]), native_keep.CustomSteps([3, 9]))]
    for orbax_policy, native_policy in pairs:
        flags = orbax_policy.should_preserve(cps, context=ctx)
        assert {c.step for c, f in zip(cps, flags) if f} == native_policy.keep(native), orbax_policy
    # and the other way: any Orbax policy, custom ones too, plugged into the native managers
    assert pp.NativePreservation(pp.LatestN(2)).keep(native) == {10, 12}
    decision = sdp.NativeSaveDecision(sdp.default_policy(4))
    now = T0.timestamp()
    assert decision.should_save(SaveContext(1, now, (), False, False))  # the first step too (InitialSave)
    earlier = (SavedStep(1, now, now),)
    assert not decision.should_save(SaveContext(2, now, earlier, False, False))
    assert decision.should_save(SaveContext(4, now, earlier, False, False))


def test_latest_duration_reads_now_as_orbax_does() -> None:
    """Orbax's tests fix "now" by patching ``datetime.datetime`` through the policy module;
    the face reads the clock the same way, so the decision follows the patched clock."""
    import datetime
    from unittest import mock

    from ocdbt_py.orbax.checkpoint_managers import preservation_policy as pp

    fixed = datetime.datetime(2026, 5, 29, 12, 0, 0)
    from ocdbt_py.orbax.preservation import CheckpointInfo

    infos = [CheckpointInfo(step=s, time=fixed - datetime.timedelta(hours=h), metrics=None)
             for s, h in ((0, 30), (1, 25), (2, 23), (3, 10))]
    ctx = pp.PreservationContext()
    with mock.patch.object(pp.datetime, "datetime") as patched:
        patched.now.return_value = fixed
        assert list(pp.LatestDuration(datetime.timedelta(hours=24)).should_preserve(infos, context=ctx)) == [
            False, False, True, True]
        assert not any(pp.LatestDuration(datetime.timedelta(hours=5)).should_preserve(infos, context=ctx))
