"""``ocp.logging.step_statistics``: the timing records of a save or restore, as Orbax's.

``StepMetadata.performance_metrics`` is a :class:`SaveStepStatistics` (its float fields are
what ``_CHECKPOINT_METADATA`` stores under ``performance_metrics``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["SaveStepStatistics", "RestoreStepStatistics", "EmergencyRestoreStepStatistics", "from_stored"]


@dataclasses.dataclass
class SaveStepStatistics:
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


@dataclasses.dataclass
class RestoreStepStatistics:
    """Timings of one restore."""

    step: int | None = None
    event_type: str | None = "restore"
    directory: str | None = None
    checkpointer_start_time: float | None = None
    checkpointer_duration_secs: float | None = None
    checkpoint_manager_start_time: float | None = None
    checkpoint_manager_duration_secs: float | None = None


@dataclasses.dataclass
class EmergencyRestoreStepStatistics:
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
