"""``orbax.checkpoint.checkpoint_manager``'s names, for scripts that import from that module
(the classes live in :mod:`ocdbt_py.orbax.manager`)."""

from __future__ import annotations

from ocdbt_py.orbax.manager import (
    DEFAULT_ITEM_NAME,
    METRIC_ITEM_NAME,
    CheckpointInfo,
    CheckpointManager,
    CheckpointManagerOptions,
    StepAlreadyExistsError,
)
from ocdbt_py.orbax.options import AsyncOptions, MultiprocessingOptions

__all__ = ["CheckpointManager", "CheckpointManagerOptions", "CheckpointInfo", "StepAlreadyExistsError",
           "AsyncOptions", "MultiprocessingOptions", "DEFAULT_ITEM_NAME", "METRIC_ITEM_NAME"]
