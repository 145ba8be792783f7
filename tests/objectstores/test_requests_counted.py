"""Requests counted on the wire: batch reads through the object-store backends are coalesced
and concurrent (a latency proxy in front of the S3 server counts every HTTP request)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from ocdbt_py.kvstore import open_kvstore
from tests.objectstores import servers
from tests.objectstores.latency_proxy import ProxyHandle

_n = itertools.count()
BUCKET = "ocdbt-count"
DELAY = 0.05
BLOB = bytes(range(256)) * 256  # 64 KiB


@pytest.fixture(scope="module")
def proxy(s3_server: servers.S3Server, s3_proxy: Any) -> ProxyHandle:
    s3_server.make_bucket(BUCKET)
    return s3_proxy(DELAY)  # type: ignore[no-any-return]


def _opts(s3_server: servers.S3Server, proxy: ProxyHandle) -> dict:
    return dict(s3_server.storage_options(), endpoint_url=proxy.endpoint)


def test_ranges_of_one_object_become_one_request(s3_server: servers.S3Server, proxy: ProxyHandle) -> None:
    store = open_kvstore(f"s3://{BUCKET}/one{next(_n)}", _opts(s3_server, proxy))
    store.set("blob", BLOB)
    reqs = [("blob", (i * 200, i * 200 + 150)) for i in range(300)]
    proxy.reset()
    got = store.get_many(reqs)
    stats = proxy.stats()
    assert got == [BLOB[a:b] for _, (a, b) in reqs]
    assert stats["requests"] == 1, stats


def test_many_objects_fetched_concurrently(s3_server: servers.S3Server, proxy: ProxyHandle) -> None:
    store = open_kvstore(f"s3://{BUCKET}/many{next(_n)}", _opts(s3_server, proxy))
    for i in range(40):
        store.set(f"o{i}", BLOB[: 100 + i])
    proxy.reset()
    t = time.perf_counter()
    got = store.get_many([f"o{i}" for i in range(40)] + [("o3", (0, 10)), "absent"])
    elapsed = time.perf_counter() - t
    stats = proxy.stats()
    assert got[:40] == [BLOB[: 100 + i] for i in range(40)] and got[40] == BLOB[:10] and got[41] is None
    assert stats["requests"] == 41, stats  # o3's range rides on the whole read of o3
    assert stats["depth"] <= 2, stats  # all in flight together, not 41 round trips
    assert elapsed < 20 * DELAY


def test_http_backend_coalesces_too(tmp_path: Path) -> None:
    from tests.servers.http_server import RangeHandler, serve_directory

    (tmp_path / "data.bin").write_bytes(BLOB)
    with serve_directory(str(tmp_path)) as url:
        store = open_kvstore(url)
        reqs = [("data.bin", (i * 1000, i * 1000 + 10)) for i in range(50)]
        before = RangeHandler.requests_seen
        assert store.get_many(reqs) == [BLOB[a:b] for _, (a, b) in reqs]
        assert RangeHandler.requests_seen - before <= 2  # one ranged GET (+ a HEAD at most)


def test_proxy_passes_heads_and_large_bodies(s3_server: servers.S3Server, proxy: ProxyHandle) -> None:
    store = open_kvstore(f"s3://{BUCKET}/head{next(_n)}", _opts(s3_server, proxy))
    big = BLOB * 64  # 4 MiB: streamed through the proxy
    store.set("big", big)
    assert store.size("big") == len(big) and store.size("absent") is None
    assert store.get("big") == big and store.get("big", (-10, None)) == big[-10:]
