"""Orbax's save decision policies: whether a manager saves at a step.

Same names, fields and answers as ``orbax.checkpoint.checkpoint_managers`` (0.12.8).  The
manager asks ``should_save(step, previous_steps, context=...)`` with ``step`` the step being
considered (its ``time`` is now), ``previous_steps`` the checkpoints it tracks (oldest
first, including a save still in flight) and a :class:`DecisionContext`.

Each class is Orbax's face of a policy of :mod:`ocdbt_py.checkpoint.manager.save_policy`,
where the rules are written once: it turns its arguments into a native ``SaveContext`` and
asks the native policy.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import sys
from collections.abc import Callable, Container, Sequence
from typing import Protocol, runtime_checkable

from ocdbt_py.checkpoint.manager import save_policy as native
from ocdbt_py.checkpoint.saving.distributed import _jax_client
from ocdbt_py.orbax.options import MultiprocessingOptions
from ocdbt_py.orbax.preservation import CheckpointInfo, PolicyCheckpointInfo

__all__ = [
    "PolicyCheckpointInfo",
    "DecisionContext",
    "SaveDecisionPolicy",
    "FixedIntervalPolicy",
    "SpecificStepsPolicy",
    "ContinuousCheckpointingPolicy",
    "PreemptionCheckpointingPolicy",
    "InitialSavePolicy",
    "AnySavePolicy",
    "default_policy",
    "NativeSaveDecision",
]

_decisions = itertools.count()


@dataclasses.dataclass(kw_only=True)
class DecisionContext:
    """What the manager knows besides the steps: a save in flight, a preemption notice."""

    is_saving_in_progress: bool
    reached_preemption: bool
    multiprocessing_options: MultiprocessingOptions = dataclasses.field(default_factory=MultiprocessingOptions)


def save_context(step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo],
                 context: DecisionContext) -> native.SaveContext:
    """Orbax's arguments as the native policies' :class:`~ocdbt_py.checkpoint.manager.save_policy.SaveContext`."""
    previous = [native.SavedStep(p.step, p.time.timestamp(), p.time.timestamp()) for p in previous_steps]
    return native.SaveContext(step.step, step.time.timestamp(), previous, context.is_saving_in_progress,
                              context.reached_preemption)


@runtime_checkable
class SaveDecisionPolicy(Protocol):
    """Decides whether a step is saved."""

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether ``step`` should be saved."""
        ...


@dataclasses.dataclass
class FixedIntervalPolicy:
    """Save when ``step % interval == 0``."""

    interval: int

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether the step is a multiple of the interval."""
        if self.interval <= 0:
            raise ValueError(f"interval must be positive, not {self.interval!r}")
        return native.FixedInterval(self.interval).should_save(save_context(step, previous_steps, context))


@dataclasses.dataclass
class SpecificStepsPolicy:
    """Save at the listed steps."""

    steps: Container[int]

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether the step is listed."""
        return step.step in self.steps  # a Container: asked, not listed (so no native SpecificSteps)


def _shared_by_primary(decision: bool | None, step: int, primary_host: int | None) -> bool | None:
    """In a multi-process JAX job, the primary host's ``decision`` for every process (others
    pass ``None``); ``None`` when this is a single process."""
    if "jax" not in sys.modules:
        return None
    import jax  # loaded already (checked above)

    if jax.process_count() <= 1:
        return None
    client = _jax_client()
    key = f"ocdbt_py_orbax/{next(_decisions)}/continuous_should_save/{step}"
    if jax.process_index() == (primary_host or 0):
        client.key_value_set(key, "1" if decision else "0")
        return bool(decision)
    return bool(client.blocking_key_value_get(key, 600_000) == "1")


@dataclasses.dataclass(kw_only=True)
class ContinuousCheckpointingPolicy:
    """Save whenever no save is in flight and at least ``minimum_interval_secs`` (if set) have
    passed since the newest tracked checkpoint.  In a multi-process job the primary host
    decides and every process takes its answer."""

    minimum_interval_secs: int | None = None

    def _decide(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo],
                context: DecisionContext) -> bool:
        ctx = save_context(step, previous_steps, context)
        if not self.minimum_interval_secs or self.minimum_interval_secs < 0:
            return native.Continuous().should_save(ctx)
        return native.Continuous(self.minimum_interval_secs).should_save(ctx)

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether a new save may start now."""
        primary = context.multiprocessing_options.primary_host
        mine = self._decide(step, previous_steps, context)
        shared = _shared_by_primary(mine, step.step, primary)
        return mine if shared is None else shared


class PreemptionCheckpointingPolicy:
    """Save at the step where a preemption notice was taken up."""

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """``context.reached_preemption``."""
        return native.Preemption().should_save(save_context(step, previous_steps, context))


class InitialSavePolicy:
    """Save when the manager tracks no checkpoint yet."""

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether ``previous_steps`` is empty."""
        return native.InitialSave().should_save(save_context(step, previous_steps, context))


@dataclasses.dataclass
class AnySavePolicy:
    """Save when any of ``policies`` says so (asked in order, stopping at the first yes)."""

    policies: Sequence[SaveDecisionPolicy]

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether any policy says to save."""
        return any(p.should_save(step, previous_steps=previous_steps, context=context) for p in self.policies)


_DATETIME = datetime.datetime  # as imported: real datetimes even where a test patches ``datetime.datetime``


def _utc(seconds: float) -> datetime.datetime:
    return _DATETIME.fromtimestamp(seconds, tz=datetime.timezone.utc)


class _ShouldSaveFn:
    """Orbax's ``should_save_fn(step, last_saved_step)`` as a save decision policy."""

    def __init__(self, fn: Callable[[int, int | None], bool]):
        self.fn = fn

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """``fn(step, the newest tracked step)``."""
        return bool(self.fn(step.step, previous_steps[-1].step if previous_steps else None))


def default_policy(save_interval_steps: int | None, save_on_steps: Container[int] | None = None,
                   should_save_fn: Callable[[int, int | None], bool] | None = None) -> SaveDecisionPolicy:
    """The policy Orbax's managers build from ``save_interval_steps``/``save_on_steps``/
    ``should_save_fn`` when no ``save_decision_policy`` is given (the first step is saved too)."""
    policies: list[SaveDecisionPolicy] = []
    if should_save_fn is not None:
        policies += [_ShouldSaveFn(should_save_fn), PreemptionCheckpointingPolicy()]
    else:
        if save_interval_steps:
            policies.append(FixedIntervalPolicy(save_interval_steps))
        if save_on_steps is not None:
            policies.append(SpecificStepsPolicy(save_on_steps))
        policies += [PreemptionCheckpointingPolicy(), InitialSavePolicy()]
    return AnySavePolicy(policies)


class NativeSaveDecision:
    """An Orbax ``SaveDecisionPolicy`` (``should_save(step, previous_steps, *, context)``) as a
    native save policy, for the native managers under ``ocp.CheckpointManager`` and the
    emergency manager.  ``reached_preemption`` is JAX's preemption sync point (no signal
    handler is installed, as in Orbax); ``busy_check=False`` tells the policy no save is in
    flight (Orbax's ``enable_should_save_is_saving_in_progress_check``).  Orbax's policies
    share their own decisions between processes, so the manager asks every process."""

    deterministic = True

    def __init__(self, policy: SaveDecisionPolicy, *, multiprocessing_options: MultiprocessingOptions | None = None,
                 busy_check: bool = True, reached_preemption: Callable[[int], bool] | None = None):
        self.policy = policy
        self.multiprocessing_options = multiprocessing_options or MultiprocessingOptions()
        self.busy_check = busy_check
        self.reached_preemption = reached_preemption

    def should_save(self, ctx: native.SaveContext) -> bool:
        """The Orbax policy's answer for ``ctx.step``."""
        previous = [CheckpointInfo(s.step, _utc(s.start_time)) for s in ctx.previous]
        reached = ctx.reached_preemption or (self.reached_preemption is not None and self.reached_preemption(ctx.step))
        context = DecisionContext(is_saving_in_progress=self.busy_check and ctx.saving_in_progress,
                                  reached_preemption=reached, multiprocessing_options=self.multiprocessing_options)
        return bool(self.policy.should_save(CheckpointInfo(ctx.step, _utc(ctx.now)), previous, context=context))

    def __repr__(self) -> str:
        return f"NativeSaveDecision({self.policy!r})"
