"""``ocp.logging.step_statistics``: the timing records of a save or restore, as Orbax's.

``StepMetadata.performance_metrics`` is a :class:`SaveStepStatistics` (its float fields are
what ``_CHECKPOINT_METADATA`` stores under ``performance_metrics``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["SaveStepStatistics", "RestoreStepStatistics", "EmergencyRestoreStepStatistics", "from_stored"]


class _Record:
    """Equality by fields, also with orbax-checkpoint's record of the same name and fields (what
    Orbax's own tools read from a checkpoint ocdbt_py wrote compares equal to ours)."""

    __hash__ = None  # type: ignore[assignment]  # mutable records, as dataclasses with eq

    def __eq__(self, other: object) -> bool:
        if not dataclasses.is_dataclass(other) or isinstance(other, type):
            return NotImplemented
        if type(other) is not type(self) and type(other).__name__ != type(self).__name__:
            return NotImplemented
        mine = [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]
        if [f.name for f in dataclasses.fields(other)] != mine:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in mine)


@dataclasses.dataclass(eq=False)
class SaveStepStatistics(_Record):
    """Timings of one save (seconds; start times as ``time.time()``)."""

    step: int | None = None
    event_type: str | None = "save"
    directory: str | None = None
    reached_preemption: bool | None = False
    preemption_received_at: float | None = None
    synchronous: bool | None = False
    wait_for_prev_start_time: float | None = None
    wait_for_prev_duration_secs: float | None = None
    time_between_consecutive_saves_sec: float | None = None
    checkpointer_blocking_start_time: float | None = None
    checkpointer_blocking_duration_secs: float | None = None
    get_old_steps_start_time: float | None = None
    get_old_steps_duration_secs: float | None = None
    checkpoint_manager_blocking_start_time: float | None = None
    checkpoint_manager_blocking_duration_secs: float | None = None


@dataclasses.dataclass(eq=False)
class RestoreStepStatistics(_Record):
    """Timings of one restore."""

    step: int | None = None
    event_type: str | None = "restore"
    directory: str | None = None
    checkpointer_start_time: float | None = None
    checkpointer_duration_secs: float | None = None
    checkpoint_manager_start_time: float | None = None
    checkpoint_manager_duration_secs: float | None = None


@dataclasses.dataclass(eq=False)
class EmergencyRestoreStepStatistics(_Record):
    """Timings of one emergency-manager restore."""

    step: int | None = None
    event_type: str | None = "emergency_restore"
    checkpoint_manager_start_time: float | None = None
    directory: str | None = None
    is_restoring_slice: bool | None = False
    in_primary_slice: bool | None = False
    checkpointer_start_time: float | None = None
    checkpointer_duration_secs: float | None = None
    broadcast_start_time: float | None = None
    broadcast_duration_secs: float | None = None
    checkpoint_manager_duration_secs: float | None = None


def from_stored(doc: Any) -> SaveStepStatistics:
    """The statistics a ``_CHECKPOINT_METADATA`` records (its float fields, as Orbax reads
    them; anything else is dropped)."""
    if not isinstance(doc, dict):
        return SaveStepStatistics()
    names = {f.name for f in dataclasses.fields(SaveStepStatistics)}
    stats = SaveStepStatistics()
    for k, v in doc.items():
        if k in names and isinstance(v, float):
            setattr(stats, k, v)
    return stats
