"""``ocp.checkpoint_managers``: save decision and preservation policies, and the manager.

Every name is importable from here, as from Orbax's module of the same name, and from the
``save_decision_policy`` / ``preservation_policy`` submodules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ocdbt_py.orbax.checkpoint_managers import preservation_policy, save_decision_policy
from ocdbt_py.orbax.checkpoint_managers.preservation_policy import (
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
)
from ocdbt_py.orbax.checkpoint_managers.save_decision_policy import (
    AnySavePolicy,
    ContinuousCheckpointingPolicy,
    DecisionContext,
    FixedIntervalPolicy,
    InitialSavePolicy,
    PreemptionCheckpointingPolicy,
    SaveDecisionPolicy,
    SpecificStepsPolicy,
)

if TYPE_CHECKING:
    from ocdbt_py.orbax.manager import CheckpointManager, CheckpointManagerOptions

    AbstractCheckpointManager = CheckpointManager

__all__ = [
    "preservation_policy",
    "save_decision_policy",
    "DecisionContext",
    "SaveDecisionPolicy",
    "FixedIntervalPolicy",
    "PreemptionCheckpointingPolicy",
    "InitialSavePolicy",
    "SpecificStepsPolicy",
    "ContinuousCheckpointingPolicy",
    "AnySavePolicy",
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
    "PolicyCheckpointInfo",
    "CheckpointManagerOptions",
    "CheckpointManager",
    "AbstractCheckpointManager",
]


def __getattr__(name: str) -> Any:
    # the manager imports this package's policies: bind its names on first use, not at import
    if name in ("CheckpointManager", "CheckpointManagerOptions", "AbstractCheckpointManager"):
        from ocdbt_py.orbax import manager  # the manager imports this package

        return manager.CheckpointManager if name == "AbstractCheckpointManager" else getattr(manager, name)
    raise AttributeError(f"module 'ocdbt_py.orbax.checkpoint_managers' has no attribute {name!r}")
