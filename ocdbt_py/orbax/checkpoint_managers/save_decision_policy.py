"""``orbax.checkpoint.checkpoint_managers.save_decision_policy``'s names, for scripts that import from that
module (the save decision policies live in :mod:`ocdbt_py.orbax.save_decision`, below the manager that uses them)."""

from __future__ import annotations

from ocdbt_py.orbax.save_decision import (
    AnySavePolicy,
    ContinuousCheckpointingPolicy,
    DecisionContext,
    FixedIntervalPolicy,
    InitialSavePolicy,
    PolicyCheckpointInfo,
    PreemptionCheckpointingPolicy,
    SaveDecisionPolicy,
    SpecificStepsPolicy,
)

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
