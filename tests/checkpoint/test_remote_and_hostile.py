"""Checkpoints on fsspec filesystems, and hostile checkpoint contents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.errors import CorruptionError, OcdbtError
from tests.checkpoint.conftest import Corpus, compare


def _upload(src: Path, url: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    for p in src.rglob("*"):
        if p.is_file():
            fs.pipe(f"{root}/{p.relative_to(src).as_posix()}", p.read_bytes())


@pytest.mark.parametrize("case", ["manager", "pytree_zarr3_ocdbt", "perparam_zarr2", "legacy_msgpack_crafted"])
def test_fsspec_memory_filesystem(orbax_corpus: Corpus, case: str) -> None:
    pytest.importorskip("fsspec")
    url = f"memory://ckpt-{case}"
    _upload(orbax_corpus.path(case), url)
    got = checkpoint.restore(url)
    assert compare(orbax_corpus.expected(case), got) == []
    md = checkpoint.metadata(url)
    assert isinstance(md, dict)


def test_storage_options_reach_fsspec(orbax_corpus: Corpus, tmp_path: Path) -> None:
    """With storage_options, a local path goes through fsspec's file system (not LocalStore)."""
    pytest.importorskip("fsspec")
    dst = tmp_path / "c"
    shutil.copytree(orbax_corpus.path("chunked_zarr3"), dst)
    got = checkpoint.restore(f"file://{dst}", storage_options={"auto_mkdir": False})
    assert compare(orbax_corpus.expected("chunked_zarr3"), got) == []


def _meta_with(names: list[str]) -> str:
    return json.dumps({"tree_metadata": {
        str((n,)): {"key_metadata": [{"key": n, "key_type": 2}],
                    "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}
        for n in names}, "use_ocdbt": False})


@pytest.mark.parametrize("name", ["../../outside", "/etc", "a/../../b", "C:x", "s3://bucket/x", "a\\b", "nul\x00"])
def test_param_names_cannot_escape_the_item(tmp_path: Path, name: str) -> None:
    item = tmp_path / "item"
    item.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / ".zarray").write_text('{"zarr_format": 2}')
    (item / "_METADATA").write_text(_meta_with([name]))
    with pytest.raises(OcdbtError):
        checkpoint.restore(item)
    with pytest.raises(OcdbtError):
        checkpoint.metadata(item)


def test_strings_json_pointer_and_hostile_values(tmp_path: Path) -> None:
    item = tmp_path / "item"
    item.mkdir()
    meta = {"tree_metadata": {
        "a": {"key_metadata": [{"key": "x/y", "key_type": 2}], "value_metadata": {"value_type": "string"}},
        "b": {"key_metadata": [{"key": "t~1u", "key_type": 2}], "value_metadata": {"value_type": "string"}},
    }}
    (item / "_METADATA").write_text(json.dumps(meta))
    (item / "_strings.json").write_text(json.dumps({"x": {"y": "nested"}, "t/u": "escaped"}))
    assert checkpoint.restore(item) == {"x/y": "nested", "t~1u": "escaped"}
    (item / "_strings.json").write_text(json.dumps({"x": {"y": 5}}))
    with pytest.raises(CorruptionError, match="not a string"):
        checkpoint.restore(item)
    (item / "_strings.json").write_text("{not json")
    with pytest.raises(CorruptionError, match="not valid JSON") as e:
        checkpoint.restore(item)
    assert e.value.path is not None and e.value.path.endswith("item/_strings.json")  # the reader names the file


def test_damaged_metadata_files_are_named(tmp_path: Path) -> None:
    """A damaged ``_METADATA`` or ``_CHECKPOINT_METADATA`` is an error naming the file read."""
    step = tmp_path / "step"
    checkpoint.save(step / "state", {"a": np.arange(3)})
    (step / "_CHECKPOINT_METADATA").write_text("{")
    with pytest.raises(CorruptionError, match="not valid JSON") as e:
        checkpoint.restore(step)
    assert e.value.path is not None and e.value.path.endswith("step/_CHECKPOINT_METADATA")
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    (step / "state" / "_METADATA").write_text('{"tree_metadata": [1]}')
    with pytest.raises(CorruptionError, match="_METADATA") as e:
        checkpoint.restore(step)
    assert e.value.path is not None and e.value.path.endswith("step/state/_METADATA")


def test_corrupt_zarr_metadata_and_chunks(orbax_corpus: Corpus, tmp_path: Path) -> None:
    dst = tmp_path / "c"
    shutil.copytree(orbax_corpus.path("perparam_zarr2"), dst)
    (dst / "params.layer0.kernel" / "0.0").write_bytes(b"\x28\xb5\x2f\xfd garbage")
    with pytest.raises(OcdbtError):
        checkpoint.restore(dst)
    lazy = checkpoint.restore(dst, lazy=True)["params"]["layer0"]["kernel"]
    np.testing.assert_array_equal(lazy[6:], checkpoint.restore(orbax_corpus.path("perparam_zarr2"))
                                  ["params"]["layer0"]["kernel"][6:])
    (dst / "params.layer0.kernel" / ".zarray").write_text('{"zarr_format": 2, "shape": [-1]}')
    with pytest.raises(CorruptionError):
        checkpoint.metadata(dst)
    with pytest.raises(CorruptionError):
        checkpoint.restore(dst, lazy=True)


def test_msgpack_checkpoint_file_is_bounded(tmp_path: Path) -> None:
    item = tmp_path / "item"
    item.mkdir()
    (item / "checkpoint").write_bytes(b"\xdf\xff\xff\xff\xff")  # a map claiming 4 billion entries
    with pytest.raises(CorruptionError, match="truncated"):
        checkpoint.restore(item)
