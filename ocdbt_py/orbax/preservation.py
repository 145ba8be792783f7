"""Orbax's preservation policies: which committed checkpoints a manager keeps.

Same names, fields and answers as ``orbax.checkpoint.checkpoint_managers`` (0.12.8).  A policy
gets every checkpoint the manager tracks (oldest first, the one just saved last) and answers
one ``bool`` per checkpoint; the manager deletes the others -- including the newest one when
the policy says so (``spec/orbax-api.md``).

Each class is Orbax's face of a policy of :mod:`ocdbt_py.checkpoint.manager.preservation`,
where the rules are written once: it turns the checkpoints into native ``StepInfo``, asks the
native policy and answers one flag per checkpoint.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ocdbt_py.checkpoint.manager import preservation as native

__all__ = [
    "CheckpointInfo",
    "PolicyCheckpointInfo",
    "PreservationContext",
    "PreservationPolicy",
    "PreserveAll",
    "LatestN",
    "EveryNSeconds",
    "EveryNSteps",
    "EveryNStepsClosest",
    "CustomSteps",
    "AnyPreservationPolicy",
    "BestN",
    "LatestDuration",
    "default_policy",
    "NativePreservation",
]


@runtime_checkable
class PolicyCheckpointInfo(Protocol):
    """What policies see of a checkpoint: ``step``, ``time`` (UTC datetime), ``metrics``."""

    step: int
    metrics: dict[str, Any] | None
    time: datetime.datetime


@dataclasses.dataclass
class CheckpointInfo:
    """A checkpoint as Orbax's managers track it and hand it to policies (Orbax's
    ``checkpoint_manager.CheckpointInfo``): ``step``, ``time`` (UTC; when its save started,
    or its commit time when found on storage) and ``metrics``."""

    step: int
    time: datetime.datetime
    metrics: Any = None


@dataclasses.dataclass(kw_only=True)
class PreservationContext:
    """Extra facts for a preservation decision (none yet, as in Orbax)."""


@runtime_checkable
class PreservationPolicy(Protocol):
    """Decides which checkpoints are kept."""

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """One flag per checkpoint: keep it or not."""
        ...


_log = logging.getLogger("ocdbt_py.orbax.preservation")


def _log_preservation_decision(policy_name: str, checkpoints: Sequence[PolicyCheckpointInfo],
                               should_preserve_list: Sequence[bool]) -> None:
    """Log a policy's decision per checkpoint at DEBUG level (Orbax's helper of the same
    name and arguments, which custom policies call)."""
    if _log.isEnabledFor(logging.DEBUG):
        for checkpoint, keep in zip(checkpoints, should_preserve_list):
            _log.debug(" %s: %s checkpoint at step %s.", policy_name, "Preserving" if keep else "Not preserving",
                       checkpoint.step)


def now() -> float:
    """Now, read as Orbax's policy reads it (``datetime.datetime.now``, which tests patch)."""
    return datetime.datetime.now(tz=datetime.timezone.utc).timestamp()


def step_infos(checkpoints: Sequence[PolicyCheckpointInfo]) -> list[native.StepInfo]:
    """Orbax's checkpoint infos (``time`` a datetime) as native ``StepInfo`` (epoch seconds)."""
    return [native.StepInfo(c.step, c.time.timestamp(), c.metrics) for c in checkpoints]


def _flags(name: str, policy: native.PreservationPolicy, checkpoints: Sequence[PolicyCheckpointInfo]) -> list[bool]:
    """A native policy's answer as one flag per checkpoint (logged as Orbax logs it)."""
    keep = policy.keep(step_infos(checkpoints))
    flags = [c.step in keep for c in checkpoints]
    _log_preservation_decision(name, checkpoints, flags)
    return flags


@dataclasses.dataclass
class PreserveAll:
    """Keep every checkpoint."""

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """All ``True``."""
        return _flags("PreserveAll", native.PreserveAll(), checkpoints)


@dataclasses.dataclass
class LatestN:
    """Keep the ``n`` newest checkpoints (all when ``n`` is ``None``)."""

    n: int | None = None

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """The last ``n`` flags set."""
        policy = native.PreserveAll() if self.n is None else native.LatestN(max(self.n, 0))
        return _flags(f"LatestN (n={self.n})", policy, checkpoints)


@dataclasses.dataclass
class EveryNSeconds:
    """Keep the first checkpoint, then each one at least ``interval_secs`` after the last kept."""

    interval_secs: int

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """One checkpoint per interval, by time."""
        policy = native.EveryNSeconds(self.interval_secs) if self.interval_secs > 0 else native.PreserveAll()
        return _flags(f"EveryNSeconds (interval_secs={self.interval_secs})", policy, checkpoints)


def _check_interval(n: int) -> None:
    if n == 0:
        raise ValueError("interval_steps must not be 0.")


@dataclasses.dataclass
class EveryNSteps:
    """Keep steps that are multiples of ``interval_steps`` (``exact_interval``), or else the
    first step and each step at least ``interval_steps`` after the last kept; at most
    ``max_to_keep`` of them (the newest)."""

    interval_steps: int
    exact_interval: bool = True
    max_to_keep: int | None = None

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """Flags by step number."""
        _check_interval(self.interval_steps)
        policy = native.EveryNSteps(abs(self.interval_steps), self.max_to_keep, exact=self.exact_interval)
        return _flags(f"EveryNSteps (interval_steps={self.interval_steps})", policy, checkpoints)


@dataclasses.dataclass
class EveryNStepsClosest:
    """For each multiple ``k * interval_steps``, keep the checkpoint closest to it (the later
    one on ties), and always the newest; at most ``max_to_keep`` of them."""

    interval_steps: int
    max_to_keep: int | None = None

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """Flags by distance to the grid."""
        _check_interval(self.interval_steps)
        policy = native.NearestEveryNSteps(abs(self.interval_steps), self.max_to_keep)
        return _flags(f"EveryNStepsClosest (interval_steps={self.interval_steps})", policy, checkpoints)


@dataclasses.dataclass
class CustomSteps:
    """Keep the given steps."""

    steps: dataclasses.InitVar[Sequence[int]]
    _steps_set: set[int] = dataclasses.field(init=False)

    def __post_init__(self, steps: Sequence[int]) -> None:
        self._steps_set = set(steps)

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """Whether each step is listed."""
        return _flags("CustomSteps", native.CustomSteps(self._steps_set), checkpoints)


@dataclasses.dataclass
class AnyPreservationPolicy:
    """Keep a checkpoint when any of ``policies`` keeps it."""

    policies: Sequence[PreservationPolicy]

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """The element-wise OR of the policies' answers."""
        flags = [False] * len(checkpoints)
        for policy in self.policies:
            answer = list(policy.should_preserve(checkpoints, context=context))
            if len(answer) != len(flags):
                raise ValueError(f"{policy!r} answered {len(answer)} flags for {len(flags)} checkpoints")
            flags = [a or bool(b) for a, b in zip(flags, answer)]
        _log_preservation_decision("AnyPreservationPolicy", checkpoints, flags)
        return flags


@dataclasses.dataclass(kw_only=True)
class BestN:
    """Keep the ``n`` best checkpoints by ``get_metric_fn(metrics)``.

    ``reverse=False`` keeps the highest values, ``reverse=True`` the lowest; among equal
    values the newer checkpoint wins; ``n=None`` keeps all, ``0`` none.  Checkpoints without
    metrics are kept when ``keep_checkpoints_without_metrics``.  The newest checkpoint is
    deleted when it is not among the best (as in Orbax).
    """

    get_metric_fn: Callable[[Any], float]
    reverse: bool = False
    n: int | None = None
    keep_checkpoints_without_metrics: bool = True

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """Flags: the best ``n`` (and, optionally, those without metrics)."""
        count = len(checkpoints)
        if self.n is None or count <= self.n:
            return [True] * count
        if self.n <= 0:
            return [False] * count
        policy = native.BestN(self.n, self.get_metric_fn, "min" if self.reverse else "max",
                              keep_checkpoints_without_metrics=self.keep_checkpoints_without_metrics)
        return _flags(f"BestN (n={self.n})", policy, checkpoints)


@dataclasses.dataclass
class LatestDuration:
    """Keep the checkpoints saved within ``duration`` of now (and every later one)."""

    duration: datetime.timedelta

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """``False`` up to the first recent checkpoint, ``True`` from it on."""
        policy = native.Recent(max(self.duration.total_seconds(), 0.0), clock=now)
        return _flags(f"LatestDuration (duration={self.duration})", policy, checkpoints)


def default_policy(*, max_to_keep: int | None = None, keep_period: int | None = None,
                   keep_time_interval: datetime.timedelta | None = None, best_fn: Callable[[Any], float] | None = None,
                   best_mode: str = "max", keep_checkpoints_without_metrics: bool = True) -> PreservationPolicy:
    """The policy Orbax's managers build from ``max_to_keep``/``keep_period``/
    ``keep_time_interval``/``best_fn`` when no ``preservation_policy`` is given."""
    policies: list[PreservationPolicy] = []
    if keep_period is not None:
        policies.append(EveryNSteps(keep_period))
    if keep_time_interval is not None:
        policies.append(EveryNSeconds(interval_secs=int(keep_time_interval.total_seconds())))
    if best_fn is not None:
        policies.append(BestN(get_metric_fn=best_fn, reverse=best_mode == "min", n=max_to_keep,
                              keep_checkpoints_without_metrics=keep_checkpoints_without_metrics))
    else:
        policies.append(LatestN(n=max_to_keep))
    return AnyPreservationPolicy(policies)


#: the datetime class as imported: a test that patches ``datetime.datetime`` (to fix ``now``)
#: still gets real datetimes for the checkpoint times
_DATETIME = datetime.datetime


def _utc(seconds: float) -> datetime.datetime:
    return _DATETIME.fromtimestamp(seconds, tz=datetime.timezone.utc)


class NativePreservation:
    """An Orbax ``PreservationPolicy`` (``should_preserve(checkpoints, *, context)``) as a
    native preservation policy, for the native managers under ``ocp.CheckpointManager`` and
    the emergency manager."""

    def __init__(self, policy: PreservationPolicy):
        self.policy = policy
        self.last_started: float | None = None  # when the last decision began (epoch seconds)
        self.last_duration = 0.0  # how long it took (seconds)

    def keep(self, steps: Sequence[native.StepInfo]) -> set[int]:
        """The steps the Orbax policy flags (timed: :attr:`last_started`, :attr:`last_duration`)."""
        started = time.time()
        try:
            return self._keep(steps)
        finally:
            self.last_started, self.last_duration = started, time.time() - started

    def _keep(self, steps: Sequence[native.StepInfo]) -> set[int]:
        infos = [CheckpointInfo(s.step, _utc(s.time), dict(s.metrics) if s.metrics is not None else None)
                 for s in steps]
        flags = list(self.policy.should_preserve(infos, context=PreservationContext()))
        if len(flags) != len(infos):
            raise ValueError(f"{type(self.policy).__name__}.should_preserve returned {len(flags)} flags "
                             f"for {len(infos)} checkpoints")
        return {i.step for i, f in zip(infos, flags) if f}

    def __repr__(self) -> str:
        return f"NativePreservation({self.policy!r})"
