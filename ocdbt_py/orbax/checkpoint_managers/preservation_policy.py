"""``orbax.checkpoint.checkpoint_managers.preservation_policy``'s names, for scripts that import from that
module (the preservation policies live in :mod:`ocdbt_py.orbax.preservation`, below the manager that uses them)."""

from __future__ import annotations

import datetime  # noqa: F401  (Orbax's module has it: tests patch datetime.datetime through it)

from ocdbt_py.orbax.preservation import (
    AnyPreservationPolicy,
    BestN,
    CustomSteps,
    EveryNSeconds,
    EveryNSteps,
    EveryNStepsClosest,
    LatestDuration,
    LatestN,
    PolicyCheckpointInfo,
    PreservationContext,
    PreservationPolicy,
    PreserveAll,
    _log_preservation_decision,
)

__all__ = [
    "_log_preservation_decision",  # Orbax's private helper, which custom policies call
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
