"""Vectored writes of many parts to a local file sink (data files of many small chunks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ocdbt_py.kvstore import LocalStore, MemoryStore, sinks
from ocdbt_py.kvstore.sinks import open_sink
from ocdbt_py.write.bulk import DataFilePool


def _parts(n: int) -> list[bytes]:
    return [bytes([i % 251]) * (1 + (i * 7919) % 5000) for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 511, 512, 513, 1500])
def test_write_parts_appends_in_order(tmp_path: Path, n: int) -> None:
    kv = LocalStore(tmp_path)
    s: Any = open_sink(kv, "f")
    s.write(b"head")
    parts = _parts(n)
    assert s.write_parts(parts) == sum(map(len, parts))
    s.write(memoryview(b"tail"))
    s.close()
    assert kv.get("f") == b"head" + b"".join(parts) + b"tail"


@pytest.mark.skipif(not hasattr(os, "writev"), reason="no vectored writes here")
def test_short_vectored_writes_are_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``writev`` may write less than asked (signals, a 2 GiB cap): the rest follows, in order."""
    real = os.writev

    def short(fd: int, buffers: Any) -> int:
        bufs = list(buffers)
        # write only about a third of what was asked, cutting inside a part
        want = max(1, sum(memoryview(b).nbytes for b in bufs) // 3)
        out = bytearray()
        for b in bufs:
            out += bytes(b)
            if len(out) >= want:
                break
        return real(fd, [bytes(out[:want])])

    monkeypatch.setattr(sinks.os, "writev", short)
    kv = LocalStore(tmp_path)
    s: Any = open_sink(kv, "f")
    parts = _parts(1200)
    s.write_parts(parts)
    s.close()
    assert kv.get("f") == b"".join(parts)


@pytest.mark.parametrize("store", ["local", "memory"])
def test_data_file_write_parts(tmp_path: Path, store: str) -> None:
    """A data file takes parts whatever its sink: vectored on local files, joined elsewhere."""
    kv = LocalStore(tmp_path) if store == "local" else MemoryStore()
    pool = DataFilePool(kv, target_size=0, sync=False)
    f = pool.lease()
    parts = _parts(700)
    f.write(b"x")
    f.write_parts(parts)
    assert f.size == 1 + sum(map(len, parts))
    pool.release(f)
    pool.close()
    (name,) = [k for k in kv.list("")]
    assert kv.get(name) == b"x" + b"".join(parts)
