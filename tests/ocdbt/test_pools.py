"""``ocdbt_py.pools``: sizes from ``SIZES``, the environment (with older names) and ``resize``;
the zarr3 engine's pools are the shared ones."""

from __future__ import annotations

import pytest

import zarr3
from ocdbt_py import pools
from zarr3.engine import executor


def test_size_from_table_environment_and_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OCDBT_PY_THREADS_COMPUTE", raising=False)
    monkeypatch.delenv("ZARR3_NUM_THREADS", raising=False)
    monkeypatch.setattr(pools, "_resized", {})
    assert pools.size("compute") == pools.SIZES["compute"]
    monkeypatch.setenv("ZARR3_NUM_THREADS", "3")
    assert pools.size("compute") == 3 == executor.num_threads() == zarr3.num_threads()
    monkeypatch.setenv("OCDBT_PY_THREADS_COMPUTE", "5")
    assert pools.size("compute") == 5
    monkeypatch.setenv("OCDBT_PY_THREADS_COMPUTE", "many")
    assert pools.size("compute") == 3
    monkeypatch.delenv("OCDBT_PY_THREADS_HTTP", raising=False)
    monkeypatch.delenv("OCDBT_PY_HTTP_THREADS", raising=False)
    assert pools.size("http", default=64) == 64
    monkeypatch.setenv("OCDBT_PY_HTTP_THREADS", "7")
    assert pools.size("http", default=64) == 7


def test_set_num_threads_resizes_the_shared_compute_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pools, "_resized", {})
    before = executor.get_pool()
    assert before is pools.shared("compute") and executor.get_io_pool() is pools.shared("write")
    zarr3.set_num_threads(2)
    try:
        after = executor.get_pool()
        assert after is not before and after._max_workers == 2 and pools.size("compute") == 2
        assert sorted(after.map(lambda x: x * 2, range(4))) == [0, 2, 4, 6]
    finally:
        pools._resized.pop("compute", None)
        pools.resize("compute", pools.size("compute"))
        pools._resized.pop("compute", None)
    with pytest.raises(ValueError):
        zarr3.set_num_threads(0)
