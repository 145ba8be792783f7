"""``_METADATA`` is written entry by entry; its bytes must be exactly ``json.dumps`` of the
document built as dicts (the form Orbax's own writer produces and readers parse)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint.saving.layout_writer import tree_metadata
from ocdbt_py.checkpoint.saving.params import JAX_ARRAY, NP_ARRAY, SCALAR, STRING, Leaf, flatten


def _reference(leaves: Sequence[Leaf], write_shapes: Mapping[str, Sequence[int]], use_zarr3: bool,
               custom_metadata: Any, use_ocdbt: bool) -> bytes:
    entries: dict[str, Any] = {}
    for leaf in leaves:
        value: dict[str, Any] = {"value_type": leaf.value_type, "skip_deserialize": not leaf.has_data}
        if leaf.value_type == JAX_ARRAY and leaf.param_name in write_shapes:
            value["write_shape"] = list(write_shapes[leaf.param_name])
        entries[leaf.tree_key] = {
            "key_metadata": [{"key": n, "key_type": t} for n, t in zip(leaf.names, leaf.key_types)],
            "value_metadata": value,
        }
    return json.dumps({"tree_metadata": entries, "use_ocdbt": use_ocdbt, "use_zarr3": use_zarr3,
                       "store_array_data_equal_to_fill_value": True,
                       "custom_metadata": custom_metadata}).encode("utf-8")


NAMES = ["a", "b.c", "ü", "日本", 'q"uote', "back\\slash", "tab\tnl\n", "\x00ctl", "😀", "", "0", "'", "('x',)"]
TYPES = [NP_ARRAY, SCALAR, STRING, JAX_ARRAY, "None", "Dict", "List", "Tuple"]
CUSTOM: list[Any] = [
    None, {}, {"a": 1, "b": [1.5, None, True]}, {"ü": "日本", "nan": float("nan"), "inf": float("inf")},
    [1, 2], "text", 3, {"nested": {"x": {"y": []}}}, {1: "int key"},
]


@pytest.mark.parametrize("seed", range(40))
def test_same_bytes_as_json_dumps(seed: int) -> None:
    rng = random.Random(seed)
    leaves = []
    write_shapes: dict[str, tuple[int, ...]] = {}
    for _ in range(rng.randint(0, 30)):
        depth = rng.randint(1, 4)
        names = tuple(rng.choice(NAMES) for _ in range(depth))
        types = tuple(rng.choice((1, 2)) for _ in range(depth))
        leaf = Leaf(names, types, None, rng.choice(TYPES))
        leaves.append(leaf)  # repeated paths happen: the later entry wins, in the first place
        if leaf.value_type == JAX_ARRAY and rng.random() < 0.7:
            write_shapes[leaf.param_name] = tuple(rng.randint(0, 1 << 40) for _ in range(rng.randint(0, 3)))
    for custom in CUSTOM:
        for use_zarr3 in (False, True):
            for use_ocdbt in (True, False):
                got = tree_metadata(leaves, write_shapes, use_zarr3=use_zarr3, custom_metadata=custom,
                                    use_ocdbt=use_ocdbt)
                assert got == _reference(leaves, write_shapes, use_zarr3, custom, use_ocdbt)


def test_flattened_tree_with_empty_nodes() -> None:
    tree = {"layers": [{"w": np.ones(3), "b": None}, {}], "opt": (1.5, "adam", ()), "step": np.int64(3)}
    leaves = flatten(tree)
    assert tree_metadata(leaves, {}, use_zarr3=False) == _reference(leaves, {}, False, None, True)
    json.loads(tree_metadata(leaves, {}, use_zarr3=False))
