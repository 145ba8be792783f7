"""``LocationTable``: one B+tree scan gives every value's place; unsafe data file paths fail."""

from __future__ import annotations

import types

import pytest

import ocdbt_py
from ocdbt_py.checkpoint.restore.locations import LocationTable, _decode_keys
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.kvstore.memory import MemoryStore
from ocdbt_py.read.btree_read import LeafColumns


def test_inline_and_out_of_line_values() -> None:
    kv = MemoryStore()
    with ocdbt_py.open(kv, mode="a", config={"max_inline_value_bytes": 4}) as db, db.transaction() as t:
        t.put(b"small", b"ab")
        t.put(b"big", b"x" * 100)
    table = LocationTable()
    table.add(ocdbt_py.open(kv), "db")
    got = {k: [loc.file, loc.offset, loc.length, loc.inline] for k, loc in table.items()}
    assert got["small"] == [None, 0, 2, b"ab"]
    path, offset, length, inline = got["big"]
    assert path is not None and path.startswith("d/") and length == 100 and inline is None
    assert kv.get(path, (offset, offset + length)) == b"x" * 100


@pytest.mark.parametrize("bad", [b"../escape", b"/abs/path", b"d/\xff", b"s3://bucket/x"])
def test_unsafe_data_file_paths_are_refused(bad: bytes) -> None:
    ref = IndirectDataReference(DataFileId(b"", bad), 0, 4)
    db = types.SimpleNamespace(entry_columns=lambda: iter([LeafColumns([b"k"], [4], [ref], 0)]))
    with pytest.raises(CorruptionError, match="unsafe data file path"):
        LocationTable().add(db, "db")


def test_location_table_first_database_wins() -> None:
    kv1, kv2 = MemoryStore(), MemoryStore()
    with ocdbt_py.open(kv1, mode="a", config={"max_inline_value_bytes": 4}) as db, db.transaction() as t:
        t.put(b"shared", b"one-long-value")
        t.put(b"only1", b"ab")
    with ocdbt_py.open(kv2, mode="a", config={"max_inline_value_bytes": 4}) as db, db.transaction() as t:
        t.put(b"shared", b"xy")
        t.put(b"only2", b"two-long-value")
    table = LocationTable()
    table.add(ocdbt_py.open(kv1), "db1", 0, lambda k: "one/" + k)
    table.add(ocdbt_py.open(kv2), "db2", 1)
    assert sorted(table) == ["only1", "only2", "shared"] and len(table) == 3
    assert "shared" in table and "nope" not in table and table.get("nope") is None
    with pytest.raises(KeyError):
        table["nope"]
    shared = table["shared"]  # from the first database, out of line
    assert shared.store == 0 and shared.file is not None and shared.file.startswith("one/d/")
    assert kv1.get(shared.file[4:], (shared.offset, shared.offset + shared.length)) == b"one-long-value"
    only1 = table["only1"]
    assert only1.file is None and only1.inline == b"ab" and only1.length == 2
    only2 = table["only2"]
    assert only2.store == 1 and only2.file is not None and only2.file.startswith("d/")
    assert kv2.get(only2.file, (only2.offset, only2.offset + only2.length)) == b"two-long-value"
    assert [loc and loc.length for loc in table.locate(["only1", "nope", "only2"])] == [2, None, 14]
    assert table.inline_values(["only1", "nope"]) == ([b"ab", None], False)
    assert table.inline_values(["only1", "only2"]) == ([b"ab", None], True)


@pytest.mark.parametrize("keys", [
    [b"a/b", "\u00e9/x".encode(), b"\xff\xfe/bad", b"", b"z"],
    [b"a\nb", b"c"],  # a newline in a key: decoded one by one
    ["\u00e9".encode()[:1], b"x", "\u00e9".encode()[1:]],  # a character cut across two keys
    [],
])
def test_keys_decode_in_bulk_as_one_by_one(keys: list[bytes]) -> None:
    assert _decode_keys(keys) == [k.decode("utf-8", "surrogateescape") for k in keys]
