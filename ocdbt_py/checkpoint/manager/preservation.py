"""Which checkpoints a :class:`~ocdbt_py.checkpoint.CheckpointManager` keeps: retention.

A policy is any object with one method, ``keep(steps: Sequence[StepInfo]) -> set[int]``,
given every committed step (oldest first) and answering which step numbers to keep.  The
manager deletes the others, except that it never deletes the newest committed step or a step
still being written.  Without a policy every checkpoint is kept.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ocdbt_py.checkpoint.manager.union import PolicyUnion

__all__ = [
    "StepInfo",
    "PreservationPolicy",
    "PreserveAll",
    "LatestN",
    "EveryNSteps",
    "NearestEveryNSteps",
    "EveryNSeconds",
    "Recent",
    "BestN",
    "CustomSteps",
    "AnyOf",
]


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """A committed step as retention policies see it."""

    step: int
    time: float  #: commit time, seconds since the epoch
    metrics: Mapping[str, Any] | None = None  #: the metrics saved with the step, if any


@runtime_checkable
class PreservationPolicy(Protocol):
    """Decides which checkpoints are kept."""

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """The step numbers (of ``steps``) to keep."""
        ...


def _count(n: Any, what: str, minimum: int = 0) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, not {n!r}")
    return n


@dataclasses.dataclass(frozen=True)
class PreserveAll:
    """Keep every checkpoint."""

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """All steps."""
        return {s.step for s in steps}


@dataclasses.dataclass(frozen=True)
class LatestN:
    """Keep the ``n`` newest checkpoints."""

    n: int

    def __post_init__(self) -> None:
        _count(self.n, "n")

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """The ``n`` highest steps."""
        ordered = sorted(s.step for s in steps)
        return set(ordered[max(0, len(ordered) - self.n):]) if self.n else set()


def _newest(steps: list[int], n: int | None) -> list[int]:
    """The last ``n`` of ``steps`` (all when ``n`` is ``None``)."""
    if n is None:
        return steps
    return steps[max(0, len(steps) - n):] if n else []


@dataclasses.dataclass(frozen=True)
class EveryNSteps:
    """Keep the checkpoints whose step is a multiple of ``n`` (``exact=False``: the oldest,
    then each one at least ``n`` steps after the previous one kept); at most ``max_to_keep``
    of the newest of them when given."""

    n: int
    max_to_keep: int | None = None
    exact: bool = True

    def __post_init__(self) -> None:
        _count(self.n, "n", 1)
        if self.max_to_keep is not None:
            _count(self.max_to_keep, "max_to_keep")

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """Multiples of ``n`` (or steps ``n`` apart)."""
        ordered = sorted(s.step for s in steps)
        if self.exact:
            hits = [s for s in ordered if s % self.n == 0]
        else:
            hits = []
            for s in ordered:
                if not hits or s - hits[-1] >= self.n:
                    hits.append(s)
        return set(_newest(hits, self.max_to_keep))


@dataclasses.dataclass(frozen=True)
class NearestEveryNSteps:
    """For each multiple ``k * n``, keep the checkpoint nearest to it (the later one on ties),
    and the newest checkpoint; at most ``max_to_keep`` of the newest of them when given."""

    n: int
    max_to_keep: int | None = None

    def __post_init__(self) -> None:
        _count(self.n, "n", 1)
        if self.max_to_keep is not None:
            _count(self.max_to_keep, "max_to_keep")

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """The step nearest to each multiple, and the newest."""
        ordered = sorted(s.step for s in steps)
        if not ordered:
            return set()
        nearest: dict[int, tuple[int, int]] = {}  # multiple index -> (distance, step)
        for s in ordered:
            k = round(s / self.n)
            d = abs(s - k * self.n)
            if k not in nearest or d <= nearest[k][0]:
                nearest[k] = (d, s)
        hits = sorted({s for _, s in nearest.values()} | {ordered[-1]})
        return set(_newest(hits, self.max_to_keep))


@dataclasses.dataclass(frozen=True)
class Recent:
    """Keep the checkpoints committed within ``seconds`` of now, and every later step."""

    seconds: float
    #: the clock "now" is read from (epoch seconds); Orbax's face reads ``datetime.now``
    clock: Callable[[], float] = dataclasses.field(default=time.time, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or self.seconds < 0:
            raise ValueError(f"seconds must be a non-negative number, not {self.seconds!r}")

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """From the oldest recent step on."""
        now = self.clock()
        ordered = sorted(steps, key=lambda s: s.step)
        first = next((i for i, s in enumerate(ordered) if now - s.time <= self.seconds), len(ordered))
        return {s.step for s in ordered[first:]}


@dataclasses.dataclass(frozen=True)
class EveryNSeconds:
    """Keep at least one checkpoint per ``seconds``: the oldest checkpoint, then each one
    committed at least ``seconds`` after the previous one kept."""

    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or not self.seconds > 0:
            raise ValueError(f"seconds must be a positive number, not {self.seconds!r}")

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """One step per period, by commit time."""
        kept: set[int] = set()
        last: float | None = None
        for s in sorted(steps, key=lambda s: (s.time, s.step)):
            if last is None or s.time - last >= self.seconds:
                kept.add(s.step)
                last = s.time
        return kept


class BestN:
    """Keep the ``n`` best checkpoints by a metric.

    ``metric`` is a key of the step's metrics dict, or a function of that dict returning a
    number.  ``mode="min"``: lower is better; ``"max"``: higher is better.  Checkpoints saved
    without metrics (or whose metric is missing or not a number) are kept when
    ``keep_checkpoints_without_metrics`` (the default), and never count among the best.
    Ties go to the newer step.
    """

    def __init__(self, n: int, metric: str | Callable[[Mapping[str, Any]], float], mode: str = "min",
                 *, keep_checkpoints_without_metrics: bool = True):
        self.n = _count(n, "n")
        if not (isinstance(metric, str) or callable(metric)):
            raise TypeError("metric must be a metrics key or a function of the metrics dict")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        self.metric = metric
        self.mode = mode
        self.keep_checkpoints_without_metrics = keep_checkpoints_without_metrics

    def value(self, info: StepInfo) -> float | None:
        """The metric of a step (``None`` when it has none usable)."""
        if info.metrics is None:
            return None
        try:
            v = info.metrics[self.metric] if isinstance(self.metric, str) else self.metric(info.metrics)
        except (KeyError, TypeError, IndexError):
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            try:
                v = float(v)  # NumPy scalars and 0-d arrays
            except (TypeError, ValueError):
                return None
        v = float(v)
        return None if math.isnan(v) else v

    def ranked(self, steps: Sequence[StepInfo]) -> list[StepInfo]:
        """Steps with a usable metric, best first (newer first among equals)."""
        scored = [(v, s) for s in steps if (v := self.value(s)) is not None]
        sign = 1.0 if self.mode == "min" else -1.0
        scored.sort(key=lambda vs: (sign * vs[0], -vs[1].step))
        return [s for _, s in scored]

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """The best ``n`` (plus, optionally, the steps without metrics)."""
        kept = {s.step for s in self.ranked(steps)[: self.n]}
        if self.keep_checkpoints_without_metrics:
            kept |= {s.step for s in steps if self.value(s) is None}
        return kept

    def __repr__(self) -> str:
        return f"BestN({self.n}, {self.metric!r}, mode={self.mode!r})"


@dataclasses.dataclass(frozen=True)
class CustomSteps:
    """Keep the given steps."""

    steps: frozenset[int]

    def __init__(self, steps: Iterable[int]):
        object.__setattr__(self, "steps", frozenset(int(s) for s in steps))

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """The listed steps that exist."""
        return {s.step for s in steps if s.step in self.steps}


class AnyOf(PolicyUnion):
    """Keep a checkpoint when any of the policies keeps it."""

    method = "keep"
    kind = "preservation policy"
    policies: tuple[PreservationPolicy, ...]

    def __init__(self, *policies: PreservationPolicy | Iterable[PreservationPolicy]):
        super().__init__(*policies)

    def keep(self, steps: Sequence[StepInfo]) -> set[int]:
        """The union of what the policies keep."""
        kept: set[int] = set()
        for p in self.policies:
            kept |= set(p.keep(steps))
        return kept
