"""``checkpoint.copy`` conversions restored by Orbax 0.12 with equal values.

Sources: Orbax 0.12 per-parameter and OCDBT checkpoints (Zarr v2/v3) of a sharded JAX tree,
the Orbax 0.5.10 fixtures, and a manager root of composite steps with JSON items.  Every
copy is made with ``verify=True``; Orbax then restores it (no target) and the values must
equal our restore of the source; some copies are also restored onto another mesh, and the
re-chunked ones must have the chunk shapes Orbax itself would choose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint_convert.conftest import FIXTURES, run_worker

# name -> (source, copy options)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "pp2_to_ocdbt3": ("pp2", {"use_ocdbt": True, "use_zarr3": True}),
    "pp2_to_ocdbt2": ("pp2", {"use_ocdbt": True}),
    "pp3_to_ocdbt2": ("pp3", {"use_ocdbt": True, "use_zarr3": False}),
    "oc2_to_pp": ("oc2", {"use_ocdbt": False}),
    "oc3_to_pp2": ("oc3", {"use_ocdbt": False, "use_zarr3": False}),
    "oc2_to_zarr3": ("oc2", {"use_zarr3": True}),
    "pp2_same": ("pp2", {}),
    "oc2_chunked": ("oc2", {"chunk_byte_size": 1024}),
    "pp2_to_ocdbt_chunked_small_files": ("pp2", {"use_ocdbt": True, "chunk_byte_size": 2048,
                                                 "ocdbt_target_data_file_size": 16384}),
    "oc2_target_only": ("oc2", {"ocdbt_target_data_file_size": 8192}),
    "oc3_bf16_uncompressed": ("oc3", {"dtype": "bfloat16", "compression": "none"}),
    "pp2_zstd7_zarr3": ("pp2", {"use_zarr3": True, "compression": "zstd:7"}),
    "pp2_exclude": ("pp2", {"exclude": ["params.*"]}),
    "v05_dirs_to_ocdbt3": ("v05:pytree_dirs", {"use_ocdbt": True, "use_zarr3": True}),
    "v05_ocdbt_to_pp": ("v05:pytree_ocdbt", {"use_ocdbt": False}),
    "v05_zarr3_to_pp2_chunked": ("v05:pytree_zarr3", {"use_ocdbt": False, "use_zarr3": False,
                                                      "chunk_byte_size": 64}),
    # Orbax 0.5's aggregate layout: inline values in a msgpack "checkpoint" file (kept as bytes)
    "v05_aggregate_to_pp3": ("v05:aggregate", {"use_ocdbt": False, "use_zarr3": True}),
}
MESH = ["pp2_to_ocdbt3", "oc2_to_pp", "oc2_chunked", "pp3_to_ocdbt2"]
CHUNKED = ["oc2_chunked", "pp2_to_ocdbt_chunked_small_files", "oc2_target_only", "v05_zarr3_to_pp2_chunked"]


def _src(sources: Path, name: str) -> Path:
    return FIXTURES / name[4:] if name.startswith("v05:") else sources / name


def _chunk_rows(path: Path, opts: dict[str, Any]) -> list[list[Any]]:
    from ocdbt_py.checkpoint.restore.item import PyTreeItem
    from ocdbt_py.kvstore import open_kvstore

    item = PyTreeItem(open_kvstore(str(path)))
    ams = item.array_metadatas()
    rows = []
    use_ocdbt = item.layout != "dirs"
    for leaf in item.leaves:
        if leaf.kind not in ("array", "scalar"):
            continue
        meta = item.reader.metadata(leaf.param_name)
        ws = ams.get(leaf.param_name, {}).get("write_shape") or list(meta.shape)
        rows.append([leaf.param_name, list(meta.shape), ws, meta.data_type.dtype.itemsize, list(meta.chunk_shape),
                     opts.get("chunk_byte_size"), opts.get("ocdbt_target_data_file_size", 2 << 30), use_ocdbt])
    item.close()
    return rows


@pytest.fixture(scope="module")
def converted(orbax_sources: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path,
                                                                                      dict[str, Any]]:
    from ocdbt_py.checkpoint import copy

    out = tmp_path_factory.mktemp("cp_out")
    summaries: dict[str, Any] = {}
    jobs: list[dict[str, Any]] = []
    for name, (src, opts) in CASES.items():
        s = _src(orbax_sources, src)
        summaries[name] = copy(s, out / name, verify=True, workers=3, **opts)
        job: dict[str, Any] = {"name": name, "kind": "restore", "path": str(out / name), "src": str(s)}
        if "dtype" in opts:
            job["dtype"] = opts["dtype"]
        if "exclude" in opts:
            import fnmatch

            from ocdbt_py.checkpoint import restore
            from tests.checkpoint_convert._cp_trees import flatten

            job["exclude"] = [k for k in flatten(restore(s)) if fnmatch.fnmatchcase(k, opts["exclude"][0])]
        jobs.append(job)
    for name in MESH:
        jobs.append({"name": f"mesh:{name}", "kind": "restore_mesh", "path": str(out / name)})
    rows = [r for name in CHUNKED for r in _chunk_rows(out / name, CASES[name][1])]
    jobs.append({"name": "chunk_shapes", "kind": "chunk_shapes", "arrays": rows})
    # a manager root: every step, and one step into the per-parameter layout
    summaries["mgr_all"] = copy(orbax_sources / "mgr", out / "mgr_all", use_ocdbt=True, use_zarr3=True, verify=True)
    summaries["mgr_step2"] = copy(orbax_sources / "mgr", out / "mgr_step2", steps=[2], use_zarr3=True)
    jobs.append({"name": "mgr_all", "kind": "manager", "path": str(out / "mgr_all"), "steps": [1, 2],
                 "src": str(orbax_sources / "mgr"), "items": ["state", "meta"]})
    jobs.append({"name": "mgr_step2", "kind": "manager", "path": str(out / "mgr_step2"), "steps": [2],
                 "src": str(orbax_sources / "mgr"), "items": ["state", "meta"]})
    return run_worker(jobs, out), out, summaries


@pytest.mark.parametrize("name", list(CASES))
def test_orbax_restores_copy(converted: tuple[dict[str, Any], Path, dict[str, Any]], name: str) -> None:
    report, _, summaries = converted
    assert report[name]["errors"] == []
    assert summaries[name]["arrays"] > 0 and summaries[name]["verified"]


@pytest.mark.parametrize("name", MESH)
def test_orbax_restores_copy_onto_another_mesh(converted: tuple[dict[str, Any], Path, dict[str, Any]],
                                               name: str) -> None:
    report, _, _ = converted
    assert report[f"mesh:{name}"]["errors"] == []


def test_chunk_shapes_are_orbaxs(converted: tuple[dict[str, Any], Path, dict[str, Any]]) -> None:
    report, out, _ = converted
    assert report["chunk_shapes"]["errors"] == []
    assert report["chunk_shapes"]["info"]["arrays"] >= 12
    # the copies really were re-chunked
    zarray = json.loads((out / "v05_zarr3_to_pp2_chunked" / "params.kernel" / ".zarray").read_text())
    assert 1 < zarray["chunks"][0] * zarray["chunks"][1] * 4 <= 64


def test_manager_root_copies(converted: tuple[dict[str, Any], Path, dict[str, Any]]) -> None:
    report, out, summaries = converted
    assert report["mgr_all"]["errors"] == [] and report["mgr_step2"]["errors"] == []
    assert [u["name"] for u in summaries["mgr_all"]["units"]] == ["1", "2"]
    assert sorted(p.name for p in (out / "mgr_step2").iterdir()) == ["2"]
    step = out / "mgr_all" / "1"
    assert sorted(p.name for p in step.iterdir()) == ["_CHECKPOINT_METADATA", "commit_success.txt", "meta", "state"]
    assert (step / "state" / "manifest.ocdbt").exists() and (step / "state" / "commit_success.txt").exists()
    assert json.loads((step / "state" / "_METADATA").read_text())["use_zarr3"] is True
    assert json.loads((step / "meta" / "metadata").read_text()) == {"step": 1, "lr": [0.1, 0.01]}


def test_layouts_and_chunk_paths(converted: tuple[dict[str, Any], Path, dict[str, Any]],
                                 orbax_sources: Path) -> None:
    _, out, summaries = converted
    # per-parameter -> OCDBT Zarr v3 keeps the compressed frames (no decode), and the reverse
    assert summaries["pp2_to_ocdbt3"]["chunks_rewrapped"] > 0 and summaries["pp2_to_ocdbt3"]["chunks_encoded"] == 0
    assert summaries["oc3_to_pp2"]["chunks_rewrapped"] > 0 and summaries["oc3_to_pp2"]["chunks_encoded"] == 0
    # a new zstd level alone: frames decompressed and compressed as streams, nothing decoded
    s = summaries["pp2_zstd7_zarr3"]
    assert s["chunks_transcoded"] > 0 and s["chunks_encoded"] == 0
    zarr_json = json.loads((out / "pp2_zstd7_zarr3" / "params.kernel" / "zarr.json").read_text())
    assert zarr_json["codecs"][0]["configuration"]["codecs"][1] == {"name": "zstd",
                                                                    "configuration": {"level": 7, "checksum": False}}
    # without options: bytes
    s = summaries["pp2_same"]
    assert s["chunks_bytes"] > 0 and s["chunks_rewrapped"] == s["chunks_encoded"] == 0
    for f in ("params.kernel/.zarray", "params.kernel/0.0", "embed/1.0", "_sharding"):
        assert (out / "pp2_same" / f).read_bytes() == (orbax_sources / "pp2" / f).read_bytes(), f
    d = out / "oc2_to_pp"
    assert (d / "params.kernel" / ".zarray").exists() and not (d / "manifest.ocdbt").exists()
    assert json.loads((d / "_METADATA").read_text())["use_ocdbt"] is False
    d = out / "pp2_to_ocdbt3"
    meta = json.loads((d / "_METADATA").read_text())
    assert meta["use_ocdbt"] is True and meta["use_zarr3"] is True
    assert (d / "manifest.ocdbt").exists() and (d / "ocdbt.process_0" / "manifest.ocdbt").exists()
    assert not list(out.glob("*.orbax-checkpoint-tmp")) and not list(out.glob("*/.ocdbt-cp"))


def test_data_files_respect_target_size(converted: tuple[dict[str, Any], Path, dict[str, Any]]) -> None:
    _, out, _ = converted
    files = [p.stat().st_size for p in (out / "pp2_to_ocdbt_chunked_small_files" / "ocdbt.process_0" / "d").iterdir()]
    assert len(files) > 3
    # a data file is closed once it reaches the target (TensorStore's rule): at most one
    # value (a chunk of <= 2048 bytes, plus its Zarr framing) past it
    assert max(files) <= 16384 + 2048 + 64
