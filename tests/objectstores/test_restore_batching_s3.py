"""Checkpoint restores from S3 on the wire: ranged reads straight into buffers (threaded HTTP
and the S3 client's own path), chunks of neighbouring arrays merged into few GETs, and a
bounded number of round trips in sequence (a latency proxy counts every HTTP request)."""

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
from ocdbt_py.errors import StorageError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.rangeio import HttpRangeReader, HttpStatusError
from tests.objectstores import servers

BUCKET = "ocdbt-batching"
_n = itertools.count()
BLOB = bytes(range(256)) * 1024  # 256 KiB


@pytest.fixture(scope="module")
def bucket(s3_server: servers.S3Server) -> servers.S3Server:
    s3_server.make_bucket(BUCKET)
    return s3_server


@pytest.fixture(params=["threaded", "s3-client"])
def s3_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "s3-client":
        monkeypatch.setenv("OCDBT_PY_THREADED_HTTP", "0")
    return str(request.param)


def _store(srv: servers.S3Server, name: str, **opts: Any) -> Any:
    return open_kvstore(f"s3://{BUCKET}/{name}", dict(srv.storage_options(), **opts))


def test_read_into_semantics(bucket: servers.S3Server, s3_mode: str) -> None:
    store = _store(bucket, f"ri{next(_n)}")
    store.set("blob", BLOB)
    store.set("empty", b"")
    bufs = [memoryview(bytearray(n)) for n in (1000, 5000, 100, 10, 10)]
    futs = store.read_into([("blob", 0, bufs[0]), ("blob", len(BLOB) - 3000, bufs[1]),
                            ("absent", 0, bufs[2]), ("blob", len(BLOB) + 5, bufs[3]), ("empty", 0, bufs[4])])
    got = [f.result(timeout=60) for f in futs]
    assert got == [1000, 3000, None, 0, 0]
    assert bytes(bufs[0]) == BLOB[:1000]
    assert bytes(bufs[1][:3000]) == BLOB[-3000:]  # the object ended first: a short read
    assert (store._threaded_reader() is not None) == (s3_mode == "threaded")


def test_threaded_path_falls_back_when_refused(bucket: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A presigned request the server refuses (403) is retried through the S3 client, and the
    store stops using the threaded path."""
    store = _store(bucket, f"fb{next(_n)}")
    store.set("blob", BLOB)
    reader = store._threaded_reader()
    assert reader is not None

    def refuse(url: str, start: int, buf: memoryview, headers: Any = None) -> int:
        raise HttpStatusError(403, "Forbidden", b"<Error>SignatureDoesNotMatch</Error>")

    monkeypatch.setattr(reader, "read_into", refuse)
    buf = memoryview(bytearray(4096))
    assert store.read_into([("blob", 100, buf)])[0].result(timeout=60) == 4096
    assert bytes(buf) == BLOB[100:4196]
    assert store._http_state is False


def test_threaded_errors_name_the_key_not_the_url(bucket: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(bucket, f"err{next(_n)}")
    store.set("blob", BLOB)
    reader = store._threaded_reader()

    def fail(url: str, start: int, buf: memoryview, headers: Any = None) -> int:
        raise HttpStatusError(500, "Internal Server Error", b"oops")

    monkeypatch.setattr(reader, "read_into", fail)
    with pytest.raises(StorageError, match="blob") as ei:
        store.read_into([("blob", 0, memoryview(bytearray(10)))])[0].result(timeout=60)
    assert "X-Amz-Signature" not in str(ei.value)


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


def test_http_range_reader_statuses(tmp_path: Path) -> None:
    from tests.servers.http_server import serve_directory

    (tmp_path / "f.bin").write_bytes(BLOB)
    reader = HttpRangeReader(2)
    try:
        with serve_directory(str(tmp_path)) as base:
            buf = memoryview(bytearray(300))
            assert reader.submit(f"{base}/f.bin", 1000, buf).result(timeout=30) == 300
            assert bytes(buf) == BLOB[1000:1300]
            assert reader.read_into(f"{base}/absent", 0, buf) is None
            assert reader.read_into(f"{base}/f.bin", len(BLOB) + 10, buf) == 0
            tail = memoryview(bytearray(500))
            assert reader.read_into(f"{base}/f.bin", len(BLOB) - 200, tail) == 200
            assert bytes(tail[:200]) == BLOB[-200:]
            assert reader.read_into(f"{base}/f.bin", 0, memoryview(bytearray(0))) == 0
    finally:
        reader.close()


def test_http_range_reader_rejects_an_ignored_range(tmp_path: Path) -> None:
    """A server that ignores ``Range`` answers 200 with the whole object: never misread as the
    requested bytes."""
    (tmp_path / "f.bin").write_bytes(BLOB)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    reader = HttpRangeReader(1)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/f.bin"
        with pytest.raises(HttpStatusError):
            reader.read_into(url, 10, memoryview(bytearray(100)))
        with pytest.raises(HttpStatusError):  # from 0, but the body is longer than asked for
            reader.read_into(url, 0, memoryview(bytearray(100)))
        whole = memoryview(bytearray(len(BLOB)))
        assert reader.read_into(url, 0, whole) == len(BLOB) and bytes(whole) == BLOB
    finally:
        reader.close()
        server.shutdown()
        server.server_close()
