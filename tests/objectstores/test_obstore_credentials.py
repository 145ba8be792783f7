"""Credentials on the obstore route: a named profile from a shared credentials file (the way a
training job on EC2 or with SSO is configured) takes obstore, through a boto3 session
provider, and a checkpoint restore through it gives the saved values; options obstore cannot
honour keep the fsspec route instead of being dropped."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.errors import StorageError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.obstore_store import ObstoreStore
from ocdbt_py.kvstore.s3 import S3Store
from tests.objectstores import servers

BUCKET = "ocdbt-profile"
_n = itertools.count()


@pytest.fixture
def profile_env(s3_server: servers.S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> servers.S3Server:
    """A shared credentials and config file holding profile ``train`` (the server's keys and
    region, and a decoy default profile) and no AWS keys in the environment."""
    s3_server.make_bucket(BUCKET)
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = DECOYDECOYDECOY\naws_secret_access_key = decoy\n\n"
                     f"[train]\naws_access_key_id = {servers.S3_KEY}\naws_secret_access_key = {servers.S3_SECRET}\n")
    config = tmp_path / "config"
    config.write_text(f"[profile train]\nregion = {servers.S3_REGION}\n")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return s3_server


def _provider_keys(store: Any) -> tuple[str, str]:
    assert isinstance(store, ObstoreStore)
    provider = store.store.credential_provider
    assert type(provider).__name__ == "Boto3CredentialProvider"
    creds = provider()
    return creds["access_key_id"], creds["secret_access_key"]


def test_named_profile_takes_obstore_and_restores(profile_env: servers.S3Server, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    tree = {"w": rng.standard_normal((256, 64)).astype(np.float32), "b": np.arange(64, dtype=np.int32)}
    local = tmp_path / "ck"
    checkpoint.save(local, tree)
    url = f"s3://{BUCKET}/p{next(_n)}"
    opts = {"profile": "train", "endpoint_url": profile_env.endpoint}
    store = open_kvstore(url, opts)
    assert _provider_keys(store) == (servers.S3_KEY, servers.S3_SECRET)
    for f in sorted(local.rglob("*")):
        if f.is_file():
            store.set(f.relative_to(local).as_posix(), f.read_bytes())
    out = checkpoint.restore(url, storage_options=opts)
    assert set(out) == set(tree)
    for k in tree:
        np.testing.assert_array_equal(out[k], tree[k])


def test_aws_profile_variable_alone(profile_env: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "train")
    monkeypatch.setenv("AWS_ENDPOINT_URL", profile_env.endpoint)
    store = open_kvstore(f"s3://{BUCKET}/e{next(_n)}")
    assert _provider_keys(store) == (servers.S3_KEY, servers.S3_SECRET)
    store.set("k", b"v")
    assert store.get("k") == b"v"


def test_profile_provider_is_shared_until_the_files_change(profile_env: servers.S3Server, tmp_path: Path) -> None:
    """Stores opened with the same profile share one boto3 session provider (making one costs
    10-25 ms); an edited credentials file gives a new one with the new keys."""
    opts = {"profile": "train", "endpoint_url": profile_env.endpoint}
    a = open_kvstore(f"s3://{BUCKET}/s{next(_n)}", opts)
    b = open_kvstore(f"s3://{BUCKET}/s{next(_n)}", opts)
    assert isinstance(a, ObstoreStore) and isinstance(b, ObstoreStore)
    assert a.store.credential_provider is b.store.credential_provider
    creds = tmp_path / "credentials"
    creds.write_text(creds.read_text().replace(servers.S3_SECRET, "rotated-secret"))
    c = open_kvstore(f"s3://{BUCKET}/s{next(_n)}", opts)
    assert _provider_keys(c) == (servers.S3_KEY, "rotated-secret")


def test_unknown_profile_is_a_clear_error(profile_env: servers.S3Server) -> None:
    with pytest.raises(StorageError, match="nope"):
        open_kvstore(f"s3://{BUCKET}/x", {"profile": "nope", "endpoint_url": profile_env.endpoint})


def test_static_keys_need_no_provider(s3_server: servers.S3Server) -> None:
    s3_server.make_bucket(BUCKET)
    store = open_kvstore(f"s3://{BUCKET}/s{next(_n)}", s3_server.storage_options())
    assert isinstance(store, ObstoreStore) and store.store.credential_provider is None
    assert store.store.config["access_key_id"] == servers.S3_KEY


@pytest.mark.parametrize("extra", [{"requester_pays": True},
                                   {"s3_additional_kwargs": {"ServerSideEncryption": "AES256"}},
                                   {"config_kwargs": {"proxies": {"http": "http://127.0.0.1:1"}}}])
def test_untranslatable_options_keep_the_fsspec_route(s3_server: servers.S3Server, extra: dict[str, Any]) -> None:
    store = open_kvstore(f"s3://{BUCKET}/u", {**s3_server.storage_options(), **extra})
    assert isinstance(store, S3Store)


def test_timeouts_and_retries_reach_obstore(s3_server: servers.S3Server, azure_server: servers.AzureServer) -> None:
    """botocore's ``connect_timeout`` and ``retries.max_attempts`` (what ``ocdbt --timeout``
    sets) and adlfs' ``connection_timeout`` bound obstore's requests instead of taking the
    fsspec route or being ignored (obstore's default is ten retries over three minutes)."""
    s3_server.make_bucket(BUCKET)
    opts = {**s3_server.storage_options(),
            "config_kwargs": {"connect_timeout": 2.5, "read_timeout": 9, "retries": {"max_attempts": 2}}}
    store = open_kvstore(f"s3://{BUCKET}/t{next(_n)}", opts)
    assert isinstance(store, ObstoreStore)
    assert store.store.client_options["connect_timeout"] == "2s 500ms"
    assert store.store.retry_config["max_retries"] == 1
    store.set("k", b"v")
    assert store.get("k") == b"v"
    azure_server.make_container(BUCKET)
    az = open_kvstore(f"az://{BUCKET}/t{next(_n)}",
                      {**azure_server.storage_options(), "connection_timeout": 3, "read_timeout": 3})
    assert isinstance(az, ObstoreStore)
    assert az.store.client_options["connect_timeout"] == "3s"
    az.set("k", b"v")
    assert az.get("k") == b"v"
    # what obstore cannot mean stays on the fsspec route, as every untranslatable option does
    odd = {**s3_server.storage_options(), "config_kwargs": {"retries": {"max_attempts": 0}}}
    assert isinstance(open_kvstore(f"s3://{BUCKET}/x", odd), S3Store)
