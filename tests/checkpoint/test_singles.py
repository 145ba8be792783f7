"""Batches of single-chunk arrays decoded while the previous batch is handed out and the next is
fetched (``restore.singles``): the same values over many batches and mixed kinds, and every
fetched buffer released whether the read ends, fails or is abandoned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.restore import localread, reader, singles
from ocdbt_py.checkpoint.restore.api import open_item_dir, resolve
from ocdbt_py.errors import CorruptionError


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    t: dict[str, Any] = {f"s{i:03d}": rng.standard_normal(2048, dtype=np.float32) for i in range(60)}
    t["chunked"] = rng.standard_normal((64, 300), dtype=np.float32)  # several chunks: a "multi" array
    t["big"] = rng.standard_normal((3000, 1000), dtype=np.float32)  # 12 MB: streamed ("big")
    return t


@pytest.fixture
def placements(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Record, for every local fetch of a batch, how often its buffers were released (batches
    of about 64 KiB, so the 60 small arrays take several)."""
    monkeypatch.setattr(reader, "BATCH_BYTES", 64 << 10)
    made: list[list[int]] = []
    real_fetch = localread.LocalSource.fetch

    def fetch(self: Any, keys: Any, where: Any = None) -> Any:
        out = real_fetch(self, keys, where)
        if where is not None:
            inner, count = where.release_all, [0]
            made.append(count)

            def counted() -> None:
                count[0] += 1
                inner()

            where.release_all = counted
        return out

    monkeypatch.setattr(localread.LocalSource, "fetch", fetch)
    return made


def _save(tmp_path: Path, **kw: Any) -> tuple[Path, dict[str, Any]]:
    tree = _tree()
    checkpoint.save(tmp_path / "ck", tree, chunk_byte_size=16 << 10, leaf_chunk_byte_sizes={"big": 4 << 20}, **kw)
    return tmp_path / "ck", tree


def test_many_batches_and_kinds_restore_the_same(tmp_path: Path, placements: list[list[int]]) -> None:
    path, tree = _save(tmp_path)
    got = checkpoint.restore(path)
    assert set(got) == set(tree)
    for k, v in tree.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert len(placements) >= 4  # several single batches
    assert all(c == [1] for c in placements), placements  # each batch's buffers released once


def test_a_damaged_chunk_in_a_later_batch_fails_and_releases_everything(
        tmp_path: Path, placements: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = _save(tmp_path)
    item = open_item_dir(resolve(str(path)).kv)
    meta = item.reader.metadata("s050")
    src = item.reader.local_source()
    assert src is not None and src.table is not None
    loc = src.table[f"s050/{meta.chunk_key((0,))}"]
    item.close()
    with open(loc.file, "r+b") as f:
        f.seek(loc.offset)
        f.write(b"\0\0\0\0")
    abandoned: list[Any] = []
    real = singles.SingleBatch.abandon
    monkeypatch.setattr(singles.SingleBatch, "abandon", lambda self: (abandoned.append(self), real(self))[1])
    with pytest.raises(CorruptionError, match="s050"):
        checkpoint.restore(path)
    assert abandoned  # the batch decoding behind the failed one was stopped
    assert placements and all(c == [1] for c in placements), placements


def test_stopping_early_abandons_the_batches_in_flight(tmp_path: Path, placements: list[list[int]]) -> None:
    path, tree = _save(tmp_path)
    item = open_item_dir(resolve(str(path)).kv)
    params = [item.data_param(leaf) for leaf in item.leaves]
    it = item.reader.read_many(params)
    first = [next(it) for _ in range(3)]
    for p, a in first:
        np.testing.assert_array_equal(a, tree[p])
    it.close()  # the consumer stops: the batch decoding and the one fetched ahead are dropped
    item.close()
    assert len(placements) >= 2 and all(c == [1] for c in placements), placements
