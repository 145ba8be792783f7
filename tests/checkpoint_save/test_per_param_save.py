"""``save(use_ocdbt=False)``: the per-parameter layout, restored by Orbax (also onto another
mesh) and laid out file for file as ``PyTreeCheckpointHandler(use_ocdbt=False)`` writes it.
The multi-process saves are in ``test_multiprocess_save.py`` (``perparam`` paths)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.checkpoint_save import _trees
from tests.checkpoint_save.conftest import Report, have_oracle, run_worker


@pytest.fixture(scope="module")
def per_param(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    if not have_oracle():
        pytest.skip("orbax-checkpoint, jax and tensorstore are needed for the oracle tests")
    from ocdbt_py.checkpoint import JsonItem, save

    root = tmp_path_factory.mktemp("per_param")
    jobs = []
    for name, builder, kw in [
        ("rich2", "rich_tree", {}),
        ("rich3", "rich_tree", {"use_zarr3": True}),
        ("plain", "rich_tree", {"use_compression": False}),
        ("chunked", "chunked_tree", {"chunk_byte_size": 4096, "ocdbt_target_data_file_size": 1000}),
        ("chunked3", "chunked_tree", {"chunk_byte_size": 1000, "use_zarr3": True}),
    ]:
        save(root / name, getattr(_trees, builder)(), use_ocdbt=False, **kw)
        jobs.append({"name": name, "kind": "restore", "path": str(root / name), "tree": builder, "via": "pytree"})
    mgr = root / "manager"
    for step in (1, 2):
        save(mgr / str(step), {"params": _trees.numeric_tree(), "meta": JsonItem({"step": step})},
             composite=True, use_ocdbt=False)
    jobs.append({"name": "manager", "kind": "restore", "via": "manager", "path": str(mgr), "steps": [1, 2],
                 "step": 2, "items": {"params": {"tree": "numeric_tree"}, "meta": {"json": {"step": 2}}}})
    for name, opts in [("jax2", {}), ("jax3", {"use_zarr3": True}), ("jaxchunk", {"chunk_byte_size": 64})]:
        jobs.append({"name": name, "kind": "jax_layout", "dir": str(root / name),
                     "options": {"use_ocdbt": False, **opts}})
    return Report(run_worker(jobs, root), {}), root


@pytest.mark.parametrize("name", ["rich2", "rich3", "plain", "chunked", "chunked3", "manager"])
def test_orbax_restores_per_param_numpy(per_param: tuple[Report, Path], name: str) -> None:
    report, _ = per_param
    assert report.errors(name) == []


@pytest.mark.parametrize("name", ["jax2", "jax3", "jaxchunk"])
def test_sharded_jax_per_param_same_files_as_orbax(per_param: tuple[Report, Path], name: str) -> None:
    """Same files and metadata documents as Orbax's save of the same sharded tree; Orbax and we
    restore ours onto another mesh."""
    report, _ = per_param
    assert report.errors(name) == []


def test_per_param_files(per_param: tuple[Report, Path]) -> None:
    from ocdbt_py.checkpoint import restore

    _, root = per_param
    d = root / "chunked"
    meta = json.loads((d / "_METADATA").read_text())
    assert meta["use_ocdbt"] is False
    assert not list(d.glob("ocdbt.process_*")) and not (d / "manifest.ocdbt").exists()
    zarray = json.loads((d / "a" / ".zarray").read_text())
    # chunk_byte_size alone decides the chunk (no data-file cap without OCDBT)
    assert np.prod(zarray["chunks"]) * np.dtype(zarray["dtype"]).itemsize <= 4096
    got = restore(d)
    want = _trees.chunked_tree()
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(got[k], v)
