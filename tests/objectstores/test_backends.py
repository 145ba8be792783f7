"""The shared KvStore suite (conditional-write race included) against real S3, GCS and Azure
servers on 127.0.0.1, plus backend-specific behaviour: dispatch, credentials from the
environment, errors that never show a credential."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ocdbt_py.errors import ConditionFailedError, StorageError
from ocdbt_py.kvstore import KvStore, open_kvstore
from ocdbt_py.kvstore.azure import AzureStore
from ocdbt_py.kvstore.gcs import GcsStore
from ocdbt_py.kvstore.obstore_store import ObstoreStore
from ocdbt_py.kvstore.s3 import S3Store
from ocdbt_py.testing import ReadOnlyStoreTests, StoreTests
from tests.objectstores import servers
from tests.objectstores.conftest import serve_with_bucket

_n = itertools.count()
BUCKET = "ocdbt-kv"


@pytest.fixture(scope="module")
def s3(s3_server: servers.S3Server) -> servers.S3Server:
    s3_server.make_bucket(BUCKET)
    return s3_server


@pytest.fixture(scope="module")
def gcs(gcs_server: servers.GcsServer) -> servers.GcsServer:
    gcs_server.make_bucket(BUCKET)
    return gcs_server


@pytest.fixture(scope="module")
def azure(azure_server: servers.AzureServer) -> servers.AzureServer:
    azure_server.make_container(BUCKET)
    return azure_server


#: the two routes of every object-store URL: obstore, and the fsspec clients (s3fs, gcsfs, adlfs)
BACKENDS = {"obstore": ObstoreStore, "fsspec": (S3Store, GcsStore, AzureStore)}


def opened(url: str, options: dict[str, Any], backend: str) -> KvStore:
    """``url`` opened through ``backend`` (checked: the route taken is that one)."""
    s = open_kvstore(url, {**options, "backend": backend})
    assert isinstance(s, BACKENDS[backend]), (backend, type(s))
    return s


class _Suite(StoreTests):
    scheme = ""
    backend = "obstore"

    def make_empty(self) -> KvStore:
        return opened(f"{self.scheme}://{BUCKET}/t{next(_n)}", self.srv.storage_options(), self.backend)


class TestS3Store(_Suite):
    scheme = "s3"

    @pytest.fixture(autouse=True)
    def _srv(self, s3: servers.S3Server) -> None:
        self.srv = s3

    def test_etag_is_the_generation(self, store: KvStore) -> None:
        g = store.set_if("m", b"v", if_generation=None)
        assert g.startswith('"') and store.get_with_generation("m") == (b"v", g)


class TestS3StoreFsspec(TestS3Store):
    """The same suite through s3fs/botocore (users without obstore, or ``backend="fsspec"``)."""

    backend = "fsspec"


class TestGcsStoreFsspec(_Suite):
    """GCS writes through gcsfs.  (obstore writes through GCS's XML API, which fake-gcs-server
    lacks: its reads are tested by :class:`TestGcsObstoreReads`.)"""

    scheme = "gs"
    backend = "fsspec"

    @pytest.fixture(autouse=True)
    def _srv(self, gcs: servers.GcsServer) -> None:
        self.srv = gcs

    def test_generation_changes_even_for_equal_content(self, store: KvStore) -> None:
        g1 = store.set_if("m", b"same", if_generation=None)
        g2 = store.set_if("m", b"same", if_generation=g1)
        assert g1 != g2
        with pytest.raises(ConditionFailedError):
            store.set_if("m", b"same", if_generation=g1)


class TestGcsObstoreReads(ReadOnlyStoreTests):
    """Reads, listings and ranges through obstore against fake-gcs-server (seeded by gcsfs)."""

    expect_read_only = False

    @pytest.fixture(autouse=True)
    def _srv(self, gcs: servers.GcsServer) -> None:
        self.srv = gcs

    def make_store(self, seed: dict[str, bytes]) -> KvStore:
        url = f"gs://{BUCKET}/r{next(_n)}"
        writer = opened(url, self.srv.storage_options(), "fsspec")
        for k, v in seed.items():
            writer.set(k, v)
        return opened(url, self.srv.storage_options(), "obstore")

    def test_emulator_is_not_taken_automatically(self) -> None:
        s = open_kvstore(f"gs://{BUCKET}/auto", self.srv.storage_options())
        assert isinstance(s, GcsStore)  # obstore's writes could not reach this server


class TestAzureStore(_Suite):
    scheme = "az"

    @pytest.fixture(autouse=True)
    def _srv(self, azure: servers.AzureServer) -> None:
        self.srv = azure

    def test_etag_changes_even_for_equal_content(self, store: KvStore) -> None:
        g1 = store.set_if("m", b"same", if_generation=None)
        g2 = store.set_if("m", b"same", if_generation=g1)
        assert g1 != g2
        with pytest.raises(ConditionFailedError):
            store.set_if("m", b"same", if_generation=g1)


class TestAzureStoreFsspec(TestAzureStore):
    """The same suite through adlfs."""

    backend = "fsspec"


# -- configuration through the environment -----------------------------------------------------
@pytest.mark.parametrize("kind,backend", [("s3", "obstore"), ("s3", "fsspec"), ("gcs", "fsspec"),
                                          ("azure", "obstore"), ("azure", "fsspec")])
def test_configured_by_environment_only(
    kind: str, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv: Any = request.getfixturevalue(kind)
    for k, v in srv.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("OCDBT_PY_BACKEND", backend)
    scheme = {"s3": "s3", "gcs": "gs", "azure": "az"}[kind]
    url = f"{scheme}://{BUCKET}/env{next(_n)}"
    store = open_kvstore(url)
    assert isinstance(store, BACKENDS[backend])
    store.set("k", b"v")
    assert store.get("k") == b"v"
    g = store.set_if("c", b"1", if_generation=None)
    with pytest.raises(ConditionFailedError):
        store.set_if("c", b"1", if_generation=None)
    assert store.get_with_generation("c") == (b"1", g)


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_read_only_open(s3: servers.S3Server, backend: str) -> None:
    url = f"s3://{BUCKET}/ro{next(_n)}"
    opened(url, s3.storage_options(), backend).set("k", b"v")
    ro = open_kvstore(url, {**s3.storage_options(), "backend": backend}, read_only=True)
    assert ro.read_only and ro.get("k") == b"v"
    from ocdbt_py.errors import ReadOnlyError

    with pytest.raises(ReadOnlyError):
        ro.set_if("k", b"w", if_generation=None)


# -- errors name the URL, never a credential -------------------------------------------------------
@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_unreachable_s3_error_names_url_not_secret(backend: str) -> None:
    secret = "SuperSecretValue-1234567890"
    opts = {
        "key": "AKIDEXAMPLEKEY123",
        "secret": secret,
        "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }
    if backend == "fsspec":
        opts["retries"] = 1
    store = opened("s3://no-such-bucket/x", opts, backend)
    for op in (lambda: store.get("k"), lambda: store.set("k", b"v"), lambda: store.get_with_generation("k")):
        with pytest.raises(StorageError) as ei:
            op()
        msg = str(ei.value)
        assert "s3://no-such-bucket/x" in msg
        assert secret not in msg and "AKIDEXAMPLEKEY123" not in msg


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_azure_bad_key_error_hides_key(azure: servers.AzureServer, backend: str) -> None:
    wrong = servers.AZURITE_KEY[:-8] + "AAAAAAA="
    conn = azure.connection_string.replace(servers.AZURITE_KEY, wrong)
    store = opened(f"az://{BUCKET}/bad{next(_n)}", {"connection_string": conn}, backend)
    with pytest.raises(StorageError) as ei:
        store.set_if("k", b"v", if_generation=None)
    msg = str(ei.value)
    assert f"az://{BUCKET}/bad" in msg
    assert wrong not in msg and wrong[:20] not in msg


def test_gcs_emulator_class_is_plain_gcsfs(gcs: servers.GcsServer) -> None:
    import gcsfs.core

    store = opened(f"gs://{BUCKET}/cls", gcs.storage_options(), "fsspec")
    assert type(store.fs) is gcsfs.core.GCSFileSystem  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def s3_fast_ranges() -> Any:
    """The benchmark's variant of the S3 server (ranged GETs read only their range)."""
    yield from serve_with_bucket(lambda: servers.start_s3(fast_ranges=True), BUCKET)


class TestS3FastRangesServer(ReadOnlyStoreTests):
    """Reads against the benchmark's patched server behave exactly as against stock moto."""

    expect_read_only = False
    backend = "obstore"

    @pytest.fixture(autouse=True)
    def _srv(self, s3_fast_ranges: Any) -> None:
        self.srv = s3_fast_ranges

    def make_store(self, seed: dict[str, bytes]) -> KvStore:
        s = opened(f"s3://{BUCKET}/fr{next(_n)}", self.srv.storage_options(), self.backend)
        for k, v in seed.items():
            s.set(k, v)
        return s

    def test_ranges_match_stock_server(self, s3: servers.S3Server) -> None:
        big = bytes(range(256)) * 4096
        stores = [opened(f"s3://{BUCKET}/cmp{next(_n)}", srv.storage_options(), self.backend)
                  for srv in (s3, self.srv)]
        for st in stores:
            st.set("k", big)
            st.set("empty", b"")
        ranges = [(0, 1), (5, 5000), (len(big) - 3, len(big) + 10), (len(big), None), (-100, None),
                  (-(len(big) + 5), None), (100, None), None]
        for key in ("k", "empty"):
            got = [[st.get(key, r) for r in ranges] for st in stores]
            assert got[0] == got[1]


class TestS3FastRangesServerFsspec(TestS3FastRangesServer):
    backend = "fsspec"


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_url_must_name_a_bucket(backend: str) -> None:
    from ocdbt_py.errors import InvalidKeyError

    with pytest.raises(InvalidKeyError):
        open_kvstore("s3://", {"anon": True, "backend": backend})


def test_redaction_of_secrets() -> None:
    from ocdbt_py.kvstore.object_store import redact

    text = ("failed for DefaultEndpointsProtocol=http;AccountName=a;AccountKey=c2VjcmV0a2V5;BlobEndpoint=x "
            "at https://h/o?sig=abcdef123&X-Amz-Signature=ffff00&x=1 with token tok-1234567890")
    out = redact(text, ["tok-1234567890", "short"])
    assert "c2VjcmV0a2V5" not in out and "abcdef123" not in out and "ffff00" not in out
    assert "tok-1234567890" not in out and "x=1" in out and "AccountName=a" in out
