"""zarr3: read and write Zarr v3 and v2 arrays, inside OCDBT or on any fsspec filesystem.

Reads everything TensorStore's ``zarr3`` and ``zarr`` drivers write (sharding, every codec
and chunk key encoding, bfloat16, the float8 family, int4, ...) and writes arrays they read
back, with metadata byte-identical to TensorStore's.

>>> import numpy as np, zarr3
>>> from ocdbt_py.kvstore import MemoryStore
>>> store = MemoryStore()
>>> a = zarr3.create(store, "x", shape=(4, 6), dtype="float32", chunks=(2, 3),
...                  compressor="zstd")
>>> a[...] = np.arange(24, dtype="float32").reshape(4, 6)
>>> zarr3.open(store, "x")[1:3, ::2].tolist()
[[6.0, 8.0, 10.0], [12.0, 14.0, 16.0]]
"""

from __future__ import annotations

from zarr3.array import Array, create, open
from zarr3.dtypes import DATA_TYPES, DataType
from zarr3.engine.executor import num_threads, set_num_threads
from zarr3.errors import (
    ArrayNotFoundError,
    ChunkNotFoundError,
    CodecUnavailableError,
    CorruptionError,
    MetadataError,
    NodeExistsError,
    ReadOnlyError,
    UnsupportedError,
    ZarrError,
)
from zarr3.group import Group, create_group, open_group
from zarr3.metadata_v2 import ArrayMetadataV2, GroupMetadataV2
from zarr3.metadata_v3 import ArrayMetadataV3, GroupMetadataV3

__version__ = "0.1.0"

__all__ = [
    "open",
    "create",
    "open_group",
    "create_group",
    "Array",
    "Group",
    "ArrayMetadataV3",
    "ArrayMetadataV2",
    "GroupMetadataV3",
    "GroupMetadataV2",
    "DataType",
    "DATA_TYPES",
    "ZarrError",
    "MetadataError",
    "ArrayNotFoundError",
    "NodeExistsError",
    "ChunkNotFoundError",
    "CodecUnavailableError",
    "CorruptionError",
    "ReadOnlyError",
    "UnsupportedError",
    "num_threads",
    "set_num_threads",
]
