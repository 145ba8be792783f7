"""``scan_locations``: one B+tree scan gives every value's place; unsafe data file paths fail."""

from __future__ import annotations

import types

import pytest

import ocdbt_py
from ocdbt_py.checkpoint.restore.locations import scan_locations
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.kvstore.memory import MemoryStore
from ocdbt_py.read.btree_read import LeafColumns


def test_inline_and_out_of_line_values() -> None:
    kv = MemoryStore()
    with ocdbt_py.open(kv, mode="a", config={"max_inline_value_bytes": 4}) as db, db.transaction() as t:
        t.put(b"small", b"ab")
        t.put(b"big", b"x" * 100)
    got = {k: rest for k, *rest in scan_locations(ocdbt_py.open(kv), "db")}
    assert got["small"] == [None, 0, 2, b"ab"]
    path, offset, length, inline = got["big"]
    assert path is not None and path.startswith("d/") and length == 100 and inline is None
    assert kv.get(path, (offset, offset + length)) == b"x" * 100


@pytest.mark.parametrize("bad", [b"../escape", b"/abs/path", b"d/\xff", b"s3://bucket/x"])
def test_unsafe_data_file_paths_are_refused(bad: bytes) -> None:
    ref = IndirectDataReference(DataFileId(b"", bad), 0, 4)
    db = types.SimpleNamespace(entry_columns=lambda: iter([LeafColumns([b"k"], [4], [ref], 0)]))
    with pytest.raises(CorruptionError, match="unsafe data file path"):
        list(scan_locations(db, "db"))
