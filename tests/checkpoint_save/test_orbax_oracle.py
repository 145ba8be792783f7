"""Orbax and TensorStore read what ``ocdbt_py.checkpoint.save`` writes (see ``conftest.oracle``)."""

from __future__ import annotations

import pytest

from tests.checkpoint_save.conftest import Report

RESTORE_CASES = [
    "rich_zarr2",  # every dtype, scalar kind, string, None/empty container, odd keys and layouts
    "rich_zarr3",
    "rich_uncompressed",
    "numeric_standard",  # StandardCheckpointer
    "numeric_zarr3_standard",
    "chunked",  # chunk_byte_size + ocdbt_target_data_file_size
    "chunked_zarr3",
    "target_only",
    "in_place",  # commit-file mode (non-renaming backend)
    "manager",  # CheckpointManager over our composite step dirs (JSON item, overwrite, tmp dir)
    "manager_default",
]


@pytest.mark.parametrize("name", RESTORE_CASES)
def test_orbax_restores_numpy_saves(oracle: Report, name: str) -> None:
    assert oracle.errors(name) == []


@pytest.mark.parametrize("name", ["ts_zarr2", "ts_zarr3", "ts_chunked"])
def test_tensorstore_opens_our_ocdbt_and_zarr(oracle: Report, name: str) -> None:
    assert oracle.errors(name) == []


@pytest.mark.parametrize("name", ["jax_zarr2", "jax_zarr3", "jax_chunked", "jax_pytrees"])
def test_sharded_jax_save_matches_orbax_and_restores_on_other_mesh(oracle: Report, name: str) -> None:
    """Same metadata documents, keys and Zarr metadata as Orbax's own save of the same sharded
    tree (replica-parallel writes, PRNG key, single-device array); Orbax and ocdbt_py restore
    it onto a 2x4 mesh."""
    assert oracle.errors(name) == []


def test_async_jax_save_survives_deleted_buffers(oracle: Report) -> None:
    assert oracle.errors("jax_async") == []


def test_repeated_async_jax_saves_keep_the_values_at_save_time(oracle: Report) -> None:
    assert oracle.errors("jax_repeat") == []


def test_chunk_shapes_agree_with_orbax(oracle: Report) -> None:
    assert oracle.errors("chunk_shapes") == []
    assert oracle.info("chunk_shapes")["cases"] > 300


def test_sharded_save_restores_with_numpy_reader(oracle: Report) -> None:
    """Our JAX-free restore reads the sharded checkpoints the JAX worker wrote with save()."""
    import sys

    import numpy as np

    from ocdbt_py.checkpoint import restore
    from tests.checkpoint_save import _trees

    jax_before = "jax" in sys.modules  # other tests in the same run may have imported it
    for name in ("jax_zarr2", "jax_zarr3", "jax_async"):
        got = restore(oracle.paths[name])
        for k, v in _trees.sharded_values().items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), (name, k)
        assert got["label"] == "sharded" and got["count"] == 11
        assert got["key"].dtype == np.uint32 and got["key"].shape == (2,)
    assert jax_before or "jax" not in sys.modules
