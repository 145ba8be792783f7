"""The plain-container tree walk, param names and collisions; chunk-shape choice."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import pytest

from ocdbt_py.checkpoint.saving.chunking import choose_chunk_shape, chunk_byte_limit, replica_parallel_axis
from ocdbt_py.checkpoint.saving.params import (
    KEY_DICT,
    KEY_SEQUENCE,
    ParamNameCollisionError,
    UnsupportedLeafError,
    flatten,
)


class State(NamedTuple):
    step: int
    params: dict


class Nothing(NamedTuple):
    pass


def _names(tree: object) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(lf.param_name, lf.value_type, lf.key_types) for lf in flatten(tree, use_jax=False)]


def test_plain_walk_order_names_and_types() -> None:
    tree = {
        "b": [np.ones(2), (3, "s")],
        "a": State(1, {"z": None, "y": {}}),
        "c": collections.OrderedDict([("q", 1.5), ("p", np.float32(2))]),
        "e": Nothing(),
        "t": (),
        "l": [],
    }
    assert _names(tree) == [
        ("a.step", "scalar", (KEY_DICT, KEY_DICT)),
        ("a.params.y", "Dict", (KEY_DICT, KEY_DICT, KEY_DICT)),
        ("a.params.z", "None", (KEY_DICT, KEY_DICT, KEY_DICT)),
        ("b.0", "np.ndarray", (KEY_DICT, KEY_SEQUENCE)),
        ("b.1.0", "scalar", (KEY_DICT, KEY_SEQUENCE, KEY_SEQUENCE)),
        ("b.1.1", "string", (KEY_DICT, KEY_SEQUENCE, KEY_SEQUENCE)),
        ("c.q", "scalar", (KEY_DICT, KEY_DICT)),  # OrderedDict keeps insertion order, as JAX does
        ("c.p", "scalar", (KEY_DICT, KEY_DICT)),
        ("e", "None", (KEY_DICT,)),  # an empty NamedTuple is recorded as None
        ("l", "List", (KEY_DICT,)),
        ("t", "Tuple", (KEY_DICT,)),
    ]
    leaves = flatten({"x": {3: 1, 10: 2}}, use_jax=False)
    assert [lf.tree_key for lf in leaves] == ["('x', '3')", "('x', '10')"]  # numeric sort, str keys


def test_scalar_kinds() -> None:
    vals = [True, 3, 2.5, 1 + 2j, np.int8(1), np.bool_(True), np.uint64(5), ml_dtypes.bfloat16(1), np.float16(2)]
    assert {lf.value_type for lf in flatten({str(i): v for i, v in enumerate(vals)}, use_jax=False)} == {"scalar"}
    with pytest.raises(UnsupportedLeafError):
        flatten({"a": np.str_("x").tobytes()}, use_jax=False)


@pytest.mark.parametrize(
    "tree",
    [
        {"a.b": 1, "a": {"b": 2}},
        {"a": [1, 2], "a.1": 3},
        {"x": State(1, {}), "x.step": 2},
        {"p": 1, "p/q": 2},
        {"s": "x", "s/t": "y"},
        {"s/": "x"},
    ],
)
def test_collisions(tree: dict) -> None:
    with pytest.raises(ParamNameCollisionError):
        flatten(tree, use_jax=False)


def test_no_collision_for_distinct_storage() -> None:
    # empty leaves store nothing; strings and arrays live in different places
    flatten({"a.b": None, "a": {"b": 1}}, use_jax=False)
    flatten({"s": "x", "s-t": np.ones(1), "s/u": np.ones(1)}, use_jax=False)


@pytest.mark.parametrize(
    ("glob", "write", "itemsize", "limit", "expected"),
    [
        ((8, 16), (2, 8), 4, None, (2, 8)),
        ((256, 512), (64, 256), 4, 16384, (64, 64)),  # observed with Orbax (spec/orbax.md)
        ((128, 64), (16, 64), 4, 4096, (16, 64)),  # replicated (128, 64) on 8 devices, replica-parallel
        ((256, 512), (256, 512), 4, 4096, (32, 32)),
        ((), (), 8, 8, ()),
        ((0, 3), (0, 3), 4, None, (1, 3)),
    ],
)
def test_choose_chunk_shape(glob: tuple, write: tuple, itemsize: int, limit: int | None, expected: tuple) -> None:
    got = choose_chunk_shape(glob, write, itemsize, limit)
    assert got == expected
    assert all(w % c == 0 for w, c in zip([max(1, w) for w in write], got))
    if limit is not None:
        assert math.prod(got) * itemsize <= max(limit, itemsize)


def test_chunk_byte_limit() -> None:
    assert chunk_byte_limit((10,), 4, None, None) is None
    assert chunk_byte_limit((1 << 30,), 4, None, None) == 2 << 30  # bigger than the 2 GiB target file
    assert chunk_byte_limit((10,), 4, 1000, 500) == 500
    assert chunk_byte_limit((10,), 4, 1000, 0) == 1000  # 0: no file-size cap
    assert chunk_byte_limit((1000,), 4, None, 100) == 100
    with pytest.raises(ValueError):
        choose_chunk_shape((4,), (4,), 8, 4)


def test_replica_parallel_axis() -> None:
    assert replica_parallel_axis((16,), 8) == 0
    assert replica_parallel_axis((3, 8), 4) == 1
    assert replica_parallel_axis((3, 5), 2) is None
    assert replica_parallel_axis((8,), 1) is None
    assert replica_parallel_axis((0,), 2) is None


def test_repeated_saves_follow_changed_options(tmp_path: Path) -> None:
    """Array specs are reused between saves of the same tree: only while nothing they depend
    on (chunk size, Zarr format, compression, target file size, layout) changed."""
    import ocdbt_py
    from ocdbt_py.checkpoint import restore, save

    tree = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64)}

    def chunks_for(cbs: int | None, target: int | None) -> list[int]:
        return list(choose_chunk_shape((64, 64), (64, 64), 4, chunk_byte_limit((64, 64), 4, cbs, target)))

    runs: list[tuple[dict[str, Any], list[int], str | None]] = [
        ({}, chunks_for(None, None), "zstd"), ({"chunk_byte_size": 4096}, chunks_for(4096, None), "zstd"),
        ({"use_compression": False}, chunks_for(None, None), None),
        ({"ocdbt_target_data_file_size": 2048}, chunks_for(None, 2048), "zstd"),
        ({}, chunks_for(None, None), "zstd")]
    assert runs[0][1] == [64, 64] and runs[1][1] != runs[0][1] != runs[3][1]
    for i, (kw, chunks, compressor) in enumerate(runs):
        save(tmp_path / str(i), tree, **kw)
        with ocdbt_py.open(tmp_path / str(i)) as db:
            z = json.loads(db[b"w/.zarray"])
        assert z["chunks"] == chunks, (kw, z)
        assert (z["compressor"] or {}).get("id") == compressor, (kw, z)
        np.testing.assert_array_equal(restore(tmp_path / str(i))["w"], tree["w"])
    save(tmp_path / "v3", tree, use_zarr3=True)
    with ocdbt_py.open(tmp_path / "v3") as db:
        assert b"w/zarr.json" in db
