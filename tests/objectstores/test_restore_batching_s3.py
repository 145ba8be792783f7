"""Checkpoint restores from S3 on the wire: ranged reads straight into buffers (obstore and the
S3 client's own path), chunks of neighbouring arrays merged into few GETs, and a bounded number
of round trips in sequence (a latency proxy counts every HTTP request); an HTTP server that
ignores ``Range`` is never misread."""

from __future__ import annotations

import functools
import http.server
import itertools
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.kvstore import open_kvstore
from tests.objectstores import servers

BUCKET = "ocdbt-batching"
_n = itertools.count()
BLOB = bytes(range(256)) * 1024  # 256 KiB


@pytest.fixture(scope="module")
def bucket(s3_server: servers.S3Server) -> servers.S3Server:
    s3_server.make_bucket(BUCKET)
    return s3_server


@pytest.fixture(params=["obstore", "fsspec"])
def s3_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OCDBT_PY_BACKEND", request.param)
    return str(request.param)


def _store(srv: servers.S3Server, name: str, **opts: Any) -> Any:
    return open_kvstore(f"s3://{BUCKET}/{name}", dict(srv.storage_options(), **opts))


@pytest.mark.parametrize("part_bytes", [8 << 20, 700])
def test_read_into_semantics(bucket: servers.S3Server, s3_mode: str, part_bytes: int,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """(obstore: also with every read split into concurrent parts of 700 bytes)"""
    store = _store(bucket, f"ri{next(_n)}")
    if s3_mode == "obstore":
        monkeypatch.setattr(store, "part_bytes", part_bytes)
    elif part_bytes != 8 << 20:
        pytest.skip("obstore's parts")
    store.set("blob", BLOB)
    store.set("empty", b"")
    bufs = [memoryview(bytearray(n)) for n in (1000, 5000, 100, 10, 10)]
    futs = store.read_into([("blob", 0, bufs[0]), ("blob", len(BLOB) - 3000, bufs[1]),
                            ("absent", 0, bufs[2]), ("blob", len(BLOB) + 5, bufs[3]), ("empty", 0, bufs[4])])
    got = [f.result(timeout=60) for f in futs]
    assert got == [1000, 3000, None, 0, 0]
    assert bytes(bufs[0]) == BLOB[:1000]
    assert bytes(bufs[1][:3000]) == BLOB[-3000:]  # the object ended first: a short read
    assert type(store).__name__ == ("ObstoreStore" if s3_mode == "obstore" else "S3Store")


def _joined(part: Any) -> bytes:
    """A part's bytes (one buffer, or a list of consecutive ones)."""
    return b"".join(bytes(c) for c in part) if isinstance(part, list) else bytes(part)


def test_read_parts_semantics(bucket: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """obstore's parts: in offset order, each its own request; short or empty past the end of
    the object, ``None`` for an absent one."""
    monkeypatch.setenv("OCDBT_PY_BACKEND", "obstore")
    store = _store(bucket, f"rp{next(_n)}")
    assert store.supports_read_parts
    monkeypatch.setattr(store, "request_bytes", 1000)
    store.set("blob", BLOB)
    parts = store.read_parts("blob", 500, 3700)
    assert [o for o, _ in parts] == [500, 1500, 2500, 3500]
    assert b"".join(_joined(f.result(timeout=60)) for _, f in parts) == BLOB[500:3700]
    tail = store.read_parts("blob", len(BLOB) - 1500, len(BLOB) + 2000)
    assert [len(_joined(f.result(timeout=60))) for _, f in tail] == [1000, 500, 0, 0]
    assert [f.result(timeout=60) for _, f in store.read_parts("absent", 0, 10)] == [None]
    with pytest.raises(ValueError):
        store.read_parts("blob", 10, 5)
    # requests of 1000 bytes handed over in pieces of 300 as they stream in
    monkeypatch.setattr(store, "piece_bytes", 300)
    parts = store.read_parts("blob", 500, 3700)
    assert [o for o, _ in parts] == [500, 800, 1100, 1400, 1500, 1800, 2100, 2400, 2500, 2800, 3100, 3400, 3500]
    assert b"".join(_joined(f.result(timeout=60)) for _, f in parts) == BLOB[500:3700]
    tail = store.read_parts("blob", len(BLOB) - 1500, len(BLOB) + 1000)
    assert b"".join(_joined(f.result(timeout=60)) for _, f in tail) == BLOB[-1500:]
    assert [len(_joined(f.result(timeout=60))) for _, f in tail][-4:] == [0, 0, 0, 0]


def test_large_chunks_stream_from_s3(bucket: servers.S3Server, monkeypatch: pytest.MonkeyPatch,
                                     tmp_path: Path) -> None:
    """Through obstore every chunk of 1.5 MiB is decoded from its pieces (200 KiB each, from
    requests of 512 KiB) as they arrive, and the restore equals the saved tree."""
    from ocdbt_py.kvstore.obstore_store import ObstoreStore
    from zarr3.codecs.chain import CodecChain

    monkeypatch.setenv("OCDBT_PY_BACKEND", "obstore")
    monkeypatch.setattr(ObstoreStore, "request_bytes", 512 << 10)
    monkeypatch.setattr(ObstoreStore, "piece_bytes", 200 << 10)
    rng = np.random.default_rng(8)
    tree = {f"w{i}": rng.standard_normal(3 << 18).astype(np.float32) for i in range(2)}
    checkpoint.save(tmp_path / "ck", tree, chunk_byte_size=3 << 19)
    url = _upload(bucket, tmp_path / "ck", f"stream{next(_n)}")
    streamed: list[int] = []
    real = CodecChain.decode_stream_into

    def spy(self: CodecChain, source: Any, out: np.ndarray) -> None:
        streamed.append(source.nbytes)
        real(self, source, out)

    monkeypatch.setattr(CodecChain, "decode_stream_into", spy)
    out = checkpoint.restore(url, storage_options=bucket.storage_options())
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v, err_msg=k)
    assert len(streamed) == 4 and min(streamed) > 1 << 20


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """600 arrays of 2 KiB (stored in data files, not inline) and a few multi-chunk ones."""
    rng = np.random.default_rng(5)
    tree = {f"l{i:03d}": rng.standard_normal(512).astype(np.float32) for i in range(600)}
    tree.update({f"big{i}": rng.standard_normal((64, 1000)).astype(np.float32) for i in range(3)})
    path = tmp_path_factory.mktemp("batching") / "ck"
    checkpoint.save(path, tree, chunk_byte_size=64 << 10)
    return path, tree


def _upload(srv: servers.S3Server, local: Path, name: str) -> str:
    url = f"s3://{BUCKET}/{name}"
    store = open_kvstore(url, srv.storage_options())
    for f in sorted(local.rglob("*")):
        if f.is_file():
            store.set(f.relative_to(local).as_posix(), f.read_bytes())
    return url


@pytest.fixture(scope="module")
def proxied(bucket: servers.S3Server, ckpt: tuple[Path, dict[str, np.ndarray]], s3_proxy: Any
            ) -> tuple[str, Any]:
    return _upload(bucket, ckpt[0], f"ck{next(_n)}"), s3_proxy(0.02)


def test_restore_coalesces_neighbouring_arrays_on_the_wire(
        bucket: servers.S3Server, ckpt: tuple[Path, dict[str, np.ndarray]], proxied: tuple[str, Any],
        s3_mode: str) -> None:
    url, proxy = proxied
    opts = dict(bucket.storage_options(), endpoint_url=proxy.endpoint)
    proxy.reset()
    out = checkpoint.restore(url, storage_options=opts)
    stats = proxy.stats()
    tree = ckpt[1]
    assert set(out) == set(tree)
    for k, v in tree.items():
        np.testing.assert_array_equal(out[k], v, err_msg=k)
    # 600 + 3 * 4 chunks: listing, metadata, manifest, B+tree, then a handful of range reads
    assert stats["requests"] <= 25, stats
    assert stats["depth"] <= 12, stats


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_http_server_ignoring_ranges_is_never_misread(tmp_path: Path, backend: str) -> None:
    """A server that ignores ``Range`` answers 200 with the whole object: the right bytes are
    cut out of it (or an error raised), never the whole body taken for the range."""
    (tmp_path / "f.bin").write_bytes(BLOB)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        store = open_kvstore(url, {"backend": backend})
        assert type(store).__name__ == ("ObstoreStore" if backend == "obstore" else "FsspecStore")
        assert store.get("f.bin", (10, 110)) == BLOB[10:110]
        assert store.get("f.bin", (0, 100)) == BLOB[:100]
        assert store.get("f.bin") == BLOB
        buf = memoryview(bytearray(100))
        if store.supports_read_into:
            assert store.read_into([("f.bin", 5, buf)])[0].result(timeout=60) == 100
            assert bytes(buf) == BLOB[5:105]
        if store.supports_read_parts:
            assert b"".join(_joined(f.result(timeout=60)) for _, f in store.read_parts("f.bin", 10, 110)) \
                == BLOB[10:110]
        assert store.get("absent") is None
    finally:
        server.shutdown()
        server.server_close()
