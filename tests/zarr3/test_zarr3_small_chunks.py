"""Small chunks are encoded and stored in batches: the same keys, bytes and deletions as one
chunk at a time."""

from __future__ import annotations

import numpy as np
import pytest

import zarr3
import zarr3.array as zarray
from ocdbt_py.kvstore import MemoryStore


def _write(store: MemoryStore, data: np.ndarray, first: np.ndarray) -> None:
    a = zarr3.create(store, shape=data.shape, dtype=data.dtype, chunks=(7, 5), fill_value=0,
                     codecs=[{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1}}])
    a[...] = first  # every chunk stored
    a[...] = data  # all-zero chunks deleted (write_empty_chunks is off), edge chunks padded
    assert np.array_equal(a[...], data)


@pytest.mark.parametrize("threads", [1, 4])
def test_batched_small_chunks_match_one_at_a_time(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    old = zarr3.engine.executor.num_threads()
    zarr3.engine.executor.set_num_threads(threads)
    try:
        rng = np.random.default_rng(5)
        data = rng.integers(1, 100, (103, 52)).astype(np.int32)
        data[14:28, :] = 0  # two rows of chunks that equal the fill value
        data[:, 50:] = 0  # the edge column of chunks too
        first = np.full(data.shape, 9, dtype=np.int32)
        assert zarray._chunks_per_job(7 * 5 * 4) > 1  # the batched path is the one taken
        batched, single = MemoryStore(), MemoryStore()
        _write(batched, data, first)
        monkeypatch.setattr(zarray, "_chunks_per_job", lambda n: 1)
        _write(single, data, first)
        keys = sorted(batched.list(""))
        assert keys == sorted(single.list(""))
        assert len(keys) < 15 * 11 + 1  # the fill-valued chunks were deleted
        for k in keys:
            assert batched.get(k) == single.get(k)
    finally:
        zarr3.engine.executor.set_num_threads(old)


def test_chunks_per_job() -> None:
    assert zarray._chunks_per_job(1 << 20) == 1
    assert zarray._chunks_per_job(zarray.SMALL_CHUNK_BATCH_BYTES) == 1
    assert zarray._chunks_per_job(64 << 10) == 4
    assert zarray._chunks_per_job(16) == zarray.SMALL_CHUNK_BATCH
