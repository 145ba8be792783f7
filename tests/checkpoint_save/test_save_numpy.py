"""``save`` without JAX: round trips through our reader, the files written, options and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import ocdbt_py
from ocdbt_py.checkpoint import JsonItem, restore, save
from ocdbt_py.checkpoint.saving import CheckpointExistsError, ParamNameCollisionError, UnsupportedLeafError
from ocdbt_py.kvstore import MemoryStore
from tests.checkpoint_save import _trees
from tests.checkpoint_save.conftest import subprocess_env


@pytest.mark.parametrize("use_zarr3", [False, True])
def test_rich_tree_round_trip(tmp_path: Path, use_zarr3: bool) -> None:
    tree = _trees.rich_tree()
    h = save(tmp_path / "c", tree, use_zarr3=use_zarr3)
    assert h.done() and h.exception() is None
    assert _trees.compare(restore(tmp_path / "c"), _trees.expected_restore(tree)) == []
    meta = json.loads((tmp_path / "c" / "_METADATA").read_text())
    assert meta["use_zarr3"] is use_zarr3 and meta["use_ocdbt"] is True
    assert meta["store_array_data_equal_to_fill_value"] is True


def test_files_of_a_numpy_checkpoint(tmp_path: Path) -> None:
    save(tmp_path / "c", {"w": np.ones((4, 4), np.float32), "name": "x", "n": None})
    files = sorted(str(p.relative_to(tmp_path / "c")) for p in (tmp_path / "c").rglob("*") if p.is_file())
    top = [f for f in files if "/" not in f]
    assert top == ["_CHECKPOINT_METADATA", "_METADATA", "_strings.json", "commit_success.txt", "manifest.ocdbt"]
    assert not (tmp_path / "c" / "_sharding").exists()  # only jax.Arrays get shardings
    assert not (tmp_path / "c" / "array_metadatas").exists()
    assert (tmp_path / "c" / "_strings.json").read_text() == '{"name":"x"}'
    cm = json.loads((tmp_path / "c" / "_CHECKPOINT_METADATA").read_text())
    assert cm["item_handlers"].endswith("PyTreeCheckpointHandler")
    assert cm["commit_timestamp_nsecs"] >= cm["init_timestamp_nsecs"]
    assert not list(tmp_path.glob("*.orbax-checkpoint-tmp"))
    # the per-process database and the merged root, both with Orbax's OCDBT config
    child = ocdbt_py.open(tmp_path / "c" / "ocdbt.process_0")
    root = ocdbt_py.open(tmp_path / "c")
    for db in (child, root):
        cfg = db.config.to_json()
        assert cfg["max_inline_value_bytes"] == 1024 and cfg["max_decoded_node_bytes"] == 100_000_000
        assert cfg["compression"] == {"id": "zstd", "level": 0} and cfg["manifest_kind"] == "single"
        assert [v.generation for v in db.versions()] == [1]  # assume_config: no empty generation
    assert list(root.list()) == [b"w/.zarray", b"w/0.0"]
    assert root.get(b"w/.zarray") == (b'{"chunks":[4,4],"compressor":{"id":"zstd","level":1},"dimension_separator":'
                                      b'".","dtype":"<f4","fill_value":null,"filters":null,"order":"C","shape":[4,4],'
                                      b'"zarr_format":2}')


def test_standard_handler_for_numeric_trees(tmp_path: Path) -> None:
    save(tmp_path / "a", {"w": np.ones(3), "step": 1})
    save(tmp_path / "b", {"w": np.ones(3)}, handler="pytree")
    a = json.loads((tmp_path / "a" / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    b = json.loads((tmp_path / "b" / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    assert a.endswith("StandardCheckpointHandler") and b.endswith("PyTreeCheckpointHandler")


def test_large_values_go_to_data_files_and_options(tmp_path: Path) -> None:
    tree = _trees.chunked_tree()
    save(tmp_path / "c", tree, chunk_byte_size=4096, ocdbt_target_data_file_size=20000)
    assert _trees.compare(restore(tmp_path / "c"), _trees.expected_restore(tree)) == []
    root = ocdbt_py.open(tmp_path / "c")
    assert json.loads(root.get(b"a/.zarray"))["chunks"] == [32, 32]  # 4 KiB chunks, as Orbax chooses
    keys = [k for k in root.list(b"a/") if not k.endswith(b".zarray")]
    assert len(keys) == 128
    files = list((tmp_path / "c" / "ocdbt.process_0" / "d").iterdir())
    assert len(files) > 5  # closed at the 20 kB target size
    assert max(f.stat().st_size for f in files) < 20000 + 8192
    refs = [e.location for e in root.entries() if e.location is not None]
    assert refs and all(r.file.base_path == b"ocdbt.process_0/" for r in refs)


def test_empty_and_odd_leaves(tmp_path: Path) -> None:
    tree = {"only": {"s": "text", "n": None, "e": {}, "l": [], "t": ()}}
    save(tmp_path / "c", tree)
    assert not (tmp_path / "c" / "manifest.ocdbt").exists()  # no arrays: no database, like Orbax
    assert restore(tmp_path / "c") == {"only": {"s": "text", "n": None, "e": {}, "l": [], "t": ()}}
    save(tmp_path / "d", {"a": {}, "b": None})  # only empty leaves: Orbax saves this too
    assert restore(tmp_path / "d") == {"a": {}, "b": None}


def test_in_place_save_on_fsspec_memory_and_overwrite() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    url = "memory://save_test/ckpt/7"
    try:
        save(url, {"a": np.arange(10)})
        assert np.array_equal(restore(url)["a"], np.arange(10))
        assert fs.exists("/save_test/ckpt/7/commit_success.txt")
        with pytest.raises(CheckpointExistsError):
            save(url, {"a": np.arange(3)})
        save(url, {"b": np.arange(3)}, force=True)
        got = restore(url)
        assert list(got) == ["b"] and np.array_equal(got["b"], np.arange(3))
        assert restore("memory://save_test/ckpt", step=7)["b"].tolist() == [0, 1, 2]
    finally:
        fs.rm("/save_test", recursive=True)


def test_save_into_a_kvstore() -> None:
    kv = MemoryStore()
    save(kv, {"x": np.arange(4, dtype=np.int16), "y": 2.0})
    assert kv.exists("commit_success.txt")
    got = restore(kv)
    assert got["y"] == 2.0 and got["x"].dtype == np.int16


def test_overwrite_local(tmp_path: Path) -> None:
    p = tmp_path / "c"
    save(p, {"a": np.zeros(3)})
    with pytest.raises(CheckpointExistsError):
        save(p, {"a": np.ones(3)})
    assert np.array_equal(restore(p)["a"], np.zeros(3))
    save(p, {"b": np.ones(3)}, force=True)
    assert list(restore(p)) == ["b"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c"]


def test_composite_step(tmp_path: Path) -> None:
    step = tmp_path / "root" / "12"
    save(step, {"params": {"w": np.ones(2)}, "meta": JsonItem({"lr": 0.1}), "text": {"s": "x"}},
         composite=True, custom_metadata={"note": "hi"})
    cm = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    assert set(cm["item_handlers"]) == {"params", "meta", "text"}
    assert cm["item_handlers"]["meta"].endswith("JsonCheckpointHandler")
    assert cm["custom_metadata"] == {"note": "hi"}
    for item in ("params", "meta", "text"):
        assert (step / item / "commit_success.txt").exists()
    assert (step / "meta" / "metadata").read_text() == '{"lr": 0.1}'
    got = restore(tmp_path / "root")
    assert got["meta"] == {"lr": 0.1} and got["text"] == {"s": "x"} and got["params"]["w"].tolist() == [1, 1]


def test_pytree_custom_metadata(tmp_path: Path) -> None:
    save(tmp_path / "c", {"a": 1}, pytree_custom_metadata={"k": [1, 2]})
    assert json.loads((tmp_path / "c" / "_METADATA").read_text())["custom_metadata"] == {"k": [1, 2]}


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tree",
    [
        {"a.b": np.ones(2), "a": {"b": np.ones(2)}},
        {"a": {"b": np.ones(2)}, "a.b": np.ones(3)},
        {"x": [np.ones(1)], "x.0": 1},
        {"s": "v", "s/t": "w"},
        {"p": np.ones(2), "p/q": np.ones(2)},
    ],
)
def test_param_name_collisions_are_errors(tmp_path: Path, tree: dict[str, Any]) -> None:
    with pytest.raises(ParamNameCollisionError):
        save(tmp_path / "c", tree)
    assert not (tmp_path / "c").exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("tree", "exc"),
    [
        ({}, ValueError),
        (np.ones(3), ValueError),
        ({"z": np.zeros((0, 3))}, ValueError),
        ({"b": b"bytes"}, UnsupportedLeafError),
        ({"o": object()}, UnsupportedLeafError),
        ({"u": np.array(["x"])}, UnsupportedLeafError),
        ({"u4": np.zeros(3, ml_dtypes.uint4)}, UnsupportedLeafError),
        ({"rec": np.zeros(2, dtype=[("a", "i4")])}, UnsupportedLeafError),
        ({"big": 2**80}, UnsupportedLeafError),
        ({1: 1, "a": 2}, ValueError),
    ],
)
def test_bad_trees(tmp_path: Path, tree: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        save(tmp_path / "c", tree)
    assert not list(tmp_path.iterdir())


def test_bad_composites(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        save(tmp_path / "c", JsonItem({}))
    with pytest.raises(TypeError):
        save(tmp_path / "c", {"x": JsonItem(object())}, composite=True)
    for name in ("", "a/b", "..", "x.orbax-checkpoint-tmp", "descriptor"):
        with pytest.raises(ValueError):
            save(tmp_path / "c", {name: {"a": 1}}, composite=True)
    with pytest.raises(ValueError):
        save(tmp_path / "c", {"a": np.ones(3)}, chunk_byte_size=0)


def test_import_does_not_pull_jax() -> None:
    code = ("import sys, numpy as np; from ocdbt_py.checkpoint import save, restore; import tempfile, os; "
            "d = tempfile.mkdtemp(); save(os.path.join(d, 'c'), {'a': np.ones(2)}); "
            "print(sorted(m for m in ('jax', 'tensorstore', 'orbax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
