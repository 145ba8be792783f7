"""Bridges to the tools checkpoints move between: safetensors (Hugging Face / PyTorch),
an ``ocdbt`` fsspec protocol (zarr-python, xarray) and dask arrays.

>>> from ocdbt_py import bridges, checkpoint
>>> bridges.export_safetensors("/ckpts/1000/params", "model.safetensors")   # doctest: +SKIP
>>> bridges.export_safetensors("/ckpts/1000/params", "hf/", max_shard_size="5GB")  # doctest: +SKIP
>>> bridges.import_safetensors("hf/", "/ckpts/imported")      # doctest: +SKIP
>>> arrays = bridges.to_dask("/ckpts/1000/params")             # doctest: +SKIP
>>> state = bridges.to_torch(checkpoint.restore("/ckpts/1000/params"))  # doctest: +SKIP

Each bridge is a submodule imported on first use of its name; the optional libraries (dask,
torch) are imported only by the functions that need them.  The bridges sit above
:mod:`ocdbt_py.checkpoint` (they use its restore and save); it does not name them.

* :mod:`ocdbt_py.bridges.safetensors_export` / :mod:`~ocdbt_py.bridges.safetensors_import`:
  :func:`export_safetensors` / :func:`import_safetensors`.
* :mod:`ocdbt_py.bridges.fsspec_ocdbt`: ``fsspec.open("ocdbt://key::file:///db")``.
* :mod:`ocdbt_py.bridges.dask_arrays`: :func:`to_dask` (and ``zarr3.Array.to_dask``).
* :mod:`ocdbt_py.bridges.torch_tensors`: :func:`to_torch`.
* :mod:`ocdbt_py.bridges.zarr_store`: :class:`OcdbtZarrStore`, a zarr-python 3 store
  (needs the ``[zarr]`` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ocdbt_py.bridges.dask_arrays import to_dask
    from ocdbt_py.bridges.safetensors_export import export_safetensors
    from ocdbt_py.bridges.safetensors_import import import_safetensors
    from ocdbt_py.bridges.torch_tensors import to_torch
    from ocdbt_py.bridges.zarr_store import OcdbtZarrStore

__all__ = ["export_safetensors", "import_safetensors", "to_dask", "to_torch", "OcdbtZarrStore"]

_WHERE = {
    "export_safetensors": "ocdbt_py.bridges.safetensors_export",
    "import_safetensors": "ocdbt_py.bridges.safetensors_import",
    "to_dask": "ocdbt_py.bridges.dask_arrays",
    "to_torch": "ocdbt_py.bridges.torch_tensors",
    "OcdbtZarrStore": "ocdbt_py.bridges.zarr_store",
}


def __getattr__(name: str) -> Any:
    # lazy: importing one bridge (e.g. the fsspec protocol) does not load the others
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'ocdbt_py.bridges' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
