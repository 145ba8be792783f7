"""Native save options the Orbax layer needs: per-leaf chunk byte sizes and per-item handlers
(``save(leaf_chunk_byte_sizes=..., handler={...})``) and per-save manager options."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ocdbt_py.checkpoint import JsonItem, metadata, restore, save
from ocdbt_py.checkpoint.manager import CheckpointManager


def test_leaf_chunk_byte_sizes_apply_to_named_leaves_only(tmp_path) -> None:
    tree = {"a": {"k": np.ones((32, 32), "float32")}, "b": np.ones((32, 32), "float32")}
    save(tmp_path / "c", tree, leaf_chunk_byte_sizes={"a.k": 512}, chunk_byte_size=2048)
    m = metadata(tmp_path / "c")
    assert int(np.prod(m["a"]["k"].chunks)) * 4 <= 512
    assert 512 < int(np.prod(m["b"].chunks)) * 4 <= 2048
    np.testing.assert_array_equal(restore(tmp_path / "c")["a"]["k"], tree["a"]["k"])


def test_composite_keys_and_per_item_handlers(tmp_path) -> None:
    items = {"p": {"w": np.ones((16, 16), "float32")}, "o": {"w": np.ones((16, 16), "float32")},
             "cfg": JsonItem({"x": 1})}
    save(tmp_path / "s", items, composite=True, leaf_chunk_byte_sizes={"p/w": 256},
         handler={"p": "pytree", "o": "standard"})
    m = metadata(tmp_path / "s")
    assert int(np.prod(m["p"]["w"].chunks)) * 4 <= 256
    assert m["o"]["w"].chunks == (16, 16)
    handlers = json.loads((tmp_path / "s" / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    assert handlers["p"].endswith("PyTreeCheckpointHandler") and handlers["o"].endswith("StandardCheckpointHandler")
    assert handlers["cfg"].endswith("JsonCheckpointHandler")


def test_bad_values_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError):
        save(tmp_path / "x", {"a": np.ones(2)}, leaf_chunk_byte_sizes={"a": 0})
    with pytest.raises(ValueError):
        save(tmp_path / "y", {"a": {"b": np.ones(2)}}, composite=True, handler={"a": "bogus"})


def test_manager_save_options_per_save(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path / "m", async_save=False, save_options={"use_zarr3": False})
    tree = {"default": {"w": np.ones((16, 16), "float32")}}
    mgr.save(0, tree, save_options={"leaf_chunk_byte_sizes": {"default/w": 256}, "use_zarr3": True})
    mgr.save(1, tree)
    m0, m1 = metadata(tmp_path / "m" / "0" / "default"), metadata(tmp_path / "m" / "1" / "default")
    assert m0["w"].zarr_format == 3 and int(np.prod(m0["w"].chunks)) * 4 <= 256
    assert m1["w"].zarr_format == 2 and m1["w"].chunks == (16, 16)
    with pytest.raises(TypeError):
        mgr.save(2, tree, save_options={"bogus": 1})
    mgr.close()
