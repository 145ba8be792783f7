"""Real ``jax.distributed`` jobs (2 and 4 processes on 127.0.0.1, gloo) save with ``save``;
Orbax restores the result onto other meshes, and so does our NumPy reader."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.checkpoint_save.conftest import Report


@pytest.mark.parametrize("processes", [2, 4])
def test_multiprocess_save_restored_by_orbax(mp_report: Callable[[int], tuple[Report, Path]], processes: int) -> None:
    report, out = mp_report(processes)
    assert report.errors(f"mp{processes}") == []
    # every process wrote its own database; the root references all of them
    for sub in ("zarr2", "chunked", "steps/1/state"):
        d = out / sub
        assert sorted(p.name for p in d.glob("ocdbt.process_*")) == [f"ocdbt.process_{i}" for i in range(processes)]
        assert sorted(p.name for p in (d / "array_metadatas").iterdir()) == [f"process_{i}" for i in range(processes)]
        assert (d / "commit_success.txt").exists()
    assert not list(out.glob("*.orbax-checkpoint-tmp"))
    # a save that fails on the primary (destination exists) fails on every process, promptly
    results = report.info("processes")["results"]
    assert [r["exists_error"] for r in results] == ["CheckpointExistsError"] + ["PeerFailedError"] * (processes - 1)
    assert max(r["error_seconds"] for r in results) < 60
    # ocdbt_py.orbax's checkpointers: every process returned with the checkpoint in place
    assert [r["checkpointers_seen"] for r in results] == [[True, True]] * processes
    for sub in ("ocp_sync", "ocp_async"):
        assert sorted(p.name for p in (out / sub).glob("ocdbt.process_*")) == [f"ocdbt.process_{i}" for i in
                                                                              range(processes)]
        assert (out / sub / "commit_success.txt").exists() and (out / sub / "_CHECKPOINT_METADATA").exists()


@pytest.mark.parametrize("processes", [2, 4])
def test_multiprocess_save_restored_by_numpy_reader(mp_report: Callable[[int], tuple[Report, Path]],
                                                    processes: int) -> None:
    import ocdbt_py
    from ocdbt_py.checkpoint import restore
    from tests.checkpoint_save._mp_values import global_values

    _, out = mp_report(processes)
    vals = global_values()
    for sub in ("zarr2", "chunked", "steps/1/state"):
        got = restore(out / sub)
        for k, v in vals.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), (sub, k)
        assert got["step"] == 7 and got["note"] == "multi"
    assert restore(out / "steps")["meta"] == {"n": processes}
    # the merged root copies no data: its entries are the children's, references rebased
    from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference

    children = {}
    for i in range(processes):
        child = ocdbt_py.open(out / "zarr2" / f"ocdbt.process_{i}")
        children.update({e.key: (i, e, child) for e in child.entries()})
    root = ocdbt_py.open(out / "zarr2")
    entries = list(root.entries())
    assert sorted(e.key for e in entries) == sorted(children)
    for e in entries:
        i, ce, child = children[e.key]
        if ce.location is None:
            assert e.location is None and root.get(e.key) == child.get(e.key)
        else:
            base = f"ocdbt.process_{i}/".encode()
            assert e.location == IndirectDataReference(DataFileId(base, ce.location.file.relative_path),
                                                       ce.location.offset, ce.location.length)
    assert {e.location.file.base_path for e in entries if e.location is not None} == {
        f"ocdbt.process_{i}/".encode() for i in range(processes)}
    meta = json.loads((out / "zarr2" / "_METADATA").read_text())
    assert meta["tree_metadata"]["('kernel',)"]["value_metadata"]["write_shape"] == [16, 32]
