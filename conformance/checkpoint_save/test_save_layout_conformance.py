"""Byte-level conformance of ``ocdbt_py.checkpoint.save`` with Orbax 0.12 on NumPy trees.

This process (no JAX: the plain-container walk) saves a tree; Orbax saves the same tree in a
subprocess.  Every metadata document, the OCDBT key sets (per-process and merged root), the
Zarr metadata values and the OCDBT config must be identical; only uuids, timestamps, data-file
names and compressed chunk bytes may differ.  (The sharded-JAX counterpart is
``tests/checkpoint_save``'s ``jax_layout`` jobs.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.checkpoint_save import _trees  # noqa: E402
from tests.checkpoint_save.conftest import have_oracle, run_worker  # noqa: E402

CASES = {
    "rich_zarr2": {"tree": "orbax_savable_tree"},
    "rich_zarr3": {"tree": "orbax_savable_tree", "use_zarr3": True},
    "numeric_chunked": {"tree": "numeric_tree", "chunk_byte_size": 64},
    "chunked_zarr3": {"tree": "chunked_tree", "use_zarr3": True, "chunk_byte_size": 4096},
    # the per-parameter layout (PyTreeCheckpointHandler(use_ocdbt=False))
    "perparam_zarr2": {"tree": "orbax_savable_tree", "use_ocdbt": False},
    "perparam_zarr3_chunked": {"tree": "chunked_tree", "use_zarr3": True, "chunk_byte_size": 4096,
                               "use_ocdbt": False},
}
OCDBT_CASES = [n for n, o in CASES.items() if o.get("use_ocdbt", True)]
PER_PARAM_CASES = [n for n in CASES if n not in OCDBT_CASES]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    if not have_oracle():
        pytest.skip("orbax-checkpoint, jax and tensorstore are needed")
    from ocdbt_py.checkpoint import save

    root = tmp_path_factory.mktemp("save_conformance")
    jax_before = "jax" in sys.modules  # other tests in the same run may have imported it
    jobs = []
    out: dict[str, tuple[Path, Path]] = {}
    for name, opts in CASES.items():
        ours, theirs = root / name / "ours", root / name / "orbax"
        kw = {k: v for k, v in opts.items() if k != "tree"}
        save(ours, getattr(_trees, opts["tree"])(), handler="pytree", **kw)
        jobs.append({"name": name, "kind": "orbax_save", "path": str(theirs), **opts})
        out[name] = (ours, theirs)
    report = run_worker(jobs, root)
    assert {k: v["errors"] for k, v in report.items() if v["errors"]} == {}
    assert jax_before or "jax" not in sys.modules  # our save and this harness never import JAX
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_metadata_documents_identical(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    ours, theirs = pairs[name]
    for f in ("_METADATA", "_strings.json", "_sharding", "array_metadatas/process_0"):
        assert (ours / f).exists() == (theirs / f).exists(), f
        if (theirs / f).exists():
            assert (ours / f).read_bytes() == (theirs / f).read_bytes(), f
    a = json.loads((ours / "_CHECKPOINT_METADATA").read_text())
    b = json.loads((theirs / "_CHECKPOINT_METADATA").read_text())
    assert list(a) == list(b) and a["item_handlers"] == b["item_handlers"]
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())


@pytest.mark.parametrize("name", PER_PARAM_CASES)
def test_per_param_files_and_zarr_metadata_identical(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    """Per-parameter layout: the same files, byte-identical Zarr metadata, and chunk files of
    the same size class (compressed bytes may differ between zstd builds)."""
    ours, theirs = pairs[name]
    fa = sorted(str(p.relative_to(ours)) for p in ours.rglob("*") if p.is_file())
    fb = sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*") if p.is_file())
    assert fa == fb
    assert not (ours / "manifest.ocdbt").exists() and json.loads((ours / "_METADATA").read_text())["use_ocdbt"] is False
    for f in fb:
        if f.endswith((".zarray", "zarr.json")):
            assert (ours / f).read_bytes() == (theirs / f).read_bytes(), f


@pytest.mark.parametrize("name", OCDBT_CASES)
def test_ocdbt_keys_zarr_metadata_and_config_identical(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    import ocdbt_py

    ours, theirs = pairs[name]
    for sub in ("", "ocdbt.process_0"):
        a, b = ocdbt_py.open(ours / sub), ocdbt_py.open(theirs / sub)
        assert list(a.list()) == list(b.list())
        for k in b.list():
            if k.endswith(b".zarray") or k.endswith(b"zarr.json"):
                assert a.get(k) == b.get(k), k
            else:
                ea, eb = next(a.entries(k, stop=k + b"\0")), next(b.entries(k, stop=k + b"\0"))
                assert (ea.location is None) == (eb.location is None) or abs(ea.size - eb.size) < 64, k
        ca, cb = a.config.to_json(), b.config.to_json()
        ca.pop("uuid"), cb.pop("uuid")
        assert ca == cb
    assert [v.generation for v in ocdbt_py.open(ours).versions()] == [1]
    assert [v.generation for v in ocdbt_py.open(theirs).versions()] == [1]
