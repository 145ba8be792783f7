"""Bridges to the tools checkpoints move between: safetensors (Hugging Face / PyTorch),
an ``ocdbt`` fsspec protocol (zarr-python, xarray) and dask arrays.

Each bridge is a submodule imported on use; the optional libraries (dask, torch) are
imported only by the functions that need them.

* :mod:`ocdbt_py.bridges.safetensors_export` / :mod:`~ocdbt_py.bridges.safetensors_import`:
  ``checkpoint.export_safetensors`` / ``checkpoint.import_safetensors``.
* :mod:`ocdbt_py.bridges.fsspec_ocdbt`: ``fsspec.open("ocdbt://key::file:///db")``.
* :mod:`ocdbt_py.bridges.dask_arrays`: ``checkpoint.to_dask`` and ``zarr3.Array.to_dask``.
* :mod:`ocdbt_py.bridges.torch_tensors`: ``checkpoint.restore(..., framework="torch")``.
"""
