"""Orbax's preservation policies: which committed checkpoints a manager keeps.

Same names, fields and answers as ``orbax.checkpoint.checkpoint_managers`` (0.12.8).  A policy
gets every checkpoint the manager tracks (oldest first, the one just saved last) and answers
one ``bool`` per checkpoint; the manager deletes the others -- including, unlike
:mod:`ocdbt_py.checkpoint.manager.preservation`, the newest one when the policy says so
(``spec/orbax-api.md``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
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
]


@runtime_checkable
class PolicyCheckpointInfo(Protocol):
    """What policies see of a checkpoint: ``step``, ``time`` (UTC datetime), ``metrics``."""

    step: int
    metrics: dict[str, Any] | None
    time: datetime.datetime


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


def _keep_newest(flags: list[bool], n: int | None) -> list[bool]:
    """Clear every set flag but the last ``n`` (``None``: no limit)."""
    if n is None:
        return flags
    set_at = [i for i, f in enumerate(flags) if f]
    for i in set_at[: max(0, len(set_at) - n)]:
        flags[i] = False
    return flags


@dataclasses.dataclass
class PreserveAll:
    """Keep every checkpoint."""

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """All ``True``."""
        return [True for _ in checkpoints]


@dataclasses.dataclass
class LatestN:
    """Keep the ``n`` newest checkpoints (all when ``n`` is ``None``)."""

    n: int | None = None

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """The last ``n`` flags set."""
        count = len(checkpoints)
        if self.n is None or count <= self.n:
            return [True] * count
        return [i >= count - self.n for i in range(count)]


@dataclasses.dataclass
class EveryNSeconds:
    """Keep the first checkpoint, then each one at least ``interval_secs`` after the last kept."""

    interval_secs: int

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """One checkpoint per interval, by time."""
        flags: list[bool] = []
        anchor: datetime.datetime | None = None
        gap = datetime.timedelta(seconds=self.interval_secs)
        for info in checkpoints:
            keep = anchor is None or info.time - anchor >= gap
            if keep:
                anchor = info.time
            flags.append(keep)
        return flags


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
        if self.exact_interval:
            flags = [c.step % self.interval_steps == 0 for c in checkpoints]
        else:
            flags = []
            last: int | None = None
            for c in checkpoints:
                keep = last is None or c.step - last >= self.interval_steps
                if keep:
                    last = c.step
                flags.append(keep)
        return _keep_newest(flags, self.max_to_keep)


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
        if not checkpoints:
            return []
        closest: dict[int, tuple[int, int]] = {}  # grid index -> (distance, checkpoint index)
        for i, c in enumerate(checkpoints):
            k = round(c.step / self.interval_steps)
            d = abs(c.step - k * self.interval_steps)
            if k not in closest or d <= closest[k][0]:
                closest[k] = (d, i)
        chosen = {i for _, i in closest.values()}
        flags = [i in chosen for i in range(len(checkpoints))]
        flags[-1] = True
        return _keep_newest(flags, self.max_to_keep)


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
        return [c.step in self._steps_set for c in checkpoints]


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
        return flags


@dataclasses.dataclass(kw_only=True)
class BestN:
    """Keep the ``n`` best checkpoints by ``get_metric_fn(metrics)``.

    Checkpoints are sorted ascending by the metric (descending with ``reverse``) and the last
    ``n`` are kept, so ``reverse=False`` keeps the highest values; ``n=None`` keeps all, ``0``
    none.  Checkpoints without metrics are kept when ``keep_checkpoints_without_metrics``.
    The newest checkpoint is deleted when it is not among the best (as in Orbax).
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
        if self.n == 0:
            return [False] * count
        scored = [i for i, c in enumerate(checkpoints) if c.metrics is not None]
        # a stable sort: among equal metrics the later checkpoint sorts later, and is kept
        scored.sort(key=lambda i: self.get_metric_fn(checkpoints[i].metrics), reverse=self.reverse)
        kept = set(scored[-self.n:])
        if self.keep_checkpoints_without_metrics:
            kept |= {i for i, c in enumerate(checkpoints) if c.metrics is None}
        return [i in kept for i in range(count)]


@dataclasses.dataclass
class LatestDuration:
    """Keep the checkpoints saved within ``duration`` of now (and every later one)."""

    duration: datetime.timedelta

    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        """``False`` up to the first recent checkpoint, ``True`` from it on."""
        now = datetime.datetime.now(tz=datetime.timezone.utc)
        first = next((i for i, c in enumerate(checkpoints) if now - c.time <= self.duration), len(checkpoints))
        return [i >= first for i in range(len(checkpoints))]
