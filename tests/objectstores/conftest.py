"""Session-scoped object-store servers on 127.0.0.1, started on first use and always stopped,
and latency proxies in front of the S3 server (one per delay, shared by the modules that
count requests; each test resets the counters it reads).

A server that cannot start fails the tests that need it (with its log), never skips them,
with one exception: without Node.js/npm (which the README names as optional) and without an
azurite installed some other way, the Azure tests skip and say so.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.objectstores import servers

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def serve_with_bucket(start: Callable[[], Any], bucket: str) -> Iterator[Any]:
    """For a module's own server fixture: start a server (a failure to start fails the test,
    with the server's log), make ``bucket`` on it, yield it, and always stop it."""
    for srv in _serve(start):
        srv.make_bucket(bucket)
        yield srv


def _serve(start: Callable[[], Any]) -> Iterator[Any]:
    error = None
    try:
        srv = start()
    except servers.ServerStartError as e:
        error = str(e)
    if error is not None:
        pytest.fail(error, pytrace=False)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[servers.S3Server]:
    yield from _serve(servers.start_s3)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[servers.GcsServer]:
    yield from _serve(servers.start_gcs)


def skip_without_node() -> None:
    """Skip when azurite is not installed and cannot be (no Node.js/npm on this machine)."""
    try:
        servers.azurite_binary()
    except servers.ServerStartError:
        if shutil.which("npm") is None or shutil.which("node") is None:
            pytest.skip("the Azure tests need azurite, which needs Node.js >= 18 and npm (not found here): "
                        "install them and rerun `make test`")


@pytest.fixture(scope="session")
def azure_server() -> Iterator[servers.AzureServer]:
    skip_without_node()
    yield from _serve(servers.start_azure)


@pytest.fixture(scope="session")
def s3_proxy(s3_server: servers.S3Server) -> Iterator[Callable[[float], Any]]:
    """``s3_proxy(delay)``: the latency proxy adding ``delay`` seconds per request in front of
    the session's S3 server (started on first use, stopped at the end of the session)."""
    from tests.objectstores.latency_proxy import start_proxy

    proxies: dict[float, Any] = {}

    def get(delay: float) -> Any:
        if delay not in proxies:
            try:
                proxies[delay] = start_proxy(s3_server.endpoint, delay)
            except servers.ServerStartError as e:
                pytest.fail(str(e), pytrace=False)
        return proxies[delay]

    try:
        yield get
    finally:
        for p in proxies.values():
            p.stop()
