"""Orbax's API over ocdbt_py: change ``import orbax.checkpoint as ocp`` to
``import ocdbt_py.orbax as ocp`` and the script runs unchanged.

>>> import ocdbt_py.orbax as ocp
>>> mngr = ocp.CheckpointManager("/tmp/ckpts", options=ocp.CheckpointManagerOptions(max_to_keep=3))  # doctest: +SKIP
>>> mngr.save(0, args=ocp.args.StandardSave({"w": np.ones(4)}))                                  # doctest: +SKIP
>>> mngr.wait_until_finished(); mngr.restore(mngr.latest_step())                                  # doctest: +SKIP

Same names, arguments and results as ``orbax.checkpoint`` 0.12.8 for what
``spec/orbax-api.md`` lists, writing the files Orbax writes (Orbax restores them and the other
way round), on any fsspec URL.  A thin layer over :mod:`ocdbt_py.checkpoint` (``save``,
``restore``, ``metadata`` and the native ``CheckpointManager``).  Importing it imports
neither JAX nor Orbax: NumPy-only trees work without them.
"""

from __future__ import annotations

from ocdbt_py.orbax import (
    args,
    checkpoint_args,
    checkpoint_manager,
    checkpoint_managers,
    checkpoint_utils,
    checkpointers,
    handlers,
    logging,
    metadata,
    options,
    path,
    transform_utils,
    tree,
    type_handlers,
    utils,
)
from ocdbt_py.orbax.args import CheckpointArgs
from ocdbt_py.orbax.checkpointers import (
    AbstractCheckpointer,
    AsyncCheckpointer,
    Checkpointer,
    PyTreeCheckpointer,
    StandardCheckpointer,
)
from ocdbt_py.orbax.handlers import (
    ArrayCheckpointHandler,
    AsyncCheckpointHandler,
    CheckpointHandler,
    CompositeCheckpointHandler,
    DefaultCheckpointHandlerRegistry,
    JsonCheckpointHandler,
    PyTreeCheckpointHandler,
    StandardCheckpointHandler,
)
from ocdbt_py.orbax.manager import CheckpointManager, CheckpointManagerOptions
from ocdbt_py.orbax.options import AsyncOptions, MultiprocessingOptions
from ocdbt_py.orbax.path import step
from ocdbt_py.orbax.transform_utils import RestoreTransform, Transform, apply_transformations
from ocdbt_py.orbax.type_handlers import ArrayRestoreArgs, RestoreArgs, SaveArgs

AbstractCheckpointManager = CheckpointManager
#: A restore-target leaf that is not restored (it stays ``...``), as Orbax's ``PLACEHOLDER``.
PLACEHOLDER = ...

__all__ = [
    "args",
    "checkpoint_args",
    "checkpoint_manager",
    "checkpoint_managers",
    "checkpoint_utils",
    "checkpointers",
    "handlers",
    "logging",
    "metadata",
    "options",
    "path",
    "step",
    "tree",
    "type_handlers",
    "utils",
    "CheckpointArgs",
    "AbstractCheckpointer",
    "Checkpointer",
    "AsyncCheckpointer",
    "StandardCheckpointer",
    "PyTreeCheckpointer",
    "CheckpointHandler",
    "AsyncCheckpointHandler",
    "StandardCheckpointHandler",
    "PyTreeCheckpointHandler",
    "JsonCheckpointHandler",
    "ArrayCheckpointHandler",
    "CompositeCheckpointHandler",
    "DefaultCheckpointHandlerRegistry",
    "CheckpointManager",
    "AbstractCheckpointManager",
    "CheckpointManagerOptions",
    "AsyncOptions",
    "MultiprocessingOptions",
    "SaveArgs",
    "RestoreArgs",
    "ArrayRestoreArgs",
    "PLACEHOLDER",
    "transform_utils",
    "Transform",
    "RestoreTransform",
    "apply_transformations",
]
