"""Which chunk shape an array gets, and which part of a replicated shard each replica writes.

Both follow Orbax 0.12's rules (``spec/orbax.md``, "Chunk shapes"), so the keys we write are
the keys Orbax would write for the same tree:

* ``chunk_byte_size`` is capped by ``ocdbt_target_data_file_size`` (default 2 GiB; 0 means no
  cap); with neither, a write larger than the target file size is chunked to it.
* With a byte limit the chunk starts as the write shape and one dimension at a time is replaced
  by its next smaller divisor (largest sharded dimension first, then any) until it fits, so
  chunks always divide the write shape.
* Replica-parallel writing: a shard held by ``R`` replicas is cut along its first dimension
  divisible by ``R`` and replica ``r`` writes slice ``r``; without such a dimension (or with
  one replica) replica 0 writes the whole shard.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "DEFAULT_TARGET_DATA_FILE_SIZE",
    "GCS_TARGET_DATA_FILE_SIZE",
    "chunk_byte_limit",
    "choose_chunk_shape",
    "replica_parallel_axis",
]

Shape = tuple[int, ...]

#: Orbax's default ``ocdbt_target_data_file_size`` (2 GiB) outside GCS.
DEFAULT_TARGET_DATA_FILE_SIZE = 2 << 30
#: Orbax's default on Google Cloud Storage (400 MiB).
GCS_TARGET_DATA_FILE_SIZE = 400 << 20


def chunk_byte_limit(
    write_shape: Sequence[int], itemsize: int, chunk_byte_size: int | None, target_data_file_size: int | None
) -> int | None:
    """The byte limit a chunk must respect (``None``: the chunk is the write shape)."""
    target = DEFAULT_TARGET_DATA_FILE_SIZE if target_data_file_size is None else target_data_file_size
    if target == 0:
        return chunk_byte_size
    if chunk_byte_size is None:
        return target if math.prod(write_shape) * itemsize > target else None
    return min(chunk_byte_size, target)


def _divisors(n: int) -> list[int]:
    small = [i for i in range(1, math.isqrt(n) + 1) if n % i == 0]
    return sorted(set(small) | {n // i for i in small})


def choose_chunk_shape(
    global_shape: Sequence[int], write_shape: Sequence[int], itemsize: int, limit: int | None
) -> Shape:
    """The largest chunk (dividing ``write_shape``) of at most ``limit`` bytes, chosen greedily."""
    if len(global_shape) != len(write_shape):
        raise ValueError(f"global shape {tuple(global_shape)} and write shape {tuple(write_shape)} differ in rank")
    ws = tuple(max(1, int(d)) for d in write_shape)
    if limit is None:
        return ws
    if limit < itemsize:
        raise ValueError(f"chunk_byte_size={limit} is smaller than one element ({itemsize} bytes)")
    rank = len(ws)
    sharded = [int(g) != int(w) for g, w in zip(global_shape, ws)]
    factors = [_divisors(d) for d in ws]
    total = math.prod(ws)
    target = limit // itemsize
    while total > target:
        best, best_size = -1, 1
        for i in range(rank):
            size = factors[i][-1]
            if sharded[i] and size > best_size:
                best, best_size = i, size
        if best_size > 1:
            cur = factors[best].pop()
            total = total // cur * factors[best][-1]
            sharded[best] = True
        else:
            if all(sharded):  # nothing left to split: every dimension is 1
                break
            sharded = [True] * rank
    return tuple(f[-1] for f in factors)


def replica_parallel_axis(shard_shape: Sequence[int], replicas: int) -> int | None:
    """The axis a shard held by ``replicas`` replicas is split along (``None``: not split)."""
    if replicas <= 1 or math.prod(shard_shape) == 0:
        return None
    for axis, size in enumerate(shard_shape):
        if size % replicas == 0:
            return axis
    return None
