"""Restores from stores that read a range in parts (``KvStore.read_parts``, the obstore route):
each value is handed to the decoder as a :class:`~ocdbt_py.checkpoint.restore.remoteread.PartView`
and large zstd or uncompressed chunks are decoded while their later parts are still arriving,
whatever order the parts complete in; damaged or missing data files are still errors."""

from __future__ import annotations

import builtins
import concurrent.futures
import random
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.restore import remoteread
from ocdbt_py.checkpoint.restore.remoteread import Parts, PartView
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.kvstore.base import ByteRange, KvStore
from zarr3.codecs.chain import CodecChain
from zarr3.codecs.zstd import zstd_decompress_stream_into


class PartsStore(KvStore):
    """``base`` read through :meth:`read_parts` in parts of ``part`` bytes that complete in a
    shuffled order (each after a short random delay), each handed over as one buffer or (with
    ``chunks``) as a list of three consecutive ones; ``fail`` makes data-file parts raise."""

    def __init__(self, base: KvStore, part: int = 100_000, fail: bool = False, chunks: bool = False):
        self.base = base
        self.part = part
        self.fail = fail
        self.chunks = chunks
        self.read_only = True
        self.pool = concurrent.futures.ThreadPoolExecutor(8)
        self.rng = random.Random(7)
        self.lock = threading.Lock()
        self.parts_read = 0

    @property
    def url(self) -> str:
        return self.base.url

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self.base.get(key, byte_range)

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        return self.base.list(prefix, start=start, stop=stop)

    @property
    def supports_read_parts(self) -> bool:
        return True

    def _part(self, key: str, a: int, b: int, delay: float) -> bytes | list[bytes] | None:
        time.sleep(delay)
        if self.fail:
            raise OSError("boom")
        with self.lock:
            self.parts_read += 1
        data = self.base.get(key, (a, b))
        if data is None or not self.chunks:
            return data
        third = max(1, len(data) // 3)
        return [data[:third], data[third: 2 * third], data[2 * third:]]

    def read_parts(self, key: str, lo: int, hi: int) -> builtins.list[tuple[int, concurrent.futures.Future[Any]]]:
        with self.lock:
            delays = [self.rng.random() * 0.003 if self.part >= 1000 else 0.0 for _ in range(lo, hi, self.part)]
        return [(a, self.pool.submit(self._part, key, a, min(a + self.part, hi), d))
                for a, d in zip(range(lo, hi, self.part), delays)]


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.fixture(scope="module", params=[True, False], ids=["zstd", "raw"])
def large(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, dict[str, np.ndarray]]:
    """Chunks of 1.5 MiB (above STREAM_MIN) in two data files, next to small arrays."""
    rng = np.random.default_rng(4)
    tree = {f"w{i}": rng.standard_normal(9 << 17).astype(np.float32) for i in range(3)}
    tree.update({f"s{i:02d}": rng.standard_normal(700).astype(np.float32) for i in range(40)})
    path = tmp_path_factory.mktemp("parts") / "ck"
    checkpoint.save(path, tree, chunk_byte_size=(3 << 19), ocdbt_target_data_file_size=8 << 20,
                    use_compression=bool(request.param))
    return path, tree


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the length of every value decoded as it streamed in."""
    seen: list[int] = []
    real = CodecChain.decode_stream_into

    def spy(self: CodecChain, source: Any, out: np.ndarray) -> None:
        seen.append(source.nbytes)
        real(self, source, out)

    monkeypatch.setattr(CodecChain, "decode_stream_into", spy)
    return seen


@pytest.mark.parametrize("chunks,budget", [(False, None), (True, None), (True, 2 << 20)])
def test_large_chunks_decode_while_their_parts_arrive(large: tuple[Path, dict[str, np.ndarray]],
                                                      streamed: list[int], chunks: bool, budget: int | None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """(with a 2 MiB budget: parts decoded give their bytes back to it as they go, so the next
    request starts before the chunk is done)"""
    path, tree = large
    if budget is not None:
        monkeypatch.setenv("OCDBT_PY_FETCH_BYTES", str(budget))
    store = PartsStore(LocalStore(path, read_only=True), chunks=chunks)
    _same(checkpoint.restore(store), tree)
    assert len(streamed) == 3 * 3  # every 1.5 MiB chunk, each over many parts
    assert all(n >= remoteread.STREAM_MIN for n in streamed)
    assert store.parts_read >= 3 * 3 * 10  # (about 14 parts of 100 kB a chunk)


@pytest.mark.parametrize("part", [61, 997, 1 << 20])
def test_values_across_parts_of_any_size(large: tuple[Path, dict[str, np.ndarray]], part: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Small values lying across part boundaries are joined; tiny parts still work."""
    path, tree = large
    small = {k: v for k, v in tree.items() if k.startswith("s")}
    monkeypatch.setattr(remoteread, "STREAM_MIN", 1 << 40)  # no streaming: whole values only
    if part < 1000:
        tree = small  # (thousands of parts a chunk: only the small arrays)
    got = checkpoint.restore(PartsStore(LocalStore(path, read_only=True), part=part, chunks=part > 100),
                             {k: np.zeros_like(v) for k, v in tree.items()})
    _same(got, tree)


def test_truncated_and_missing_data_files(tmp_path: Path, large: tuple[Path, dict[str, np.ndarray]]) -> None:
    src, _ = large
    for damage, match in (("truncate", "truncated"), ("delete", "missing")):
        path = tmp_path / damage
        shutil.copytree(src, path)
        victim = max((p for p in path.rglob("*") if p.is_file() and p.parent.name == "d"),
                     key=lambda p: p.stat().st_size)
        if damage == "truncate":
            victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        else:
            victim.unlink()
        with pytest.raises(CorruptionError, match=match):
            checkpoint.restore(PartsStore(LocalStore(path, read_only=True)))


def test_failed_part_propagates(large: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = large
    with pytest.raises(OSError, match="boom"):
        checkpoint.restore(PartsStore(LocalStore(path, read_only=True), fail=True))


def _parts(data: bytes, cuts: list[int], lo: int = 0) -> Parts:
    offsets = [lo, *[lo + c for c in cuts]]
    futs = []
    for a, b in zip(offsets, [*offsets[1:], lo + len(data)]):
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        f.set_result(data[a - lo: b - lo])
        futs.append((a, f))
    return Parts("mem://f", lo, lo + len(data), futs)


def test_part_view_whole_head_and_read() -> None:
    data = bytes(range(256)) * 40
    parts = _parts(data, [1000, 1001, 5000], lo=100)
    inside = PartView(parts, 1200, 5000)
    assert isinstance(inside.whole(), memoryview) and isinstance(inside.whole().obj, bytes)  # a view, no copy
    assert bytes(inside.whole()) == data[1100:4900]
    across = PartView(parts, 150, 9000)
    assert bytes(across.whole()) == data[50:8900] and len(across) == across.nbytes == 8850
    assert bytes(across.head(2000)) == data[50:2050]
    pieces = []
    while piece := across.read(700):
        assert len(piece) <= 700
        pieces.append(bytes(piece))
    assert b"".join(pieces) == data[50:8900]
    assert across.read(10) == b""


def test_part_view_over_chunked_parts() -> None:
    data = bytes(range(256)) * 40

    def chunked() -> Parts:
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        f.set_result([data[:10], b"", data[10:4000]])
        g: concurrent.futures.Future[Any] = concurrent.futures.Future()
        g.set_result([data[4000:7000], data[7000:]])
        return Parts("mem://f", 0, len(data), [(0, f), (4000, g)])

    parts = chunked()
    assert bytes(PartView(parts, 20, 3000).whole()) == data[20:3000]
    assert bytes(PartView(parts, 5, 9000).whole()) == data[5:9000]
    parts = chunked()
    view = PartView(parts, 3, len(data))
    pieces = []
    while piece := view.read(1 << 20):
        pieces.append(bytes(piece))
    assert b"".join(pieces) == data[3:] and [len(p) for p in pieces] == [7, 3990, 3000, len(data) - 7000]
    assert parts.futs == [None, None]  # read past: let go


def test_part_view_short_or_absent_part_is_corruption() -> None:
    short = _parts(b"x" * 100, [50])
    f: concurrent.futures.Future[Any] = concurrent.futures.Future()
    f.set_result(b"y" * 10)  # the object ended early
    short.futs[1] = f
    with pytest.raises(CorruptionError, match="truncated"):
        PartView(short, 0, 100).whole()
    gone = _parts(b"x" * 100, [])
    g: concurrent.futures.Future[Any] = concurrent.futures.Future()
    g.set_result(None)
    gone.futs[0] = g
    with pytest.raises(CorruptionError, match="missing"):
        PartView(gone, 0, 10).head(4)


class _Pieces:
    """A ByteSource over ``data`` handed out ``step`` bytes at a time."""

    def __init__(self, data: bytes, step: int):
        self.data = data
        self.step = step
        self.pos = 0

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def head(self, n: int) -> bytes:
        return self.data[:n]

    def read(self, n: int) -> bytes:
        out = self.data[self.pos: self.pos + min(n, self.step)]
        self.pos += len(out)
        return out


def test_zstd_stream_decode_matches_and_checks_sizes() -> None:
    raw = np.random.default_rng(0).standard_normal(300_000).astype(np.float32).tobytes()
    comp = zstandard.ZstdCompressor(level=1).compress(raw)
    out = bytearray(len(raw))
    zstd_decompress_stream_into(_Pieces(comp, 4097), memoryview(out))
    assert bytes(out) == raw
    with pytest.raises(CorruptionError):  # the stream stops early
        zstd_decompress_stream_into(_Pieces(comp[: len(comp) // 2], 4097), memoryview(bytearray(len(raw))))
    with pytest.raises(CorruptionError):  # the frame declares more than the chunk holds
        zstd_decompress_stream_into(_Pieces(comp, 4097), memoryview(bytearray(len(raw) - 4)))
    with pytest.raises(CorruptionError):  # 20 bytes cannot hold 1 GiB (refused before decoding)
        zstd_decompress_stream_into(_Pieces(comp[:20], 7), memoryview(np.empty(1 << 30, np.uint8)))


def test_budget_holds_two_of_the_largest_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OCDBT_PY_FETCH_BYTES", raising=False)
    assert remoteread.fetch_budget(250 << 20, 60 << 20) == 120 << 20  # one decoded, the next on its way
    assert remoteread.fetch_budget(250 << 20, 1 << 30) == remoteread.MAX_IN_FLIGHT_BYTES  # capped
    assert remoteread.fetch_budget(250 << 20, 1 << 20) == remoteread.IN_FLIGHT_BYTES
    monkeypatch.setenv("OCDBT_PY_FETCH_BYTES", str(8 << 20))
    assert remoteread.fetch_budget(250 << 20, 60 << 20) == 8 << 20  # the override wins
