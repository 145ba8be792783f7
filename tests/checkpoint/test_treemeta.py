"""``_METADATA`` parsing and tree reconstruction, including malformed input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocdbt_py.checkpoint.pytree import build_tree, flatten_with_names
from ocdbt_py.checkpoint.treemeta import ARRAY, EMPTY, SCALAR, STRING, Leaf, parse_tree_metadata
from ocdbt_py.errors import CorruptionError


def entry(*keys: tuple[str, int], vt: str = "jax.Array", **vm: Any) -> tuple[str, dict]:
    name = str(tuple(k for k, _ in keys))
    return name, {"key_metadata": [{"key": k, "key_type": t} for k, t in keys],
                  "value_metadata": {"value_type": vt, "skip_deserialize": False, **vm}}


def doc(*entries: tuple[str, dict], **extra: Any) -> dict:
    return {"tree_metadata": dict(entries), **extra}


def test_kinds_flags_and_names() -> None:
    tm = parse_tree_metadata(doc(
        entry(("params", 2), ("0", 1), ("w", 2), write_shape=[2, 8]),
        entry(("step", 2), vt="scalar"),
        entry(("name", 2), vt="string"),
        entry(("none", 2), vt="None", skip_deserialize=True),
        entry(("d", 2), vt="Dict"),
        entry(("odd", 2), vt="some.custom.Type"),
        use_zarr3=True, use_ocdbt=False, store_array_data_equal_to_fill_value=True, custom_metadata={"a": 1},
    ))
    kinds = {leaf.param_name: leaf.kind for leaf in tm.leaves}
    assert kinds == {"params.0.w": ARRAY, "step": SCALAR, "name": STRING, "none": EMPTY, "d": EMPTY, "odd": ARRAY}
    w = tm.leaves[0]
    assert w.path == ("params", 0, "w") and w.names == ("params", "0", "w") and w.write_shape == (2, 8)
    assert tm.use_zarr3 and tm.use_ocdbt is False and tm.store_array_data_equal_to_fill_value
    assert tm.custom_metadata == {"a": 1}
    assert tm.leaves[4].value == {} and tm.leaves[3].value is None


def test_defaults_of_old_metadata() -> None:
    tm = parse_tree_metadata(doc(entry(("x", 2))))
    assert tm.use_ocdbt is None and not tm.use_zarr3 and not tm.store_array_data_equal_to_fill_value


def test_placeholder_prefix_entries_are_dropped() -> None:
    tm = parse_tree_metadata(doc(entry(("a", 2), vt="Dict"), entry(("a", 2), ("b", 2)), entry(("c", 2), vt="List")))
    assert [leaf.param_name for leaf in tm.leaves] == ["a.b", "c"]


@pytest.mark.parametrize("bad", [
    [],
    {"no_tree": 1},
    {"tree_metadata": []},
    {"tree_metadata": {"x": 5}},
    {"tree_metadata": {"x": {"key_metadata": [{"key": "a", "key_type": 3}], "value_metadata": {"value_type": "x"}}}},
    {"tree_metadata": {"x": {"key_metadata": [{"key": "a", "key_type": 1}], "value_metadata": {"value_type": "x"}}}},
    {"tree_metadata": {"x": {"key_metadata": [{"key": 5, "key_type": 2}], "value_metadata": {"value_type": "x"}}}},
    {"tree_metadata": {"x": {"key_metadata": [{"key": "a", "key_type": True}], "value_metadata": {"value_type": "x"}}}},
    {"tree_metadata": {"x": {"key_metadata": [{"key": "a"}], "value_metadata": {}}}},
    {"tree_metadata": {"x": {"key_metadata": "a", "value_metadata": {"value_type": "x"}}}},
    {"tree_metadata": {"x": {"key_metadata": [{"key": "a"}] * 2000, "value_metadata": {"value_type": "x"}}}},
])
def test_malformed_metadata(bad: Any) -> None:
    with pytest.raises(CorruptionError):
        parse_tree_metadata(bad)


@given(st.recursive(st.none() | st.integers() | st.text(max_size=3),
                    lambda c: st.dictionaries(st.text(min_size=1, max_size=4), c, max_size=4)
                    | st.lists(c, max_size=4), max_leaves=30))
@settings(max_examples=200, deadline=None)
def test_metadata_json_fuzz_never_crashes(d: Any) -> None:
    try:
        parse_tree_metadata({"tree_metadata": {"x": {"key_metadata": d, "value_metadata": {"value_type": "x"}}}})
        parse_tree_metadata({"tree_metadata": d})
    except CorruptionError:
        pass


def leaves_of(tree: Any) -> list[tuple[tuple[tuple[str, int], ...], Any]]:
    flat, _ = flatten_with_names(tree)
    out = []

    def keys_for(names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        node, keys = tree, []
        for n in names:
            if isinstance(node, dict):
                keys.append((n, 2))
                node = node[n]
            else:
                keys.append((n, 1))
                node = node[int(n)]
        return tuple(keys)

    for names, v in flat:
        out.append((keys_for(names), v))
    return out


def test_build_tree_round_trip() -> None:
    tree = {"a": {"b": [1, 2, {"c": 3}], "d": []}, "e": None, "f": {}, "g": [[4], 5]}
    assert build_tree(leaves_of(tree)) == tree
    assert build_tree([((), 7)]) == 7
    assert build_tree([]) == {}
    assert build_tree([((("0", 1),), "x"), ((("1", 1),), "y")]) == ["x", "y"]


def test_build_tree_gaps_and_conflicts() -> None:
    assert build_tree([((("a", 2), ("2", 1)), 1), ((("a", 2), ("0", 1)), 0)]) == {"a": [0, None, 1]}
    with pytest.raises(CorruptionError, match="mixes"):
        build_tree([((("a", 2), ("0", 1)), 1), ((("a", 2), ("x", 2)), 2)])
    with pytest.raises(CorruptionError, match="both a leaf and a subtree"):
        build_tree([((("a", 2),), 1), ((("a", 2), ("x", 2)), 2)])
    with pytest.raises(CorruptionError, match="twice"):
        build_tree([((("a", 2),), 1), ((("a", 2),), 2)])
    with pytest.raises(CorruptionError, match="far beyond"):
        build_tree([((("999999", 1),), 1)])
    with pytest.raises(CorruptionError, match="bare leaf"):
        build_tree([((), 1), ((("a", 2),), 2)])
    # a leaf value that is itself a dict is not mistaken for a subtree
    with pytest.raises(CorruptionError):
        build_tree([((("a", 2),), {}), ((("a", 2), ("b", 2)), 1)])


def test_flatten_without_jax() -> None:
    from typing import NamedTuple

    class P(NamedTuple):
        x: Any
        y: Any

    tree = {"a": (1, 2), "b": P(3, [4]), "c": None, "d": {}}
    flat, rebuild = flatten_with_names(tree)
    assert [n for n, _ in flat] == [("a", "0"), ("a", "1"), ("b", "x"), ("b", "y", "0"), ("c",), ("d",)]
    again = rebuild([v for _, v in flat])
    assert again == tree and isinstance(again["b"], P) and isinstance(again["a"], tuple)


def test_leaf_names() -> None:
    leaf = Leaf.of_type((("a.b", 2), ("x/y", 2), ("3", 1)), "np.ndarray")
    assert leaf.param_name == "a.b.x/y.3" and leaf.path == ("a.b", "x/y", 3)
    assert json.loads(json.dumps(list(leaf.names))) == ["a.b", "x/y", "3"]
