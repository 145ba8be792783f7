"""The shared read/write engine under every array and every checkpoint restore.

* :mod:`zarr3.engine.executor`: the worker pools (from :mod:`ocdbt_py.pools`) and the bounded
  fetch -> decode pipeline, the I/O sink of writes, the local-file fetcher.
* :mod:`zarr3.engine.alloc`: output allocation bounded by the machine's memory.
* :mod:`zarr3.engine.json_text`: JSON read with depth/size bounds and written byte-identical to
  TensorStore's.
* :mod:`zarr3.engine.dask_blocks`: dask graphs of whole stored chunks.

``zarr3`` arrays, ``ocdbt_py.checkpoint`` restore, ``ocdbt_py.inspect`` and ``ocdbt_py.bridges``
all run on it; it needs nothing of ocdbt-py but ``KvStore``, ``errors`` and ``pools``.
"""
