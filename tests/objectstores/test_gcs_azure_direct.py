"""Our own GCS (JSON API) and Azure (Blob REST, Shared Key / SAS) reads, against the emulators.

The backend suites in ``test_backends.py`` run every store operation both through these
direct readers and through gcsfs/adlfs; here: that azurite really checks our signatures (a
wrong key is refused, so a right one proves the signing), SAS tokens, listings past one page,
the configurations that must keep the library, and a bearer token reaching the wire.
"""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.azure import AzureStore
from ocdbt_py.kvstore.azuredirect import AzureDirect, parse_connection_string
from ocdbt_py.kvstore.direct import Fallback, reader_for
from ocdbt_py.kvstore.gcs import GcsStore
from ocdbt_py.kvstore.gcsdirect import GcsDirect
from tests.objectstores import servers

CONTAINER = "direct-reads"


@pytest.fixture(scope="module")
def azure(azure_server: servers.AzureServer) -> servers.AzureServer:
    azure_server.make_container(CONTAINER)
    return azure_server


@pytest.fixture(scope="module")
def gcs(gcs_server: servers.GcsServer) -> servers.GcsServer:
    gcs_server.make_bucket(CONTAINER)
    return gcs_server


def _direct(azure: servers.AzureServer, **kw: Any) -> AzureDirect:
    cs = parse_connection_string(azure.connection_string)
    return AzureDirect(reader_for(None), cs["BlobEndpoint"], cs["AccountName"], **kw)


def test_azurite_refuses_a_wrong_key_and_accepts_ours(azure: servers.AzureServer) -> None:
    store = open_kvstore(f"az://{CONTAINER}/sig", azure.storage_options())
    store.set("k/v", b"0123456789")
    good = _direct(azure, key=base64.b64decode(servers.AZURITE_KEY))
    assert good.get(CONTAINER, "sig/k/v", 2, 5, max_body=100) == b"234"
    assert good.head(CONTAINER, "sig/k/v") == 10
    assert good.get(CONTAINER, "sig/absent", 0, None, max_body=100) is None
    buf = bytearray(4)
    assert good.read_into(CONTAINER, "sig/k/v", 6, memoryview(buf)) == 4 and bytes(buf) == b"6789"
    bad = _direct(azure, key=b"not the account key")
    with pytest.raises(Fallback, match="403"):
        bad.get(CONTAINER, "sig/k/v", 0, None, max_body=1 << 20)


def test_sas_connection_string(azure: servers.AzureServer) -> None:
    import datetime

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    writer = open_kvstore(f"az://{CONTAINER}/sas", azure.storage_options())
    writer.set("a", b"alpha")
    sas = generate_container_sas(
        servers.AZURITE_ACCOUNT, CONTAINER, account_key=servers.AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    cs = f"BlobEndpoint={azure.endpoint}/{servers.AZURITE_ACCOUNT};SharedAccessSignature={sas}"
    store = open_kvstore(f"az://{CONTAINER}/sas", {"connection_string": cs}, read_only=True)
    assert isinstance(store, AzureStore) and store._direct is not None
    assert store.get("a") == b"alpha" and list(store.list()) == ["a"]
    assert store._direct is not None  # answered by us, not by adlfs


def test_listing_follows_pages(azure: servers.AzureServer, gcs: servers.GcsServer) -> None:
    for kind, url, opts in (("az", f"az://{CONTAINER}/pages", azure.storage_options()),
                            ("gs", f"gs://{CONTAINER}/pages", gcs.storage_options())):
        store = open_kvstore(url, opts)
        names = [f"d/{i:03d}" for i in range(23)]
        for n in names:
            store.set(n, n.encode())
        direct: Any = store._direct  # type: ignore[attr-defined]
        assert direct is not None, kind
        direct.page_size = 5
        assert list(store.list("d/")) == names
        assert [s for _, s in store.list_sized("d/")] == [5] * 23
        assert store._direct is not None, kind  # type: ignore[attr-defined]


def test_configurations_that_keep_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = {"connection_string": "AccountName=acct;AccountKey=" + base64.b64encode(b"k").decode()}
    assert AzureDirect.from_options(ok, reader_for, env={}) is not None
    assert AzureDirect.from_options(ok, reader_for, env={"HTTPS_PROXY": "http://p"}) is None
    assert AzureDirect.from_options(ok, reader_for, env={"OCDBT_PY_AZURE_OWN_HTTP": "0"}) is None
    assert AzureDirect.from_options({**ok, "credential": object()}, reader_for, env={}) is None
    assert AzureDirect.from_options({"connection_string": "AccountName=a;AccountKey=@@@"}, reader_for, env={}) is None
    assert AzureDirect.from_options({"account_name": "acct"}, reader_for, env={}) is None  # anonymous: adlfs
    assert AzureDirect.from_options({"account_name": "acct", "sas_token": "sv=1&sig=x"}, reader_for, env={}) is not None
    d = AzureDirect.from_options({}, reader_for, env={"AZURE_STORAGE_ACCOUNT_NAME": "acct",
                                                      "AZURE_STORAGE_ACCOUNT_KEY": base64.b64encode(b"k").decode()})
    assert d is not None and d.endpoint == "https://acct.blob.core.windows.net"


class _Fs:
    """A stand-in for gcsfs's filesystem object: only the attributes GcsDirect reads."""

    def __init__(self, location: str, creds: Any, **extra: Any):
        self._location = location
        self.credentials = creds
        self.__dict__.update(extra)


class _Creds:
    method = "token"
    credentials = object()

    @staticmethod
    def apply(headers: dict[str, str]) -> None:
        headers["authorization"] = "Bearer test-token"


@pytest.fixture
def capture() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b"abc"
            self.send_response(206)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def test_gcs_bearer_token_reaches_the_wire(capture: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = capture
    d = GcsDirect.from_fs(_Fs(url, _Creds()), {"token": "x"}, reader_for, env={})
    assert d is not None
    assert d.get("b", "o/n", 1, 4, max_body=100) == b"abc"
    assert seen[-1]["authorization"] == "Bearer test-token" and seen[-1]["range"] == "bytes=1-3"
    assert GcsDirect.from_fs(_Fs(url, _Creds(), requester_pays=True), {}, reader_for, env={}) is None
    assert GcsDirect.from_fs(_Fs(url, _Creds()), {"session_kwargs": {}}, reader_for, env={}) is None
    assert GcsDirect.from_fs(_Fs(url, _Creds()), {}, reader_for, env={"OCDBT_PY_GCS_OWN_HTTP": "0"}) is None


def test_gcs_emulator_reads_are_ours(gcs: servers.GcsServer) -> None:
    store = open_kvstore(f"gs://{CONTAINER}/mine", gcs.storage_options())
    assert isinstance(store, GcsStore) and store._direct is not None
    store.set("x", bytes(range(256)) * 40)
    assert store.get("x", (100, 110)) == bytes(range(100, 110))
    assert store.size("x") == 10240
    assert store.get("nope") is None
    assert store._direct is not None
