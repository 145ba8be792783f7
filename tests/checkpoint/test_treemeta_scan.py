"""The specialised ``_METADATA`` scanner (``scan_tree_metadata``) against the generic path
(bounded JSON parser + ``parse_tree_metadata``): the same leaves on every document it takes,
``None`` (never an error) on anything else, and through ``parse_tree_metadata_bytes`` the same
result or the same error type as the generic path on arbitrary and mutated input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint import treemeta
from ocdbt_py.checkpoint.jsonio import parse_json
from ocdbt_py.checkpoint.treemeta import (
    Leaf,
    TreeMetadata,
    parse_tree_metadata,
    parse_tree_metadata_bytes,
    scan_tree_metadata,
)
from ocdbt_py.errors import CorruptionError


def leaf_fields(leaf: Leaf) -> tuple[Any, ...]:
    vals = tuple(getattr(leaf, s) for s in Leaf.__slots__)
    return vals + tuple(type(v) for v in vals) + tuple(type(x) for x in leaf.path)


def tm_fields(tm: TreeMetadata) -> tuple[Any, ...]:
    return ([leaf_fields(x) for x in tm.leaves], tm.use_ocdbt, tm.use_zarr3, tm.store_array_data_equal_to_fill_value,
            tm.custom_metadata, tm.has_rich_value_tree)


def generic(data: bytes) -> TreeMetadata:
    return parse_tree_metadata(parse_json(data, what="_METADATA"))


def outcome(fn: Any, data: bytes) -> Any:
    try:
        return ("ok", tm_fields(fn(data)))
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return ("error", type(e))


def entry(keys: list[tuple[str, int]], vt: str = "np.ndarray", **vm: Any) -> tuple[str, dict[str, Any]]:
    return str(tuple(k for k, _ in keys)), {
        "key_metadata": [{"key": k, "key_type": t} for k, t in keys],
        "value_metadata": {"value_type": vt, "skip_deserialize": vt not in ("np.ndarray", "jax.Array", "scalar"), **vm}}


def dumps(entries: list[tuple[str, dict[str, Any]]], *, ascii: bool = True, **rest: Any) -> bytes:
    return json.dumps({"tree_metadata": dict(entries), **rest}, ensure_ascii=ascii).encode("utf-8")


REGULAR = dumps([
    entry([("params", 2), ("0", 1), ("w", 2)], "jax.Array", write_shape=[2, 8]),
    entry([("params", 2), ("0", 1), ("b", 2)], "jax.Array", write_shape=[]),
    entry([("step", 2)], "scalar"),
    entry([("name", 2)], "string"),
    entry([("none", 2)], "None"),
    entry([("d", 2)], "Dict"),
    entry([("l", 2)], "List"),
    entry([("odd", 2)], "some.custom.Type"),
    entry([("ü \"q\" \\ }, {", 2), ("x/y.z", 2)]),
], use_ocdbt=True, use_zarr3=True, store_array_data_equal_to_fill_value=True, custom_metadata={"a": [1, {"b": None}]})


def test_regular_document_takes_the_scanner_and_matches_the_generic_path() -> None:
    got = scan_tree_metadata(REGULAR.decode())
    assert got is not None
    assert tm_fields(got) == tm_fields(generic(REGULAR))
    assert got.leaves[0].path == ("params", 0, "w") and got.leaves[0].write_shape == (2, 8)
    assert got.leaves[1].write_shape == () and got.leaves[5].value == {} and got.leaves[6].value == []
    assert got.leaves[5].value is not got.leaves[6].value
    assert got.leaves[8].names == ("ü \"q\" \\ }, {", "x/y.z")
    assert got.use_zarr3 and got.custom_metadata == {"a": [1, {"b": None}]}


def test_many_entries_take_the_scanner() -> None:
    raw = dumps([entry([(f"layer{i}", 2), (f"w{j}", 2)]) for i in range(30) for j in range(30)],
                use_ocdbt=True, use_zarr3=False, store_array_data_equal_to_fill_value=True, custom_metadata=None)
    got = scan_tree_metadata(raw.decode())
    assert got is not None and len(got.leaves) == 900
    assert tm_fields(got) == tm_fields(generic(raw))
    # the (name, key_type) pairs are interned, as the generic path does
    assert got.leaves[0].keys[0] is got.leaves[1].keys[0]


@pytest.mark.parametrize("text", [
    REGULAR.decode().replace('"key_metadata": [', '"key_metadata":[', 1),  # other separators
    json.dumps(json.loads(REGULAR), indent=1),
    REGULAR.decode().replace('{"tree_metadata"', ' {"tree_metadata"'),
    REGULAR.decode().replace('"key_type": 2', '"key_type": 3', 1),
    REGULAR.decode().replace('"skip_deserialize": false', '"skip_deserialize": 0', 1),
    REGULAR.decode().replace('"write_shape": [2, 8]', '"write_shape": null'),
    REGULAR.decode().replace('"write_shape": [2, 8]', '"write_shape": [2, -8]'),
    REGULAR.decode().replace('"write_shape": [2, 8]', '"write_shape": [02, 8]'),
    REGULAR.decode().replace('{"value_type": "string"', '{"x": 1, "value_type": "string"'),
    REGULAR.decode().replace("}, \"use_ocdbt\"", "}, \"tree_metadata\": {}, \"use_ocdbt\""),
    REGULAR.decode().replace("}, \"use_ocdbt\"", "}, \"tree_\\u006detadata\": {}, \"use_ocdbt\""),
    REGULAR.decode().replace("}}}, ", "}},}, ", 1),
    REGULAR.decode().replace("}}}, ", "}}}, }", 1),
    REGULAR.decode()[:-1],
    REGULAR.decode()[:-1] + ", }",
    '{"tree_metadata": {},}',
    REGULAR.decode() + "x",
    REGULAR.decode().replace('"key": "0", "key_type": 1', '"key": "x", "key_type": 1'),
    REGULAR.decode().replace('"key": "0", "key_type": 1', '"key": "\\u00b2", "key_type": 1'),
    REGULAR.decode().replace('"key": "step"', '"key": "st\\qep"'),
    REGULAR.decode().replace('"key": "step"', '"key": "st\tep"'),
    '{"tree_metadata": {}, "custom_metadata": ' + "[" * 200 + "]" * 200 + "}",
    '{"tree_metadata": {"a": {"key_metadata": [], "value_metadata": {"value_type": "x", "skip_deserialize": false}}}}',
])
def test_irregular_documents_go_to_the_generic_path(text: str) -> None:
    assert scan_tree_metadata(text) is None
    data = text.encode("utf-8")
    assert outcome(parse_tree_metadata_bytes, data) == outcome(generic, data)


def test_repeated_names_go_to_the_generic_path() -> None:
    a = entry([("a", 2)])[1]
    b = entry([("b", 2)], "scalar")[1]
    text = ('{"tree_metadata": {"n": ' + json.dumps(a) + ', "m": ' + json.dumps(b) + ', "n": ' + json.dumps(b) + "}}")
    assert scan_tree_metadata(text) is None
    assert [x.param_name for x in parse_tree_metadata_bytes(text.encode()).leaves] == ["b", "b"]
    # the same name spelled with an escape
    text2 = text.replace(', "n": ', ', "\\u006e": ')
    assert scan_tree_metadata(text2) is None
    assert tm_fields(parse_tree_metadata_bytes(text2.encode())) == tm_fields(generic(text2.encode()))


def test_too_many_keys_and_malformed_input_raise_corruption() -> None:
    many = dumps([entry([("k", 2)] * 1001)])
    many_cached = dumps([entry([("k", 2)]), entry([("k", 2)] * 1001)])  # every key piece seen before
    for data in (many, many_cached, b"\xff\xfe", b"", b"[]", REGULAR[:100], b'{"tree_metadata": 1}'):
        with pytest.raises(CorruptionError):
            parse_tree_metadata_bytes(data)


# -- property tests --------------------------------------------------------------------------------

_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6) | st.sampled_from(
    ["}, {", '"key": "', '\\', "\"", "layer0", "w", "0", "12", "\u00b2", "ü", "a.b", "a/b", "\x00", "\n"])
_key = st.tuples(_names, st.just(2)) | st.tuples(st.from_regex(r"[0-9]{1,3}", fullmatch=True) | _names, st.just(1))
_vt = st.sampled_from(["np.ndarray", "jax.Array", "scalar", "string", "None", "Dict", "List", "Tuple", "NamedTuple",
                       "x\"y", "\u00e9"]) | _names
_ws = st.none() | st.lists(st.integers(0, 2**70) | st.integers(-3, -1), max_size=3)
_entry = st.builds(lambda keys, vt, ws, skip: (str(tuple(k for k, _ in keys)), {
    "key_metadata": [{"key": k, "key_type": t} for k, t in keys],
    "value_metadata": {"value_type": vt, "skip_deserialize": skip, **({} if ws is None else {"write_shape": ws})}}),
    st.lists(_key, min_size=0, max_size=4), _vt, _ws, st.booleans())
_regular_entry = st.builds(lambda keys, vt, ws, skip: (str(tuple(k for k, _ in keys)), {
    "key_metadata": [{"key": k, "key_type": t} for k, t in keys],
    "value_metadata": {"value_type": vt, "skip_deserialize": skip, **({} if ws is None else {"write_shape": ws})}}),
    st.lists(st.tuples(_names, st.just(2)) | st.tuples(st.from_regex(r"[0-9]{1,3}", fullmatch=True), st.just(1)),
             min_size=1, max_size=4),
    _vt, st.none() | st.lists(st.integers(0, 2**70), max_size=3), st.booleans())
_rest = st.dictionaries(st.sampled_from(["use_ocdbt", "use_zarr3", "store_array_data_equal_to_fill_value",
                                         "custom_metadata", "value_metadata_tree", "other"]),
                        st.none() | st.booleans() | st.integers() | st.text(max_size=3)
                        | st.lists(st.integers(), max_size=2), max_size=4)


@given(st.lists(_entry, max_size=12), _rest, st.booleans())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_scanner_equals_generic_on_generated_documents(entries: list[Any], rest: dict[str, Any], ascii: bool) -> None:
    data = dumps(entries, ascii=ascii, **rest)
    fast = scan_tree_metadata(data.decode("utf-8"))
    slow = outcome(generic, data)
    if fast is not None:
        assert ("ok", tm_fields(fast)) == slow
    assert outcome(parse_tree_metadata_bytes, data) == slow
    names = [n for n, _ in entries]
    regular = (len(set(names)) == len(names) and all(
        e["key_metadata"] and all(k["key"].isdecimal() or k["key_type"] == 2 for k in e["key_metadata"])
        and all(x >= 0 and len(str(x)) <= 65 for x in e["value_metadata"].get("write_shape", []))
        for _, e in entries))
    if regular:  # what Orbax and ocdbt-py write is taken by the scanner
        assert fast is not None


def _u_escaped(name: str) -> str:
    """A JSON string literal of ``name`` with every UTF-16 unit as a ``\\u`` escape."""
    units = name.encode("utf-16-be")
    return '"' + "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2)) + '"'


@given(st.lists(st.tuples(st.sampled_from(["n", "m", "ü"]) | st.text(max_size=2), _regular_entry, st.booleans()),
                max_size=6))
@settings(max_examples=300, deadline=None)
def test_scanner_equals_generic_with_repeated_names(items: list[tuple[str, Any, bool]]) -> None:
    """Entry names repeated (literally or spelled with escapes): the generic parser keeps the
    last value of a name in its first place; the scanner declines."""
    body = ", ".join((_u_escaped(n) if esc else json.dumps(n)) + ": " + json.dumps(e[1]) for n, e, esc in items)
    data = ('{"tree_metadata": {' + body + '}, "use_ocdbt": true}').encode("utf-8")
    slow = outcome(generic, data)
    fast = scan_tree_metadata(data.decode("utf-8"))
    if fast is not None:
        assert ("ok", tm_fields(fast)) == slow
    assert outcome(parse_tree_metadata_bytes, data) == slow


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    entries = draw(st.lists(_regular_entry | _entry, min_size=1, max_size=6))
    data = bytearray(dumps(entries, ascii=draw(st.booleans()), use_ocdbt=True, custom_metadata=None))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["replace", "insert", "delete", "dup"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "replace" and data:
            data[i] = draw(st.sampled_from(b'{}[],:" \\01-2ntfu\x00\xff'))
        elif op == "insert":
            data[i:i] = draw(st.sampled_from([b",", b"}", b"{", b'"', b"\\", b" ", b"1", b", ", b"}, {", b"\\u0041"]))
        elif op == "delete" and data:
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "dup" and data:
            j = draw(st.integers(i, min(len(data), i + 80)))
            data[j:j] = data[i:j]
    if draw(st.booleans()):  # repeat the first entry (its name and value) after itself
        text = bytes(data)
        head = b'{"tree_metadata": {'
        end = text.find(b"}}", len(head))
        if text.startswith(head) and end > 0:
            data[end + 2:end + 2] = b", " + text[len(head):end + 2]
    return bytes(data)


@given(_mutated())
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_scanner_equals_generic_on_mutated_documents(data: bytes) -> None:
    slow = outcome(generic, data)
    assert outcome(parse_tree_metadata_bytes, data) == slow
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    fast = scan_tree_metadata(text)  # never raises
    if fast is not None:
        assert ("ok", tm_fields(fast)) == slow


# -- whole checkpoints: metadata() and restore() the same either way -------------------------------

def _md_fields(tree: Any) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []

    def walk(x: Any) -> None:
        if isinstance(x, checkpoint.LeafMetadata):
            out.append(tuple((f, repr(getattr(x, f)), type(getattr(x, f))) for f in x.__dataclass_fields__))
        elif isinstance(x, dict):
            for k, v in x.items():
                out.append(("key", k))
                walk(v)
        elif isinstance(x, (list, tuple)):
            out.append(("seq", type(x), len(x)))
            for v in x:
                walk(v)
        else:
            out.append(("value", repr(x)))
    walk(tree)
    return out


def _generic_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(treemeta, "scan_tree_metadata", lambda text: None)


ODD = {"ü \"q\"": np.ones(2, np.float32), "a}, {b": {"c\\d": np.arange(3)}, "x.y/z": [np.zeros((2, 2)), 1.5, 7]}


@pytest.fixture(scope="module")
def orbax_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ocp = pytest.importorskip("orbax.checkpoint")
    tree: dict[str, Any] = {f"layer{i}": {f"w{j}": np.full(4, i * 10 + j, np.float32) for j in range(10)}
                            for i in range(30)}
    tree.update(ODD, empty={}, nothing=None, lst=[], name="hello", step=np.int64(3))
    path = tmp_path_factory.mktemp("orbax_scan") / "ck"
    with ocp.PyTreeCheckpointer() as c:
        c.save(path, tree)
    return path


def test_orbax_written_checkpoint_same_metadata_and_restore(orbax_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (orbax_ckpt / "_METADATA").read_text("utf-8")
    assert scan_tree_metadata(text) is not None  # Orbax's shape is the regular one
    fast_md, fast_tree = _md_fields(checkpoint.metadata(orbax_ckpt)), checkpoint.restore(orbax_ckpt)
    _generic_only(monkeypatch)
    assert _md_fields(checkpoint.metadata(orbax_ckpt)) == fast_md
    slow_tree = checkpoint.restore(orbax_ckpt)
    assert _md_fields(slow_tree) == _md_fields(fast_tree)
    np.testing.assert_array_equal(fast_tree["a}, {b"]["c\\d"], np.arange(3))


def test_our_checkpoint_same_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = {f"layer{i}": {f"w{j}": np.full(4, j, np.float32) for j in range(50)} for i in range(40)}
    tree.update(ODD, nothing=None, name="s", t=(np.ones(1), {}))
    checkpoint.save(str(tmp_path / "ck"), tree)
    assert scan_tree_metadata((tmp_path / "ck" / "_METADATA").read_text("utf-8")) is not None
    fast = _md_fields(checkpoint.metadata(tmp_path / "ck"))
    _generic_only(monkeypatch)
    assert _md_fields(checkpoint.metadata(tmp_path / "ck")) == fast


@pytest.mark.parametrize("text", [
    # a long key list that fails at its very end (trailing comma): no backtracking blow-up
    '{"tree_metadata": {"' + "a" * 2_000_000 + '": {"key_metadata": ['
    + '{"key": "a", "key_type": 2}, ' * 200_000 + "]",
    # long strings of escapes, unterminated
    '{"tree_metadata": {"x": {"key_metadata": [{"key": "' + "\\\\" * 1_000_000 + "\\",
    # many regular entries, then one whose write_shape has a 66-digit integer
    REGULAR.decode().replace('{"tree_metadata": {', '{"tree_metadata": {' + "".join(
        f'"e{i}": ' + json.dumps(entry([(f"e{i}", 2)])[1]) + ", " for i in range(20_000)), 1).replace(
        '"write_shape": [2, 8]', '"write_shape": [2, ' + "9" * 66 + "]"),
])
def test_hostile_documents_are_linear_and_match_the_generic_path(text: str) -> None:
    import time

    data = text.encode("utf-8")
    t = time.process_time()
    got = outcome(parse_tree_metadata_bytes, data)
    assert time.process_time() - t < 10
    assert got == outcome(generic, data)
    assert got[0] == "error"
