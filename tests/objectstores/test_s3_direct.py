"""S3 reads signed by us (ocdbt_py.kvstore.s3direct): when they are used, that a real server
accepts their signatures (moto with IAM authentication on), and that anything unexpected falls
back to s3fs with the same results."""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.layout import Listing
from ocdbt_py.errors import StorageError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.s3 import S3Store
from ocdbt_py.kvstore.s3direct import S3Direct
from ocdbt_py.kvstore.sigv4 import Credentials
from tests.objectstores import servers
from tests.objectstores.conftest import serve_with_bucket

BUCKET = "ocdbt-direct"
_n = itertools.count()
NAMES = ["plain", "a b", "plus+sign", "pct%41", "uni/ü€😀", "deep/er/key", "q?x=1&y", "tilde~_-.ok"]


def _direct_of(store: Any) -> S3Direct | None:
    assert isinstance(store, S3Store)
    return store._direct


# -- configuration: when the direct path is used ---------------------------------------------------
def _from(opts: dict[str, Any], env: dict[str, str] | None = None) -> S3Direct | None:
    return S3Direct.from_options(opts, lambda verify: ("reader", verify), env=env or {"HOME": "/nonexistent"})


def test_direct_for_static_credentials_and_endpoint() -> None:
    d = _from({"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9000"})
    assert d is not None and d.creds is not None and d.region == "us-east-1"
    assert d.object_url("bkt", "a b/c+d") == "http://127.0.0.1:9000/bkt/a%20b/c%2Bd"
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
           "AWS_ENDPOINT_URL_S3": "http://minio:9000", "AWS_DEFAULT_REGION": "eu-west-3", "HOME": "/nonexistent"}
    d = _from({}, env)
    assert d is not None and d.creds is not None and d.creds.token == "t" and d.region == "eu-west-3"
    d = _from({"anon": True, "endpoint_url": "https://objects.example.org",
               "config_kwargs": {"s3": {"addressing_style": "virtual"}}})
    assert d is not None and d.creds is None
    assert d.object_url("my-bucket", "k") == "https://my-bucket.objects.example.org/k"


def test_direct_for_aws_needs_a_region_and_no_config_file(tmp_path: Path) -> None:
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "HOME": str(tmp_path)}
    assert _from({}, env) is None  # AWS without a region: botocore finds the bucket's region
    d = _from({"client_kwargs": {"region_name": "us-west-2"}}, env)
    assert d is not None
    assert d.object_url("my-bucket", "x/y") == "https://my-bucket.s3.us-west-2.amazonaws.com/x/y"
    assert d.object_url("dotted.bucket", "x") == "https://s3.us-west-2.amazonaws.com/dotted.bucket/x"
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nregion = us-west-2\n")
    assert _from({"client_kwargs": {"region_name": "us-west-2"}}, env) is None


@pytest.mark.parametrize("opts,env", [
    ({"endpoint_url": "http://h:1"}, {}),  # no static credentials: botocore's resolver
    ({"profile": "dev", "endpoint_url": "http://h:1"}, {}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1", "requester_pays": True}, {}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1", "s3_additional_kwargs": {"SSECustomerKey": "x"}}, {}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1", "config_kwargs": {"signature_version": "s3"}}, {}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1", "config_kwargs": {"proxies": {"http": "p"}}}, {}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1"}, {"AWS_PROFILE": "dev"}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1"}, {"HTTPS_PROXY": "http://proxy:3128"}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1"}, {"OCDBT_PY_S3_OWN_SIGNING": "0"}),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1"}, {"OCDBT_PY_THREADED_HTTP": "0"}),
    ({"key": "k", "endpoint_url": "http://h:1"}, {}),  # half the credentials
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1/sub/path"}, {}),
    ({"key": "k", "secret": "s", "endpoint_url": "ftp://h:1"}, {}),
])
def test_botocore_where_we_do_not_know(opts: dict[str, Any], env: dict[str, str]) -> None:
    assert _from(opts, dict(env, HOME="/nonexistent")) is None


# -- a server that checks every signature ---------------------------------------------------------
@pytest.fixture(scope="module")
def auth_server() -> Iterator[tuple[servers.S3Server, dict[str, Any]]]:
    """A dedicated moto server with an IAM user allowed s3:*, then IAM authentication switched
    on: every request must carry a valid SigV4 signature of that user's key."""
    import botocore.session

    try:
        srv = servers.start_s3()
    except servers.ServerStartError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        kw = dict(endpoint_url=srv.endpoint, region_name="us-east-1", aws_access_key_id="setup",
                  aws_secret_access_key="setup")
        sess = botocore.session.get_session()
        iam = sess.create_client("iam", **kw)
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        s3 = sess.create_client("s3", **kw)
        s3.create_bucket(Bucket=BUCKET)
        for i, name in enumerate(NAMES):
            s3.put_object(Bucket=BUCKET, Key=f"d/{name}", Body=bytes([i]) * (100 + i))
        req = urllib.request.Request(srv.endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        assert json.loads(urllib.request.urlopen(req, timeout=30).read())["status"] == "ok"
        opts = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"], "endpoint_url": srv.endpoint,
                "client_kwargs": {"region_name": "us-east-1"}}
        yield srv, opts
    finally:
        srv.stop()


def test_server_accepts_our_signatures(auth_server: tuple[servers.S3Server, dict[str, Any]]) -> None:
    _, opts = auth_server
    store = open_kvstore(f"s3://{BUCKET}/d", dict(opts, skip_instance_cache=True))
    assert _direct_of(store) is not None
    assert list(store.list()) == sorted(NAMES, key=lambda s: s.encode())
    for i, name in enumerate(NAMES):
        assert store.get(name) == bytes([i]) * (100 + i), name
        assert store.get(name, (3, 7)) == bytes([i]) * 4
        assert store.size(name) == 100 + i
    assert store.get("absent") is None and store.size("absent") is None
    assert list(store.list("uni/")) == ["uni/ü€😀"]
    assert _direct_of(store) is not None  # nothing was refused: every signature checked out
    assert isinstance(store, S3Store) and store.fs._s3 is None  # botocore's client was never built


def test_refused_signature_is_an_error_without_secrets(auth_server: tuple[servers.S3Server, dict[str, Any]]) -> None:
    _, opts = auth_server
    bad = dict(opts, secret="not-the-secret-" + opts["secret"][:4])
    store = open_kvstore(f"s3://{BUCKET}/d", bad)
    with pytest.raises(StorageError) as ei:
        store.get("plain")
    assert bad["secret"] not in str(ei.value) and "X-Amz-Signature" not in str(ei.value)
    assert _direct_of(store) is None  # fell back to s3fs, which reports the refusal


def test_unexpected_answer_falls_back_to_s3fs(auth_server: tuple[servers.S3Server, dict[str, Any]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _, opts = auth_server
    store = open_kvstore(f"s3://{BUCKET}/d", opts)
    direct = _direct_of(store)
    assert direct is not None
    # sign with a wrong secret: the server refuses, s3fs (right secret) then answers
    monkeypatch.setattr(direct, "creds", Credentials(opts["key"], "wrong-secret"))
    assert store.get("plain") == bytes([0]) * 100
    assert _direct_of(store) is None
    assert sorted(store.list()) == sorted(NAMES)


# -- the ordinary test server: listings, restores -----------------------------------------------
@pytest.fixture(scope="module")
def s3(s3_server: servers.S3Server) -> servers.S3Server:
    s3_server.make_bucket(BUCKET)
    return s3_server


def test_listing_follows_continuation_pages(s3: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    root = f"{BUCKET}/many{next(_n)}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
    fs.pipe({f"{root}/k {i:03d}+": b"x" * i for i in range(123)})
    monkeypatch.setattr(S3Direct, "page_keys", 10)  # 13 pages
    store = open_kvstore(f"s3://{root}", s3.storage_options())
    assert list(store.list()) == [f"k {i:03d}+" for i in range(123)]
    assert _direct_of(store) is not None
    assert Listing.of(store).sizes == {f"k {i:03d}+": i for i in range(123)}


def test_restore_never_builds_the_botocore_client(s3: servers.S3Server, tmp_path: Path) -> None:
    tree = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64), "b": np.ones(7, np.int16), "step": 3}
    url = f"s3://{BUCKET}/ckpt{next(_n)}"
    checkpoint.save(url, tree, storage_options=s3.storage_options())
    store_opts = s3.storage_options()
    got = checkpoint.restore(url, storage_options=store_opts)
    np.testing.assert_array_equal(got["w"], tree["w"])
    np.testing.assert_array_equal(got["b"], tree["b"])
    assert got["step"] == 3
    # a fresh store for the restore: s3fs caches filesystem instances, so look at the one used
    store = open_kvstore(url, dict(store_opts, skip_instance_cache=True))
    assert _direct_of(store) is not None
    assert checkpoint.restore(store)["step"] == 3
    assert isinstance(store, S3Store) and store.fs._s3 is None


# -- HTTPS -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.S3Server]:
    """moto over HTTPS with a self-signed certificate for 127.0.0.1."""
    cert, key = servers.self_signed_cert(str(tmp_path_factory.mktemp("tls")))
    yield from serve_with_bucket(lambda: servers.start_s3(tls=(cert, key)), BUCKET)


@pytest.mark.parametrize("own_signing", [True, False])
def test_https_with_the_servers_ca(tls_server: servers.S3Server, monkeypatch: pytest.MonkeyPatch,
                                   own_signing: bool) -> None:
    if not own_signing:
        monkeypatch.setenv("OCDBT_PY_S3_OWN_SIGNING", "0")
    url = f"s3://{BUCKET}/tls{next(_n)}"
    tree = {"w": np.arange(3000, dtype=np.float32), "s": 5}
    opts = dict(tls_server.storage_options(), skip_instance_cache=True)
    checkpoint.save(url, tree, storage_options=opts)
    store = open_kvstore(url, opts)
    assert (_direct_of(store) is not None) == own_signing
    assert "manifest.ocdbt" in list(store.list())
    got = checkpoint.restore(url, storage_options=opts)
    np.testing.assert_array_equal(got["w"], tree["w"])
    buf = bytearray(10)
    data_file = next(k for k in store.list() if k.startswith("d/"))
    assert store.read_into([(data_file, 0, memoryview(buf))])[0].result() == 10  # threaded reads, TLS
    assert (_direct_of(store) is not None) == own_signing


def test_https_refuses_an_untrusted_certificate(tls_server: servers.S3Server, monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/untrusted{next(_n)}"
    open_kvstore(url, tls_server.storage_options()).set("k", b"v")
    other_ca, _ = servers.self_signed_cert(str(tmp_path))  # a CA that did not sign the server's
    opts = tls_server.storage_options()
    opts["client_kwargs"] = dict(opts["client_kwargs"], verify=other_ca)
    opts["skip_instance_cache"] = True
    store = open_kvstore(url, opts)
    assert _direct_of(store) is not None
    with pytest.raises(StorageError, match="(?i)certificate|ssl"):
        store.get("k")
    with pytest.raises(StorageError):
        list(store.list())
    # never retried without verification: verify=False is the only way to skip it
    opts["client_kwargs"] = dict(opts["client_kwargs"], verify=False)
    assert open_kvstore(url, opts).get("k") == b"v"


def test_a_dropped_connection_is_retried_through_s3fs(s3: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    from ocdbt_py.kvstore import rangeio

    url = f"s3://{BUCKET}/flaky{next(_n)}"
    open_kvstore(url, s3.storage_options()).set("k", bytes(range(200)))
    store = open_kvstore(url, dict(s3.storage_options(), skip_instance_cache=True))
    assert _direct_of(store) is not None
    failures = {"request": 1, "read_into": 1}

    def flaky(name: str, real: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            if failures[name]:
                failures[name] -= 1
                raise ConnectionResetError("connection reset by peer (injected)")
            return real(*a, **k)
        return call

    monkeypatch.setattr(rangeio.HttpRangeReader, "request", flaky("request", rangeio.HttpRangeReader.request))
    monkeypatch.setattr(rangeio.HttpRangeReader, "read_into", flaky("read_into", rangeio.HttpRangeReader.read_into))
    assert store.get("k", (10, 20)) == bytes(range(10, 20))  # the reset read, done again by s3fs
    buf = bytearray(5)
    assert store.read_into([("k", 3, memoryview(buf))])[0].result() == 5 and bytes(buf) == bytes(range(3, 8))
    assert failures == {"request": 0, "read_into": 0}
    assert _direct_of(store) is not None  # a dropped connection does not turn the direct path off
    assert store.get("k") == bytes(range(200))
