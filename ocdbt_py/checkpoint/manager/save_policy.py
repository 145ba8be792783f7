"""When a :class:`~ocdbt_py.checkpoint.CheckpointManager` saves: save decision policies.

A policy is any object with one method, ``should_save(ctx: SaveContext) -> bool``; the
manager asks it at every ``save(step, ...)`` call (``force=True`` skips the question).
Policies that depend on the clock or on how long saves take (:class:`EveryNSeconds`,
:class:`Continuous`) may answer differently in different processes of one job; the manager
then asks only the primary process and shares its answer (see ``deterministic``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from ocdbt_py.checkpoint.manager.union import PolicyUnion

__all__ = [
    "SaveContext",
    "SavedStep",
    "SavePolicy",
    "FixedInterval",
    "SpecificSteps",
    "EveryNSeconds",
    "Continuous",
    "Preemption",
    "InitialSave",
    "AnyOf",
    "is_deterministic",
]


@dataclasses.dataclass(frozen=True)
class SavedStep:
    """A step saved (or being saved) by the manager: when its save started and committed."""

    step: int
    start_time: float  #: seconds since the epoch when its save began
    commit_time: float | None  #: when it was committed (``None`` while in flight)


@dataclasses.dataclass(frozen=True)
class SaveContext:
    """What a policy may look at to decide whether ``step`` is saved."""

    step: int
    now: float  #: seconds since the epoch
    previous: Sequence[SavedStep]  #: earlier saves known to the manager, oldest first
    saving_in_progress: bool  #: an earlier save has not committed yet
    reached_preemption: bool  #: a preemption signal arrived and this is the step to save at

    @property
    def last(self) -> SavedStep | None:
        """The newest earlier save, if any."""
        return self.previous[-1] if self.previous else None


@runtime_checkable
class SavePolicy(Protocol):
    """Decides whether a step is saved."""

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether ``ctx.step`` should be saved."""
        ...


def is_deterministic(policy: object) -> bool:
    """Whether ``policy`` answers the same in every process given the same steps.

    Policies say so with a ``deterministic`` attribute; custom policies without one are
    assumed to depend on local state, so only the primary process asks them.
    """
    return bool(getattr(policy, "deterministic", False))


def _positive(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{what} must be a positive number, not {value!r}")


@dataclasses.dataclass(frozen=True)
class FixedInterval:
    """Save every ``n_steps`` steps (``step % n_steps == 0``)."""

    n_steps: int
    deterministic = True

    def __post_init__(self) -> None:
        if isinstance(self.n_steps, bool) or not isinstance(self.n_steps, int) or self.n_steps < 1:
            raise ValueError(f"n_steps must be a positive int, not {self.n_steps!r}")

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether ``ctx.step`` is a multiple of the interval."""
        return ctx.step % self.n_steps == 0


@dataclasses.dataclass(frozen=True)
class SpecificSteps:
    """Save exactly at the given steps."""

    steps: frozenset[int]
    deterministic = True

    def __init__(self, steps: Iterable[int]):
        object.__setattr__(self, "steps", frozenset(int(s) for s in steps))

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether ``ctx.step`` is one of the steps."""
        return ctx.step in self.steps


@dataclasses.dataclass(frozen=True)
class EveryNSeconds:
    """Save when at least ``seconds`` have passed since the previous save began (and at the
    first step the manager sees when it has no save yet)."""

    seconds: float
    deterministic = False

    def __post_init__(self) -> None:
        _positive(self.seconds, "seconds")

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether the interval has passed since the last save started."""
        last = ctx.last
        return last is None or ctx.now - last.start_time >= self.seconds


@dataclasses.dataclass(frozen=True)
class Continuous:
    """Start a new save as soon as the previous one has committed: never two in flight, and
    never more often than ``minimum_interval_secs`` (between save starts) when given."""

    minimum_interval_secs: float | None = None
    deterministic = False

    def __post_init__(self) -> None:
        if self.minimum_interval_secs is not None:
            _positive(self.minimum_interval_secs, "minimum_interval_secs")

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether no save is in flight and the minimum interval has passed."""
        if ctx.saving_in_progress:
            return False
        last = ctx.last
        if last is None or self.minimum_interval_secs is None:
            return True
        return ctx.now - last.start_time >= self.minimum_interval_secs


@dataclasses.dataclass(frozen=True)
class Preemption:
    """Save at the step where a preemption notice (SIGTERM) was taken up.

    In a single process the manager installs a SIGTERM handler; in a multi-process JAX job it
    asks JAX's preemption sync manager, which makes every process agree on the step.
    """

    deterministic = True

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether this is the preemption step."""
        return ctx.reached_preemption


@dataclasses.dataclass(frozen=True)
class InitialSave:
    """Save when the manager has no checkpoint yet."""

    deterministic = True

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether no step was saved before."""
        return not ctx.previous


class AnyOf(PolicyUnion):
    """Save when any of the policies says so."""

    method = "should_save"
    kind = "save policy"
    policies: tuple[SavePolicy, ...]

    def __init__(self, *policies: SavePolicy | Iterable[SavePolicy]):
        super().__init__(*policies)

    @property
    def deterministic(self) -> bool:
        """Whether every policy is deterministic."""
        return all(is_deterministic(p) for p in self.policies)

    def should_save(self, ctx: SaveContext) -> bool:
        """Whether any policy says to save (every policy is asked, in order)."""
        answers = [bool(p.should_save(ctx)) for p in self.policies]
        return any(answers)


def uses(policy: object, kind: type) -> bool:
    """Whether ``policy`` is or contains a policy of type ``kind``."""
    if isinstance(policy, AnyOf):
        return any(isinstance(p, kind) for p in policy.walk())
    return isinstance(policy, kind)
