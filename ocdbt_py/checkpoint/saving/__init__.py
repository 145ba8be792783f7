"""Writing Orbax checkpoints from NumPy or JAX trees, without TensorStore or Orbax.

>>> import numpy as np
>>> from ocdbt_py.checkpoint import save, restore
>>> save("/tmp/ckpt", {"w": np.ones((4, 4), "float32"), "step": 3})      # doctest: +SKIP
>>> restore("/tmp/ckpt")["step"]                                          # doctest: +SKIP
3

:func:`save` writes the layout Orbax 0.12 writes (OCDBT per process, merged root, Zarr v2 or
v3 inside, ``_METADATA`` and friends; or with ``use_ocdbt=False`` the per-parameter layout) to
any fsspec filesystem; see ``spec/orbax.md``.
Modules: :mod:`.params` (tree walk, names, collisions), :mod:`.chunking` (chunk shapes,
replica-parallel axis), :mod:`.arrays` (Zarr metadata and chunk encoding),
:mod:`.jax_arrays` (shards and shardings), :mod:`.host_copy` (copies for async saves),
the databases themselves are built in one pass by :mod:`ocdbt_py.write.bulk` (streaming
into data files through :mod:`ocdbt_py.kvstore.sinks`), :mod:`.process_writer` (a process's
database), :mod:`.dir_writer` (the per-parameter layout's files), :mod:`.merge` (the merged root),
:mod:`.layout_writer` (metadata documents), :mod:`.atomic` (commit), :mod:`.async_save`
(handles), :mod:`.distributed` (barriers), :mod:`.api` (``save``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ocdbt_py.checkpoint.saving.api import JsonItem, save
    from ocdbt_py.checkpoint.saving.async_save import SaveHandle
    from ocdbt_py.checkpoint.saving.atomic import CheckpointExistsError
    from ocdbt_py.checkpoint.saving.params import ParamNameCollisionError, UnsupportedLeafError

__all__ = ["save", "JsonItem", "SaveHandle", "CheckpointExistsError", "ParamNameCollisionError",
           "UnsupportedLeafError"]

_WHERE = {
    "save": "ocdbt_py.checkpoint.saving.api",
    "JsonItem": "ocdbt_py.checkpoint.saving.api",
    "SaveHandle": "ocdbt_py.checkpoint.saving.async_save",
    "CheckpointExistsError": "ocdbt_py.checkpoint.saving.atomic",
    "ParamNameCollisionError": "ocdbt_py.checkpoint.saving.params",
    "UnsupportedLeafError": "ocdbt_py.checkpoint.saving.params",
}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'ocdbt_py.checkpoint.saving' has no attribute {name!r}")

    return getattr(importlib.import_module(mod), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
