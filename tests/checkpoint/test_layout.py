"""Recognising items, steps and manager roots; step names, tmp dirs and commit markers."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.layout import (
    Kind,
    UncommittedStepWarning,
    classify,
    list_items,
    list_steps,
    parse_step_name,
    select_step,
)
from ocdbt_py.errors import NotFoundError
from ocdbt_py.kvstore import MemoryStore

META = json.dumps({
    "tree_metadata": {
        "('x',)": {"key_metadata": [{"key": "x", "key_type": 2}],
                   "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}},
        "('s',)": {"key_metadata": [{"key": "s", "key_type": 2}],
                   "value_metadata": {"value_type": "string", "skip_deserialize": False}},
    },
    "use_ocdbt": False, "use_zarr3": False, "store_array_data_equal_to_fill_value": True,
}).encode()
ZARRAY = (b'{"chunks":[3],"compressor":null,"dimension_separator":".","dtype":"<i4","fill_value":null,'
          b'"filters":null,"order":"C","shape":[3],"zarr_format":2}')


def pytree_item(store: MemoryStore, prefix: str, value: int = 0, marker: bool = True) -> None:
    store.set(prefix + "_METADATA", META)
    store.set(prefix + "x/.zarray", ZARRAY)
    store.set(prefix + "x/0", np.arange(3, dtype="<i4").tobytes() if value == 0 else
              np.full(3, value, dtype="<i4").tobytes())
    store.set(prefix + "_strings.json", json.dumps({"s": f"v{value}"}).encode())
    if marker:
        store.set(prefix + "commit_success.txt", b"ok")


@pytest.mark.parametrize(("name", "step"), [
    ("0", 0), ("12", 12), ("ckpt_000012", 12), ("my_run_7", 7), ("007", 7),
    ("12.orbax-checkpoint-tmp", None), ("ckpt_3.orbax-checkpoint-tmp-1700000000", None),
    ("metadata", None), ("trash", None), ("ckpt_", None), ("step-3", None),
])
def test_step_names(name: str, step: int | None) -> None:
    assert parse_step_name(name) == step


def test_classify_item_step_root_json() -> None:
    s = MemoryStore()
    pytree_item(s, "root/ckpt_000001/params/")
    s.set("root/ckpt_000001/meta/metadata", b'{"a": 1}')
    s.set("root/ckpt_000001/metrics/metrics", b'{"loss": 0.5}')
    s.set("root/ckpt_000001/_CHECKPOINT_METADATA", b'{"item_handlers": {"params": "x"}}')
    s.set("root/ckpt_000001/commit_success.txt", b"")
    s.set("root/metadata/_ROOT_METADATA", b"{}")
    assert classify(s, "root/") == Kind.ROOT
    assert classify(s, "root/ckpt_000001/") == Kind.STEP
    assert classify(s, "root/ckpt_000001/params/") == Kind.PYTREE
    assert classify(s, "root/ckpt_000001/meta/") == Kind.JSON
    assert classify(s, "root/ckpt_000001/metrics/") == Kind.JSON
    s.set("junk/a.txt", b"")
    s.set("junk/b.txt", b"")
    with pytest.raises(NotFoundError, match="not an Orbax checkpoint"):
        classify(s, "junk/")
    assert list_items(s, "root/ckpt_000001/") == {"meta": Kind.JSON, "metrics": Kind.JSON, "params": Kind.PYTREE}


def test_restore_from_memory_store_step_root_and_item() -> None:
    s = MemoryStore()
    for step in (1, 2, 10):
        pytree_item(s, f"{step}/default/", value=step)
        s.set(f"{step}/commit_success.txt", b"")
    got = checkpoint.restore(s)  # latest = 10 (numeric order, not lexical)
    assert got["s"] == "v10" and got["x"].tolist() == [10, 10, 10]
    assert checkpoint.restore(s, step=2)["s"] == "v2"
    with pytest.raises(NotFoundError, match="no finalized step 5"):
        checkpoint.restore(s, step=5)


def test_tmp_dirs_and_uncommitted_steps() -> None:
    s = MemoryStore()
    for step in (1, 2):
        pytree_item(s, f"{step}/default/", value=step)
        s.set(f"{step}/commit_success.txt", b"")
    pytree_item(s, "3.orbax-checkpoint-tmp/default/", value=3)
    pytree_item(s, "4/default/", value=4)  # no step-level marker: unfinished
    with pytest.warns(UncommittedStepWarning, match="step 4"):
        steps = list_steps(s)
    assert [e.step for e in steps] == [1, 2]
    with pytest.warns(UncommittedStepWarning):
        assert select_step(s, None).step == 2


def test_no_markers_anywhere_means_legacy_atomic_rename() -> None:
    s = MemoryStore()
    for step in (5, 6):
        pytree_item(s, f"{step}/default/", value=step, marker=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        steps = list_steps(s)
    assert [(e.step, e.committed) for e in steps] == [(5, False), (6, False)]


def test_duplicate_step_numbers_warn() -> None:
    s = MemoryStore()
    pytree_item(s, "ckpt_1/default/", value=1, marker=False)
    pytree_item(s, "ckpt_001/default/", value=1, marker=False)
    with pytest.warns(UserWarning, match="appears twice"):
        assert len(list_steps(s)) == 1


def test_v1_state_and_default_are_unwrapped_other_single_items_not() -> None:
    s = MemoryStore()
    pytree_item(s, "v1/state/")
    s.set("v1/orbax.checkpoint", b"")
    s.set("v1/_CHECKPOINT_METADATA", b'{"item_handlers": {"state": "PyTreeHandler"}}')
    assert checkpoint.restore(s.__class__(dict(_sub(s, "v1/"))))["s"] == "v0"
    pytree_item(s, "other/params/")
    s.set("other/_CHECKPOINT_METADATA", b'{"item_handlers": {"params": "x"}}')
    assert set(checkpoint.restore(_mem(s, "other/"))) == {"params"}


def _sub(s: MemoryStore, prefix: str) -> dict[str, bytes]:
    return {k[len(prefix):]: s.get(k) for k in s.list(prefix)}  # type: ignore[misc]


def _mem(s: MemoryStore, prefix: str) -> MemoryStore:
    return MemoryStore(_sub(s, prefix))


def test_not_a_checkpoint() -> None:
    s = MemoryStore({"random/file.txt": b"x"})
    with pytest.raises(NotFoundError):
        checkpoint.restore(s)
    with pytest.raises(NotFoundError):
        checkpoint.metadata(MemoryStore())
