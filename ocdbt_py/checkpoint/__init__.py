"""Read Orbax checkpoints without TensorStore or JAX.

>>> from ocdbt_py import checkpoint
>>> params = checkpoint.restore("/ckpts/1000/params")            # doctest: +SKIP
>>> everything = checkpoint.restore("/ckpts")                    # latest step, every item
>>> tree = checkpoint.metadata("/ckpts/1000/params")             # shapes, dtypes, no data
>>> checkpoint.export_npz("/ckpts/1000/params", "params.npz")   # doctest: +SKIP
>>> checkpoint.copy("/old/1000", "/new/1000", use_ocdbt=True, use_zarr3=True)  # doctest: +SKIP

Importing this package imports neither JAX nor TensorStore; JAX is imported only when a
restore target contains JAX objects.  The on-disk layouts are described in ``spec/orbax.md``.
Conversions to other tools (safetensors, dask, torch) sit above this package, in
:mod:`ocdbt_py.bridges`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Bound eagerly: the subpackage ``checkpoint.restore`` would otherwise replace the function of
# the same name on this package the first time any of its modules is imported.
from ocdbt_py.checkpoint.restore.api import restore

if TYPE_CHECKING:
    from ocdbt_py.checkpoint.convert.api import copy
    from ocdbt_py.checkpoint.export import export_npz
    from ocdbt_py.checkpoint.layout import UncommittedStepWarning
    from ocdbt_py.checkpoint.manager import CheckpointManager
    from ocdbt_py.checkpoint.meta import LeafMetadata, StepEntry, list_steps, metadata
    from ocdbt_py.checkpoint.restore.reader import LazyArray
    from ocdbt_py.checkpoint.saving import JsonItem, SaveHandle, save

__all__ = [
    "restore",
    "metadata",
    "list_steps",
    "export_npz",
    "LeafMetadata",
    "StepEntry",
    "LazyArray",
    "UncommittedStepWarning",
    "save",
    "JsonItem",
    "SaveHandle",
    "CheckpointManager",
    "copy",
]

_WHERE = {
    "metadata": "ocdbt_py.checkpoint.meta",
    "list_steps": "ocdbt_py.checkpoint.meta",
    "LeafMetadata": "ocdbt_py.checkpoint.meta",
    "StepEntry": "ocdbt_py.checkpoint.meta",
    "export_npz": "ocdbt_py.checkpoint.export",
    "LazyArray": "ocdbt_py.checkpoint.restore.reader",
    "UncommittedStepWarning": "ocdbt_py.checkpoint.layout",
    "save": "ocdbt_py.checkpoint.saving.api",
    "JsonItem": "ocdbt_py.checkpoint.saving.api",
    "SaveHandle": "ocdbt_py.checkpoint.saving.async_save",
    "CheckpointManager": "ocdbt_py.checkpoint.manager.manager",
    "copy": "ocdbt_py.checkpoint.convert.api",
}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'ocdbt_py.checkpoint' has no attribute {name!r}")

    return getattr(importlib.import_module(mod), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
