"""Restores from stores that are not local files (``ocdbt_py.checkpoint.restore.remoteread``): every
chunk located by one B+tree scan, chunks of neighbouring arrays merged into few range reads,
requests in flight bounded by an explicit byte budget, and a bounded number of round trips in
sequence whatever the number of arrays."""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.restore import remoteread
from ocdbt_py.checkpoint.restore.api import open_item_dir
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, normalize_request
from ocdbt_py.testing.latency import LatencyStore


class Recording(KvStore):
    """Counts every request to ``base`` (each ``get_many`` entry is one request) and the most
    data-file bytes requested by calls in progress at once; ``delay`` makes calls overlap."""

    def __init__(self, base: KvStore, delay: float = 0.0):
        self.base = base
        self.delay = delay
        self.read_only = True
        self.requests: builtins.list[tuple[str, ByteRange | None]] = []
        self.lock = threading.Lock()
        self.outstanding = 0
        self.max_outstanding = 0
        self.calls_in_flight = 0
        self.max_calls_in_flight = 0

    @property
    def url(self) -> str:
        return self.base.url

    def _size(self, rng: ByteRange | None) -> int:
        return 0 if rng is None or rng[1] is None else rng[1] - max(rng[0], 0)

    def get_many(self, requests: Sequence[ReadRequest]) -> builtins.list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        nbytes = sum(self._size(r) for k, r in reqs if _is_data(k))
        with self.lock:
            self.requests.extend(reqs)
            self.outstanding += nbytes
            self.calls_in_flight += 1
            self.max_outstanding = max(self.max_outstanding, self.outstanding)
            self.max_calls_in_flight = max(self.max_calls_in_flight, self.calls_in_flight)
        try:
            if self.delay:
                time.sleep(self.delay)
            return self.base.get_many(reqs)
        finally:
            with self.lock:
                self.outstanding -= nbytes
                self.calls_in_flight -= 1

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self.get_many([(key, byte_range)])[0]

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        return self.base.list(prefix, start=start, stop=stop)

    def data_reads(self) -> builtins.list[tuple[str, ByteRange | None]]:
        """Range reads of OCDBT data files holding values (not manifests or metadata files)."""
        return [(k, r) for k, r in self.requests if _is_data(k) and r is not None]


def _is_data(key: str) -> bool:
    return "/d/" in f"/{key}"


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert isinstance(got[k], np.ndarray) and got[k].dtype == v.dtype, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """4000 arrays of 2 KiB: too big to be inlined in the B+tree (at most 1 KiB, as Orbax
    configures it), so each is a value in a data file, written back to back."""
    rng = np.random.default_rng(1)
    tree = {f"layer{i:04d}": rng.standard_normal(512).astype(np.float32) for i in range(4000)}
    path = tmp_path_factory.mktemp("many") / "ck"
    checkpoint.save(path, tree)
    return path, tree


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """Arrays of many chunks (edge chunks included) next to single-chunk ones, over several
    data files."""
    rng = np.random.default_rng(3)
    tree = {
        "big": rng.standard_normal((300, 70)).astype(np.float32),
        "mid": rng.integers(0, 1000, (1001,), dtype=np.int64),
        "scalar": np.float64(2.5),
        **{f"s{i:03d}": np.full((5, 3), i, np.int16) for i in range(50)},
    }
    path = tmp_path_factory.mktemp("chunked") / "ck"
    checkpoint.save(path, tree, chunk_byte_size=4096, ocdbt_target_data_file_size=64 << 10)
    return path, tree


def test_4000_arrays_take_few_round_trips(many: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, tree = many
    store = LatencyStore(LocalStore(path, read_only=True), delay=0.02)
    t = time.perf_counter()
    out = checkpoint.restore(store)
    elapsed = time.perf_counter() - t
    _same(out, tree)
    # listing, metadata files, manifest, B+tree levels, then the data: not one per array
    assert store.stats.depth <= 12, store.stats
    assert store.stats.requests <= 30, store.stats
    assert elapsed >= store.stats.depth * 0.02


def test_chunks_of_neighbouring_arrays_are_coalesced(many: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, tree = many
    rec = Recording(LocalStore(path, read_only=True))
    _same(checkpoint.restore(rec), tree)
    reads = rec.data_reads()
    files = {k for k, _ in reads}
    assert files, rec.requests
    # 4000 chunk values (8 MiB) come in at most a couple of range reads per data file
    assert len(reads) <= 2 * len(files) + 2, reads
    covered = sum(r[1] - r[0] for _, r in reads if r is not None and r[1] is not None)
    assert covered >= 4000 * 2048 * 0.9  # (zstd barely shrinks random floats): the reads carry the chunks


def test_in_flight_bytes_follow_the_budget(monkeypatch: pytest.MonkeyPatch,
                                           many: tuple[Path, dict[str, np.ndarray]]) -> None:
    """Small spans, a 1 MiB budget: several requests overlap, never more than 1 MiB of them."""
    path, tree = many
    monkeypatch.setenv("OCDBT_PY_FETCH_BYTES", str(1 << 20))
    monkeypatch.setattr(remoteread, "MAX_SPAN", 128 << 10)
    rec = Recording(LocalStore(path, read_only=True), delay=0.01)
    _same(checkpoint.restore(rec), tree)
    reads = rec.data_reads()
    assert len(reads) >= 50  # 8 MiB in spans of at most 128 KiB
    assert all(r[1] - r[0] <= (128 << 10) for _, r in reads if r is not None and r[1] is not None)
    assert rec.max_calls_in_flight >= 4, rec.max_calls_in_flight  # concurrency from bytes, not CPUs
    assert rec.max_outstanding <= (1 << 20), rec.max_outstanding


def test_budget_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OCDBT_PY_FETCH_BYTES", raising=False)
    assert remoteread.fetch_budget() == remoteread.IN_FLIGHT_BYTES
    assert remoteread.fetch_budget(250 << 20) == remoteread.IN_FLIGHT_BYTES == 64 << 20
    assert remoteread.fetch_budget(768 << 20) == 96 << 20  # an eighth of a large read...
    assert remoteread.fetch_budget(1 << 40) == remoteread.MAX_IN_FLIGHT_BYTES == 128 << 20  # ...up to a cap
    monkeypatch.setenv("OCDBT_PY_FETCH_BYTES", str(8 << 20))
    assert remoteread.fetch_budget() == remoteread.fetch_budget(1 << 40) == 8 << 20
    monkeypatch.setenv("OCDBT_PY_FETCH_BYTES", "1")  # floored: one request must fit
    assert remoteread.fetch_budget() == 1 << 20


def test_multi_chunk_arrays_and_edges(chunked: tuple[Path, dict[str, Any]]) -> None:
    path, tree = chunked
    rec = Recording(LocalStore(path, read_only=True))
    out = checkpoint.restore(rec)
    assert out["scalar"] == 2.5
    _same({k: v for k, v in out.items() if k != "scalar"}, {k: v for k, v in tree.items() if k != "scalar"})
    nfiles = len({k for k, _ in rec.data_reads()})
    assert nfiles >= 2  # the data really is spread over several data files
    assert len(rec.data_reads()) <= 2 * nfiles + 2


def test_row_windows_through_the_remote_path(chunked: tuple[Path, dict[str, Any]]) -> None:
    """``read_rows`` (export's streaming reads) takes the same path."""
    path, tree = chunked
    item = open_item_dir(LatencyStore(LocalStore(path, read_only=True)))
    try:
        meta = item.reader.metadata("big")
        c0 = meta.chunk_shape[0]
        (req, rows), = item.reader.read_rows([("big", c0, 3 * c0)])
        np.testing.assert_array_equal(rows, tree["big"][c0: 3 * c0])
    finally:
        item.close()


def _remote(path: Path) -> LatencyStore:
    """``path`` seen as a store that is not a local directory (so the remote path is taken)."""
    return LatencyStore(LocalStore(path, read_only=True))


def test_every_orbax_layout_matches_orbax(orbax_corpus: Any) -> None:
    """Every corpus checkpoint (OCDBT root and per-process databases, per-parameter
    directories, zarr2 and zarr3, sharded and chunked arrays) restores through the remote path
    exactly as Orbax restored it."""
    import warnings

    from tests.checkpoint.conftest import compare

    problems = {}
    for name in orbax_corpus.with_expected():
        case = orbax_corpus.cases[name]
        item = case.get("item") if case.get("tier", "").startswith("local") else None
        store = _remote(orbax_corpus.path(name))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", checkpoint.UncommittedStepWarning)
            got = checkpoint.restore(store, item=item)
        errs = compare(orbax_corpus.expected(name), got)
        if errs:
            problems[name] = errs[:5]
        if case.get("layout") == "dirs":  # one object per chunk: fetched in concurrent batches
            assert store.stats.depth <= 15, (name, store.stats)
    assert problems == {}


def test_missing_chunks_remote(orbax_corpus: Any) -> None:
    with pytest.raises(CorruptionError, match="missing"):
        checkpoint.restore(_remote(orbax_corpus.path("missing_chunk_modern")))
    legacy = checkpoint.restore(_remote(orbax_corpus.path("missing_chunk_legacy")))
    local = checkpoint.restore(orbax_corpus.path("missing_chunk_legacy"))
    np.testing.assert_array_equal(legacy["w"], local["w"])  # the gap reads as zeros in both


def test_per_process_databases_remote(orbax_corpus: Any, tmp_path: Path) -> None:
    import shutil

    from tests.checkpoint.conftest import compare

    dst = tmp_path / "mp"
    shutil.copytree(orbax_corpus.path("multiprocess_zarr3"), dst)
    (dst / "manifest.ocdbt").unlink()
    shutil.rmtree(dst / "d")
    got = checkpoint.restore(_remote(dst))
    assert compare(orbax_corpus.expected("multiprocess_zarr3"), got) == []


def _largest_data_file(path: Path) -> Path:
    """The data file holding the chunk values (the B+tree nodes are in smaller ones)."""
    return max((p for p in path.rglob("*") if p.is_file() and p.parent.name == "d"), key=lambda p: p.stat().st_size)


def test_truncated_data_file_is_corruption(tmp_path: Path, many: tuple[Path, dict[str, np.ndarray]]) -> None:
    import shutil

    src, _ = many
    path = tmp_path / "ck"
    shutil.copytree(src, path)
    victim = _largest_data_file(path)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(CorruptionError, match="truncated"):
        checkpoint.restore(_remote(path))


def test_missing_data_file_is_corruption(tmp_path: Path, many: tuple[Path, dict[str, np.ndarray]]) -> None:
    import shutil

    src, _ = many
    path = tmp_path / "ck"
    shutil.copytree(src, path)
    _largest_data_file(path).unlink()
    with pytest.raises(CorruptionError, match="missing"):
        checkpoint.restore(_remote(path))


def test_failed_request_propagates_and_stops(many: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = many

    class Failing(Recording):
        def get_many(self, requests: Sequence[ReadRequest]) -> builtins.list[bytes | None]:
            if any(_is_data(normalize_request(r)[0]) for r in requests):
                raise OSError("boom")
            return super().get_many(requests)

    with pytest.raises(OSError, match="boom"):
        checkpoint.restore(Failing(LocalStore(path, read_only=True)))


def test_small_pages_restores_numpys_setting() -> None:
    from ocdbt_py.checkpoint.restore.pages import _switch, small_pages

    fn = _switch()
    if fn is None:
        pytest.skip("this NumPy has no huge-page switch")
    before = fn(True)
    try:
        with small_pages():
            with small_pages():  # nested (or another thread): still off, restored once at the end
                assert fn(False) is False
            assert fn(False) is False
        assert fn(True) is True  # what it found (True) was put back
    finally:
        fn(before)


_BUDDY = """Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3
Node 0, zone    DMA32     19     16     22     18     15     14     13     14     15     13    741
Node 0, zone   Normal      2    778  14930   5004    667   3140   5508   1949    405      1    123
"""


def test_huge_pages_free_counts_free_2mib_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from ocdbt_py.checkpoint.restore import pages

    monkeypatch.setattr(pages, "_read", lambda path: _BUDDY if path == "/proc/buddyinfo" else "")
    # order 9 counts once, order 10 twice: DMA 1 + 2*3, DMA32 13 + 2*741, Normal 1 + 2*123
    assert pages.huge_pages_free() == (1 + 6) + (13 + 1482) + (1 + 246)
    monkeypatch.setattr(pages, "_read", lambda path: "")
    assert pages.huge_pages_free() == 0  # unreadable: none assumed


@pytest.mark.parametrize(("free", "defrag", "nbytes", "want"), [
    (1000, "always defer defer+madvise [madvise] never", 256 << 20, True),   # 2000 MiB free >= 2 x 256
    (200, "always defer defer+madvise [madvise] never", 256 << 20, False),   # 400 MiB free: could compact
    (0, "always defer defer+madvise madvise [never]", 256 << 20, True),      # faults never compact
    (0, "always [defer] defer+madvise madvise never", 512 << 20, True),
    (10000, "always defer defer+madvise madvise [never]", 1 << 30, False),   # above HUGE_MAX
    (1000, "always defer defer+madvise [madvise] never", 1 << 20, False),    # NumPy asks nothing below 4 MiB
])
def test_output_pages_chooses_huge_pages_only_when_they_cannot_stall(
        monkeypatch: pytest.MonkeyPatch, free: int, defrag: str, nbytes: int, want: bool) -> None:
    from ocdbt_py.checkpoint.restore import pages

    fn = pages._switch()
    if fn is None:
        pytest.skip("this NumPy has no huge-page switch")
    monkeypatch.setenv("OCDBT_PY_HUGEPAGES", "auto")
    files = {"/sys/kernel/mm/transparent_hugepage/defrag": defrag,
             "/sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never"}
    monkeypatch.setattr(pages, "_read", lambda path: files.get(path, ""))
    monkeypatch.setattr(pages, "huge_pages_free", lambda: free)
    before = fn(not want)
    try:
        with pages.output_pages(nbytes):
            assert fn(want) is want
        assert fn(not want) is (not want)  # what it found was put back
    finally:
        fn(before)


def test_output_pages_env_and_small_pages_win(monkeypatch: pytest.MonkeyPatch) -> None:
    from ocdbt_py.checkpoint.restore import pages

    fn = pages._switch()
    if fn is None:
        pytest.skip("this NumPy has no huge-page switch")
    before = fn(True)
    try:
        for env in ("0", ""):  # ordinary pages by default
            monkeypatch.setenv("OCDBT_PY_HUGEPAGES", env)
            monkeypatch.setattr(pages, "huge_pages_free", lambda: 1 << 20)
            with pages.output_pages(256 << 20):
                assert fn(False) is False
        monkeypatch.setenv("OCDBT_PY_HUGEPAGES", "1")
        with pages.output_pages(1):
            assert fn(True) is True
            with pages.small_pages():  # OCDBT_PY_HUGEPAGES=1 keeps NumPy's default here too
                assert fn(True) is True
        monkeypatch.setenv("OCDBT_PY_HUGEPAGES", "auto")
        monkeypatch.setattr(pages, "_want_huge", lambda n: True)
        with pages.output_pages(1 << 30):
            assert fn(True) is True
            with pages.small_pages():  # another restore's pool buffers: ordinary pages win
                assert fn(False) is False
            assert fn(True) is True
        assert fn(True) is True
    finally:
        fn(before)
