"""The checkpoint lifecycle of a training loop: :class:`CheckpointManager` and its policies.

>>> from ocdbt_py.checkpoint.manager import CheckpointManager, FixedInterval, LatestN
>>> mgr = CheckpointManager("/ckpts", save_policy=FixedInterval(100), preservation=LatestN(3))  # doctest: +SKIP

Modules: :mod:`.manager` (``CheckpointManager``), :mod:`.save_policy` (when to save),
:mod:`.preservation` (what to keep), :mod:`.naming` (step directory names), :mod:`.steps`
(listing, cleanup, deletion), :mod:`.preemption` (SIGTERM and JAX's preemption sync point),
:mod:`.multitier` (``MultiTierCheckpointManager``: frequent process-local checkpoints plus
rarer persistent ones, restored from the fastest tier that has the step).
Save policies and preservation policies share the name ``AnyOf`` and ``EveryNSeconds``; here
they are exported as ``SaveAnyOf``/``SaveEveryNSeconds`` and ``KeepAnyOf``/``KeepEveryNSeconds``
(each module also has its own plain names).
"""

from __future__ import annotations

from ocdbt_py.checkpoint.manager.manager import CheckpointManager, StepAlreadyExistsError, default_save_policy
from ocdbt_py.checkpoint.manager.multitier import MultiTierCheckpointManager, RestoreInfo
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.manager.preservation import AnyOf as KeepAnyOf
from ocdbt_py.checkpoint.manager.preservation import (
    BestN,
    CustomSteps,
    EveryNSteps,
    LatestN,
    PreservationPolicy,
    PreserveAll,
    StepInfo,
)
from ocdbt_py.checkpoint.manager.preservation import EveryNSeconds as KeepEveryNSeconds
from ocdbt_py.checkpoint.manager.save_policy import AnyOf as SaveAnyOf
from ocdbt_py.checkpoint.manager.save_policy import (
    Continuous,
    FixedInterval,
    InitialSave,
    Preemption,
    SaveContext,
    SavedStep,
    SavePolicy,
    SpecificSteps,
)
from ocdbt_py.checkpoint.manager.save_policy import EveryNSeconds as SaveEveryNSeconds

__all__ = [
    "CheckpointManager",
    "MultiTierCheckpointManager",
    "RestoreInfo",
    "StepAlreadyExistsError",
    "default_save_policy",
    "StepNameFormat",
    "SavePolicy",
    "SaveContext",
    "SavedStep",
    "FixedInterval",
    "SpecificSteps",
    "SaveEveryNSeconds",
    "Continuous",
    "Preemption",
    "InitialSave",
    "SaveAnyOf",
    "PreservationPolicy",
    "StepInfo",
    "PreserveAll",
    "LatestN",
    "EveryNSteps",
    "KeepEveryNSeconds",
    "BestN",
    "CustomSteps",
    "KeepAnyOf",
]
