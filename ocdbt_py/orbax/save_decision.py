"""Orbax's save decision policies: whether a manager saves at a step.

Same names, fields and answers as ``orbax.checkpoint.checkpoint_managers`` (0.12.8).  The
manager asks ``should_save(step, previous_steps, context=...)`` with ``step`` the step being
considered (its ``time`` is now), ``previous_steps`` the checkpoints it tracks (oldest
first, including a save still in flight) and a :class:`DecisionContext`.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import sys
from collections.abc import Container, Sequence
from typing import Protocol, runtime_checkable

from ocdbt_py.checkpoint.saving.distributed import _jax_client
from ocdbt_py.orbax.options import MultiprocessingOptions
from ocdbt_py.orbax.preservation import PolicyCheckpointInfo

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
]

_decisions = itertools.count()


@dataclasses.dataclass(kw_only=True)
class DecisionContext:
    """What the manager knows besides the steps: a save in flight, a preemption notice."""

    is_saving_in_progress: bool
    reached_preemption: bool
    multiprocessing_options: MultiprocessingOptions = dataclasses.field(default_factory=MultiprocessingOptions)


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
        return step.step % self.interval == 0


@dataclasses.dataclass
class SpecificStepsPolicy:
    """Save at the listed steps."""

    steps: Container[int]

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether the step is listed."""
        return step.step in self.steps


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
        if context.is_saving_in_progress:
            return False
        if not previous_steps or self.minimum_interval_secs is None:
            return True
        return step.time - previous_steps[-1].time >= datetime.timedelta(seconds=self.minimum_interval_secs)

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
        return context.reached_preemption


class InitialSavePolicy:
    """Save when the manager tracks no checkpoint yet."""

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether ``previous_steps`` is empty."""
        return not previous_steps


@dataclasses.dataclass
class AnySavePolicy:
    """Save when any of ``policies`` says so (asked in order, stopping at the first yes)."""

    policies: Sequence[SaveDecisionPolicy]

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        """Whether any policy says to save."""
        return any(p.should_save(step, previous_steps=previous_steps, context=context) for p in self.policies)
