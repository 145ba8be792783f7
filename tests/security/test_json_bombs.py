"""Hole 6: JSON nesting and huge integers in zarr metadata and ``_METADATA``.

Deeply nested documents used to raise ``RecursionError``; a 5,000-digit integer raised
``ValueError`` from Python's int-string limit.  Both must be our error
(:class:`MetadataError` / :class:`CorruptionError`) naming the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import zarr3
from ocdbt_py import checkpoint
from ocdbt_py.errors import CorruptionError, OcdbtError
from ocdbt_py.kvstore import MemoryStore
from zarr3.engine.json_text import MAX_DEPTH, loads
from zarr3.errors import MetadataError

pytestmark = pytest.mark.timeout(60)

V2 = {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<f4", "compressor": None,
      "fill_value": 0, "order": "C", "filters": None}
V3 = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "float32",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
      "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
      "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}


def deep(n: int) -> str:
    return "[" * n + "]" * n


def with_attr(doc: dict, value_json: str) -> bytes:
    text = json.dumps(dict(doc, attributes={"x": 0}) if doc["zarr_format"] == 3 else doc)
    if doc["zarr_format"] == 3:
        return text.replace('{"x": 0}', '{"x": ' + value_json + "}").encode()
    return text[:-1].encode() + b', "extra": ' + value_json.encode() + b"}"


BOMBS = {
    "deep-200": deep(200),
    "deep-100000": deep(100_000),
    "deep-objects": '{"a":' * 5000 + "1" + "}" * 5000,
    "int-5000": "1" * 5000,
    "int-100": "9" * 100,
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_loads_raises_value_error(name: str) -> None:
    with pytest.raises(ValueError):
        loads(BOMBS[name])


def test_limits_are_generous_for_real_documents() -> None:
    assert loads(deep(MAX_DEPTH)) is not None
    assert loads(str(2**64 - 1)) == 2**64 - 1
    assert loads("-" + str(2**63)) == -(2**63)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_zarr_metadata_bombs(fmt: int, name: str) -> None:
    key = "a/zarr.json" if fmt == 3 else "a/.zarray"
    store = MemoryStore({key: with_attr(V3 if fmt == 3 else V2, BOMBS[name])})
    with pytest.raises(MetadataError) as ei:
        zarr3.open(store, "a")
    assert ("zarr.json" if fmt == 3 else ".zarray") in str(ei.value)


def test_zattrs_bomb() -> None:
    store = MemoryStore({"a/.zarray": json.dumps(V2).encode(), "a/.zattrs": ('{"x":' + deep(50_000) + "}").encode()})
    with pytest.raises(MetadataError, match=".zattrs"):
        zarr3.open(store, "a")


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_checkpoint_metadata_bombs(tmp_path: Path, name: str) -> None:
    ck = tmp_path / "ck"
    checkpoint.save(ck, {"w": np.arange(4, dtype=np.float32)})
    meta = json.loads((ck / "_METADATA").read_text())
    text = json.dumps(dict(meta, custom="PLACEHOLDER"))
    (ck / "_METADATA").write_text(text.replace('"PLACEHOLDER"', BOMBS[name]))
    for call in (checkpoint.restore, checkpoint.metadata):
        with pytest.raises(CorruptionError) as ei:
            call(ck)
        assert "_METADATA" in str(ei.value)


def test_nothing_but_our_errors_with_a_small_stack() -> None:
    """Parsing near the recursion limit still gives ValueError, never RecursionError."""
    def dive(n: int) -> None:
        if n:
            dive(n - 1)
        else:
            with pytest.raises(ValueError):
                loads(deep(900))

    dive(sys.getrecursionlimit() - 120)


def test_checkpoint_zarr_metadata_bomb(tmp_path: Path) -> None:
    """Zarr metadata inside the checkpoint's OCDBT database, made deep: our error, file named."""
    import ocdbt_py

    ck = tmp_path / "ck"
    checkpoint.save(ck, {"w": np.arange(4, dtype=np.float32)})
    db = ocdbt_py.open(ck, mode="a")
    keys = [k for k in db.list() if k.endswith((b".zarray", b"zarr.json"))]
    for k in keys:
        doc = json.loads(db[k])
        doc["attributes" if k.endswith(b"zarr.json") else "extra"] = "PLACEHOLDER"
        db[k] = json.dumps(doc).replace('"PLACEHOLDER"', deep(10_000)).encode()
    db.close()
    with pytest.raises(OcdbtError) as ei:
        checkpoint.restore(ck)
    assert "w" in str(ei.value)
