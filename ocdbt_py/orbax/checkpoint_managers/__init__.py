"""``ocp.checkpoint_managers``: save decision and preservation policies, and the manager.

Every name is importable from here, as from Orbax's module of the same name, and from the
``save_decision_policy`` / ``preservation_policy`` submodules.  This package only gathers names:
the policies are defined in :mod:`ocdbt_py.orbax.save_decision` / :mod:`ocdbt_py.orbax.preservation`
and the manager, which uses them, in :mod:`ocdbt_py.orbax.manager`, both below it.
"""

from __future__ import annotations

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

