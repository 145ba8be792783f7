"""The array reader: batched single-chunk reads, missing chunks, streaming, coalesced OCDBT reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr3
from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.restore import reader as reader_mod
from ocdbt_py.checkpoint.restore.item import PyTreeItem
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore import LocalStore
from tests.checkpoint.conftest import Corpus, compare


def write_item(root: Path, arrays: dict[str, tuple[np.ndarray, tuple[int, ...]]], *, zarr_format: int = 2,
               store_flag: bool = True, scalars: dict[str, Any] | None = None) -> None:
    """A per-parameter-directory PyTree item written with zarr3 (as Orbax lays it out)."""
    kv = LocalStore(root)
    entries = {}
    for name, (a, chunks) in arrays.items():
        kw: dict[str, Any] = {"compressor": {"id": "zstd", "level": 1}} if zarr_format == 2 else {
            "compressor": "zstd"}
        arr = zarr3.create(kv, name, shape=a.shape, dtype=a.dtype, chunks=chunks, zarr_format=zarr_format,
                           write_empty_chunks=True, **kw)
        arr[...] = a
        entries[str((name,))] = {"key_metadata": [{"key": name, "key_type": 2}],
                                 "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}
    for name, v in (scalars or {}).items():
        a = np.asarray(v)
        arr = zarr3.create(kv, name, shape=(), dtype=a.dtype, zarr_format=zarr_format, write_empty_chunks=True)
        arr[...] = a
        entries[str((name,))] = {"key_metadata": [{"key": name, "key_type": 2}],
                                 "value_metadata": {"value_type": "scalar", "skip_deserialize": False}}
    meta = {"tree_metadata": entries, "use_ocdbt": False, "use_zarr3": zarr_format == 3}
    if store_flag:
        meta["store_array_data_equal_to_fill_value"] = True
    (root / "_METADATA").write_text(json.dumps(meta))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_many_small_arrays_and_scalars(tmp_path: Path, zarr_format: int) -> None:
    rng = np.random.default_rng(0)
    arrays = {f"a{i:03d}": (rng.standard_normal((3, 5)).astype(np.float32), (3, 5)) for i in range(30)}
    arrays["multi"] = (np.arange(40, dtype=np.int16).reshape(8, 5), (3, 2))  # several chunks, edge chunks
    arrays["overhang"] = (np.arange(5, dtype=np.float64), (8,))  # one chunk larger than the array
    write_item(tmp_path, arrays, zarr_format=zarr_format, scalars={"s": 7, "f": 0.5})
    got = checkpoint.restore(tmp_path)
    for name, (a, _) in arrays.items():
        np.testing.assert_array_equal(got[name], a)
        assert got[name].dtype == a.dtype
    assert got["s"] == 7 and type(got["s"]) is int and got["f"] == 0.5


def test_missing_chunks_single_and_multi(tmp_path: Path) -> None:
    arrays = {"one": (np.arange(6, dtype=np.float32) + 1, (6,)), "two": (np.arange(8, dtype=np.float32) + 1, (4,))}
    modern = tmp_path / "modern"
    write_item(modern, arrays)
    (modern / "one" / "0").unlink()
    with pytest.raises(CorruptionError, match="'one'.*missing"):
        checkpoint.restore(modern)
    legacy = tmp_path / "legacy"
    write_item(legacy, arrays, store_flag=False)
    (legacy / "one" / "0").unlink()
    (legacy / "two" / "1").unlink()
    got = checkpoint.restore(legacy)
    assert got["one"].tolist() == [0] * 6
    assert got["two"].tolist() == [1, 2, 3, 4, 0, 0, 0, 0]


def test_large_arrays_stream_and_batches_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small batch and large-array thresholds: every path (single, multi, big) in one restore."""
    monkeypatch.setattr(reader_mod, "BATCH_BYTES", 2048)
    monkeypatch.setattr(reader_mod, "SMALL_ARRAY_BYTES", 4096)
    rng = np.random.default_rng(1)
    arrays = {f"s{i}": (rng.standard_normal(100).astype(np.float32), (100,)) for i in range(40)}
    arrays.update({f"m{i}": (rng.standard_normal(200).astype(np.float32), (50,)) for i in range(20)})
    arrays["big"] = (rng.standard_normal((64, 64)).astype(np.float32), (16, 64))
    arrays["bigedge"] = (rng.standard_normal((50, 30)).astype(np.float64), (16, 16))  # partial edge chunks
    write_item(tmp_path, arrays)
    item = PyTreeItem(LocalStore(tmp_path))
    plan = item.reader._plan(sorted(arrays))
    kinds = [k for k, _ in plan]
    assert kinds.count("big") == 1 and kinds.count("single") > 1 and kinds.count("multi") > 1
    assert sorted(dict(plan)["big"]) == ["big", "bigedge"]
    got = checkpoint.restore(tmp_path)
    for name, (a, _) in arrays.items():
        np.testing.assert_array_equal(got[name], a)
    # a missing chunk of a streamed array: an error, or zeros without the "every chunk" flag
    (tmp_path / "bigedge" / "3.1").unlink()
    with pytest.raises(CorruptionError, match="'bigedge'.*missing"):
        checkpoint.restore(tmp_path)
    meta = json.loads((tmp_path / "_METADATA").read_text())
    del meta["store_array_data_equal_to_fill_value"]
    (tmp_path / "_METADATA").write_text(json.dumps(meta))
    edge = checkpoint.restore(tmp_path)["bigedge"]
    want = arrays["bigedge"][0].copy()
    want[48:50, 16:30] = 0
    np.testing.assert_array_equal(edge, want)


def test_overlay_store_serves_prefetched_and_falls_back() -> None:
    from ocdbt_py.kvstore import MemoryStore

    base = MemoryStore({"a": b"0123456789", "b": b"base"})
    ov = reader_mod.OverlayStore(base, {"a": b"abcdefghij", "gone": None})
    assert ov.get("a") == b"abcdefghij" and ov.get("a", (2, 4)) == b"cd" and ov.get("a", (-3, None)) == b"hij"
    assert ov.get("gone") is None and ov.get("b") == b"base"
    assert ov.get_many(["a", ("a", (0, 2)), "b", "gone", "zz"]) == [b"abcdefghij", b"ab", b"base", None, None]


def test_coalesced_ocdbt_reads(tmp_path: Path) -> None:
    """Many small values read with coalesced range reads equal one-by-one reads; a truncated
    data file is reported as corruption, never silently short."""
    ts = pytest.importorskip("tensorstore")
    import ocdbt_py

    rng = np.random.default_rng(2)
    values = {f"k{i:04d}".encode(): rng.integers(0, 256, size=int(rng.integers(1025, 20000)),
                                                 dtype=np.uint8).tobytes() for i in range(300)}
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{tmp_path}/",
                          "config": {"max_inline_value_bytes": 1024}}).result()
    with ts.Transaction() as txn:
        for k, v in values.items():
            kv.with_transaction(txn)[k] = v
    db = ocdbt_py.open(str(tmp_path))
    keys = sorted(values)
    assert db.get_many(keys) == [values[k] for k in keys]
    assert [db.get(k) for k in keys[:20]] == [values[k] for k in keys[:20]]
    data_files = sorted((tmp_path / "d").iterdir(), key=lambda p: p.stat().st_size)
    biggest = data_files[-1]
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    with pytest.raises(CorruptionError):
        ocdbt_py.open(str(tmp_path)).get_many(keys)


@pytest.mark.parametrize("span_min", [0, 1])
@pytest.mark.parametrize("mmap_min", [1, 1 << 40])
def test_local_fast_path_matches(monkeypatch: pytest.MonkeyPatch, mmap_min: int, span_min: int,
                                 orbax_corpus: Corpus) -> None:
    """Local reads (coalesced preadv into pooled buffers, mapped coalesced spans, or mmap of
    single chunks) give Orbax's values."""
    from ocdbt_py.checkpoint.restore import localread

    corpus = orbax_corpus
    monkeypatch.setattr(localread, "MMAP_MIN", mmap_min)
    monkeypatch.setattr(localread, "MMAP_SPAN_MIN", span_min)
    monkeypatch.setattr(localread, "COALESCE_MAX", 40000)  # several coalesced groups per file
    monkeypatch.setattr(reader_mod, "SMALL_ARRAY_BYTES", 20000)  # stream the bigger arrays
    for case in ("chunked_zarr2", "chunked_zarr3", "perparam_zarr3", "multiprocess_zarr3", "no_merged_root"):
        item = PyTreeItem(LocalStore(corpus.path(case)))
        assert item.reader.local_source() is not None
        assert compare(corpus.expected(case), checkpoint.restore(corpus.path(case))) == [], case


def test_local_fast_path_damaged_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       orbax_corpus: Corpus) -> None:
    import shutil

    from ocdbt_py.checkpoint.restore import localread

    corpus = orbax_corpus
    for mmap_min, span_min in ((1, 0), (1 << 40, 0), (1 << 40, 1)):
        monkeypatch.setattr(localread, "MMAP_MIN", mmap_min)
        monkeypatch.setattr(localread, "MMAP_SPAN_MIN", span_min)
        dst = tmp_path / f"c{mmap_min}_{span_min}"
        shutil.copytree(corpus.path("chunked_zarr3"), dst)
        files = sorted((dst / "ocdbt.process_0" / "d").iterdir(), key=lambda p: p.stat().st_size)
        files[-1].write_bytes(files[-1].read_bytes()[:100])
        with pytest.raises(CorruptionError, match="truncated"):
            checkpoint.restore(dst)
        files[-1].unlink()
        with pytest.raises(CorruptionError, match="missing"):
            checkpoint.restore(dst)



@pytest.mark.parametrize("span_min", [0, 1])
def test_local_source_mapped_spans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, span_min: int) -> None:
    """Coalesced chunks handed out as views of one mapping (``MMAP_SPAN_MIN``) are the same
    bytes as the pooled reads; the mapping is closed once every chunk of it is done, a
    truncated span is corruption, and an absent key stays ``None``."""
    from ocdbt_py.checkpoint.restore import localread
    from ocdbt_py.checkpoint.restore.locations import Location

    monkeypatch.setattr(localread, "MMAP_SPAN_MIN", span_min)
    monkeypatch.setattr(localread, "MMAP_MIN", 1 << 40)
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    path = tmp_path / "d0"
    path.write_bytes(data)
    table = {f"k{i}": Location(0, str(path), off, n) for i, (off, n) in
             enumerate([(0, 1000), (1000, 50_000), (60_000, 7), (61_000, 100_000), (250_000, 50_000)])}
    table["inline"] = Location(0, None, 0, 3, b"abc")
    src = localread.LocalSource(lambda keys: [table.get(k) for k in keys], table)
    keys = ["k3", "k0", "missing", "k1", "inline", "k2", "k4"]
    out, done = src.fetch(keys)
    want = [None if (loc := table.get(k)) is None else
            (loc.inline if loc.file is None else data[loc.offset:loc.offset + loc.length]) for k in keys]
    assert [None if v is None else bytes(v) for v in out] == want
    views = [v for v in out if isinstance(v, memoryview)]
    for i in range(len(keys)):
        done(i)
    if span_min:
        with pytest.raises(ValueError):  # released with their mapping
            bytes(views[0])
    path.write_bytes(data[:200_000])  # k4 now reaches past the end
    with pytest.raises(CorruptionError, match="truncated"):
        src.fetch(["k3", "k4"])
    src.close()
