"""fsspec ``storage_options`` -> an obstore store, credentials included.

Users pass the options s3fs, gcsfs and adlfs take; :func:`build` turns them into obstore's
configuration.  An option this module does not know, or knows obstore cannot honour, raises
:class:`Untranslatable`, and :func:`~ocdbt_py.kvstore.open_kvstore` then takes the fsspec
route: an option is never silently dropped (read timeouts aside: see the end of this text).

Credentials, per service (each source is served by obstore itself, so every one takes the
fast path):

* **S3.** ``anon=True``: unsigned requests.  ``key``/``secret``/``token``: static keys.
  ``profile=`` or ``AWS_PROFILE``, or a shared credentials/config file with no
  ``AWS_ACCESS_KEY_ID`` in the environment: a boto3 session
  (``obstore.auth.boto3.Boto3CredentialProvider``), which covers named profiles, SSO,
  assume-role and ``credential_process`` profiles, refreshed as they expire.  Otherwise
  obstore's own chain: environment keys, web identity (``AWS_WEB_IDENTITY_TOKEN_FILE``),
  container credentials, instance metadata (IMDSv2).
* **GCS.** ``token="anon"``: unsigned.  ``token=<path>``: that credentials file (service
  account or authorized user); ``token=<dict>``: a service-account key.  Otherwise
  ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application-default credentials, or the
  metadata server (workload identity).
* **Azure.** ``account_name`` with ``account_key``, ``sas_token``, or a ``connection_string``
  (also from ``AZURE_STORAGE_CONNECTION_STRING``); ``anon=True``: unsigned; service principal
  (``client_id``/``client_secret``/``tenant_id``); otherwise obstore's chain (workload
  identity, managed identity, ``AZURE_*`` environment variables).

Timeouts and retries: botocore's ``config_kwargs`` ``connect_timeout`` and
``retries.max_attempts`` (what ``ocdbt --timeout`` sets) and adlfs' ``connection_timeout``
become obstore's connect timeout and retry count.  Read timeouts (botocore's and adlfs'
``read_timeout``) bound one socket read there; obstore has no such bound (its whole-request
timeout stays at its default), so they are accepted and leave reads as obstore times them.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import threading
import urllib.parse
import urllib.request
from typing import Any

from ocdbt_py.errors import InvalidKeyError, StorageError
from ocdbt_py.kvstore.object_store import _SECRET_ENV, _secret_strings

__all__ = ["Built", "Untranslatable", "build", "OUR_KEYS"]

#: options that configure ocdbt-py itself
OUR_KEYS = ("single_writer", "backend")
#: fsspec options about fsspec's own caching, meaningless here
_FSSPEC_ONLY = {"use_listings_cache", "skip_instance_cache", "listings_expiry_time", "max_paths",
                "default_block_size", "default_fill_cache", "default_cache_type", "asynchronous", "loop",
                "cache_regions", "version_aware"}
#: botocore config_kwargs that only tune its own pool / timeouts; ``connect_timeout`` and
#: ``retries.max_attempts`` are translated, the others are botocore's own business
_CONFIG_HARMLESS = {"max_pool_connections", "connect_timeout", "read_timeout", "retries"}


def _store_class(name: str) -> Any:
    """obstore's store class ``name`` (configured by dicts built here, checked by obstore)."""
    # optional: obstore is an extra
    import obstore.store

    return getattr(obstore.store, name)


class Untranslatable(Exception):
    """The options ask for something obstore cannot do here; use the fsspec route."""


@dataclasses.dataclass
class Built:
    """An obstore store and what :class:`~ocdbt_py.kvstore.obstore_store.ObstoreStore` needs
    to know about it."""

    store: Any
    url: str
    read_only: bool = False
    single_writer: bool = False
    custom_endpoint: bool = False
    secrets: list[str] = dataclasses.field(default_factory=list)
    lister: Any = None


def _split(url: str) -> tuple[str, str, str]:
    """``(scheme, netloc, path)`` of ``url`` (path without leading/trailing ``/``)."""
    scheme, rest = url.split("://", 1)
    netloc, _, path = rest.partition("/")
    return scheme.lower(), netloc, path.strip("/")


def _prefix(path: str) -> str | None:
    if not path:
        return None
    for seg in path.split("/"):
        if seg in ("", ".", "..") or "\x00" in seg:
            raise InvalidKeyError(f"bad path segment in object-store URL: {path!r}")
    return path


def _seconds(value: Any, what: str) -> datetime.timedelta:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise Untranslatable(f"{what}={value!r}") from None
    if not seconds > 0:
        raise Untranslatable(f"{what}={value!r}")
    return datetime.timedelta(seconds=seconds)


def _retry_config(max_attempts: Any) -> dict[str, Any] | None:
    """obstore's retry settings from a botocore-style ``max_attempts`` (first try included)."""
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise Untranslatable(f"retries.max_attempts={max_attempts!r}")
    return {"max_retries": max_attempts - 1}


def _client(endpoint: str | None, verify: Any, timeout: Any = None,
            connect_timeout: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"pool_max_idle_per_host": "64"}
    if connect_timeout is not None:
        out["connect_timeout"] = _seconds(connect_timeout, "connect_timeout")
    if endpoint and endpoint.startswith("http://"):
        out["allow_http"] = True
    if verify is False:
        out["allow_invalid_certificates"] = True
    elif isinstance(verify, str):
        with open(verify, "rb") as f:  # a CA bundle file: trusted besides the system roots
            out["root_certificate"] = f.read()
    elif verify not in (None, True):
        raise Untranslatable(f"verify={verify!r}")
    if timeout is not None:
        out["timeout"] = f"{int(timeout)}s"
    return out


def _pop_all(opts: dict[str, Any]) -> None:
    for k in list(opts):
        if k in _FSSPEC_ONLY:
            opts.pop(k)
    if opts:
        raise Untranslatable(f"options obstore cannot take: {sorted(opts)}")


def build(url: str, options: dict[str, Any]) -> Built:
    """An obstore store for ``url`` from fsspec-style ``options`` (consumed).

    ``backend="obstore"`` among the options insists on obstore where the automatic choice
    would not take it (a GCS emulator: reads work, writes do not)."""
    # optional: obstore is an extra
    import obstore.store  # noqa: F401

    secrets = list(_secret_strings(options)) + [os.environ[v] for v in _SECRET_ENV if os.environ.get(v)]
    single_writer = bool(options.pop("single_writer", False))
    forced = options.pop("backend", None) == "obstore"
    scheme, netloc, path = _split(url)
    if scheme in ("s3", "s3a"):
        built = _s3(netloc, path, options)
    elif scheme in ("gs", "gcs"):
        built = _gcs(netloc, path, options, forced)
    elif scheme in ("az", "abfs", "abfss"):
        built = _azure(scheme, netloc, path, options)
    elif scheme in ("http", "https"):
        built = _http(url, options)
    else:
        raise Untranslatable(f"scheme {scheme}")
    built.secrets = secrets
    built.single_writer = single_writer
    return built


# -- S3 -----------------------------------------------------------------------------------------
def _s3(bucket: str, path: str, opts: dict[str, Any]) -> Built:
    if not bucket:
        raise InvalidKeyError("an object-store URL must name a bucket")
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    config_kwargs = dict(opts.pop("config_kwargs", None) or {})
    if set(config_kwargs) - _CONFIG_HARMLESS:
        raise Untranslatable(f"config_kwargs {sorted(set(config_kwargs) - _CONFIG_HARMLESS)}")
    env = os.environ
    endpoint = (opts.pop("endpoint_url", None) or client_kwargs.pop("endpoint_url", None)
                or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"))
    region = (opts.pop("region_name", None) or opts.pop("region", None) or client_kwargs.pop("region_name", None)
              or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"))
    verify = client_kwargs.pop("verify", env.get("AWS_CA_BUNDLE") or None)
    if opts.pop("use_ssl", True) is False and endpoint and endpoint.startswith("https://"):
        endpoint = "http://" + endpoint[len("https://"):]
    key = opts.pop("key", None) or client_kwargs.pop("aws_access_key_id", None)
    secret = opts.pop("secret", None) or client_kwargs.pop("aws_secret_access_key", None)
    token = opts.pop("token", None) or client_kwargs.pop("aws_session_token", None)
    anon = bool(opts.pop("anon", False))
    profile = opts.pop("profile", None)
    if client_kwargs:
        raise Untranslatable(f"client_kwargs {sorted(client_kwargs)}")
    _pop_all(opts)
    config: dict[str, Any] = {}
    provider = None
    if anon:
        config["skip_signature"] = True
    elif key and secret:
        config.update(access_key_id=key, secret_access_key=secret)
        if token:
            config["session_token"] = token
    elif profile or _profile_credentials(env):
        provider = _boto3_provider(profile)
        region = region or provider.config.get("region")
    if endpoint:
        config["endpoint"] = endpoint
    custom = bool(endpoint) and ".amazonaws.com" not in str(endpoint)
    if not region:
        region = "us-east-1" if custom else _bucket_region(bucket)
    config["region"] = region
    retries = config_kwargs.get("retries")
    retry = _retry_config(retries.get("max_attempts") if isinstance(retries, dict) else None)
    store = _store_class("S3Store")(bucket, prefix=_prefix(path), config=config,
                                    client_options=_client(endpoint, verify,
                                                           connect_timeout=config_kwargs.get("connect_timeout")),
                                    credential_provider=provider, **({"retry_config": retry} if retry else {}))
    return Built(store, f"s3://{bucket}/{path}".rstrip("/"), custom_endpoint=custom)


def _profile_credentials(env: Any) -> bool:
    """Whether credentials come from a profile (``AWS_PROFILE``, or a shared file with no
    keys, web identity or container credentials in the environment)."""
    if env.get("AWS_PROFILE"):
        return True
    if any(env.get(v) for v in ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE",
                                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        return False
    files = [env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials"),
             env.get("AWS_CONFIG_FILE") or os.path.expanduser("~/.aws/config")]
    return any(os.path.isfile(f) for f in files)


#: boto3 credential providers by what they were made from (see :func:`_boto3_provider`)
_providers: dict[tuple[Any, ...], Any] = {}
_providers_lock = threading.Lock()


def _profile_key(profile: str | None) -> tuple[Any, ...]:
    """What a profile's credentials depend on: its name, the ``AWS_*`` environment and the
    shared files' identity and modification times (an edited file makes a new provider)."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    files: list[tuple[Any, ...]] = []
    for f in (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials"),
              os.environ.get("AWS_CONFIG_FILE") or os.path.expanduser("~/.aws/config")):
        try:
            st = os.stat(f)
            files.append((f, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            files.append((f, None))
    return (profile, env, tuple(files))


def _boto3_provider(profile: str | None) -> Any:
    """A credential provider over a boto3 session of ``profile``: one per process for the
    same profile, environment and shared files (a boto3 session takes 10-25 ms to make, on
    every store opened; the provider refreshes what it hands out itself)."""
    key = _profile_key(profile)
    with _providers_lock:
        got = _providers.get(key)
    if got is None:
        got = _new_boto3_provider(profile)
        with _providers_lock:
            got = _providers.setdefault(key, got)
    return got


def _new_boto3_provider(profile: str | None) -> Any:
    try:
        # optional: boto3 resolves profiles (SSO, assume-role, credential_process)
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as e:
        raise Untranslatable(f"profile credentials need boto3: {e}") from e
    try:
        return Boto3CredentialProvider(boto3.Session(profile_name=profile))
    except Exception as e:
        if profile is None:  # no usable profile after all: obstore's own chain (instance roles)
            raise Untranslatable(f"no profile credentials: {type(e).__name__}") from e
        raise StorageError(f"cannot load AWS profile {profile!r}: {type(e).__name__}: {e}") from e


def _bucket_region(bucket: str) -> str:
    """The region of an AWS bucket, from the ``x-amz-bucket-region`` header of an unsigned
    HEAD (S3 answers it to anyone, even with 403); ``us-east-1`` when it cannot tell."""
    req = urllib.request.Request(f"https://{urllib.parse.quote(bucket)}.s3.amazonaws.com/", method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - fixed https URL
            return str(resp.headers.get("x-amz-bucket-region") or "us-east-1")
    except urllib.error.HTTPError as e:
        return str(e.headers.get("x-amz-bucket-region") or "us-east-1")
    except OSError:
        return "us-east-1"


# -- GCS ----------------------------------------------------------------------------------------
def _gcs(bucket: str, path: str, opts: dict[str, Any], forced: bool) -> Built:
    if not bucket:
        raise InvalidKeyError("an object-store URL must name a bucket")
    token = opts.pop("token", None)
    opts.pop("project", None)  # object requests do not name a project
    endpoint = opts.pop("endpoint_url", None) or os.environ.get("STORAGE_EMULATOR_HOST")
    _pop_all(opts)
    config: dict[str, Any] = {}
    if endpoint:
        if not forced:  # obstore writes through GCS's XML API, which emulators (fake-gcs-server) lack
            raise Untranslatable("a GCS emulator endpoint")
        if not endpoint.startswith("http"):
            endpoint = "http://" + endpoint
        config["base_url"] = endpoint.rstrip("/")
        token = "anon" if token is None else token
    if token == "anon":
        config["skip_signature"] = True
    elif isinstance(token, str) and token not in ("google_default", "cache"):
        if not os.path.isfile(token):
            raise Untranslatable(f"token={token!r}")
        config["application_credentials"] = token
    elif isinstance(token, dict) and token.get("type") == "service_account":
        import json

        config["service_account_key"] = json.dumps(token)
    elif token not in (None, "google_default", "cache"):
        raise Untranslatable(f"token of type {type(token).__name__}")
    store = _store_class("GCSStore")(bucket, prefix=_prefix(path), config=config,
                                     client_options=_client(endpoint, None))
    return Built(store, f"gs://{bucket}/{path}".rstrip("/"),
                 custom_endpoint=bool(endpoint) and "storage.googleapis.com" not in str(endpoint))


# -- Azure --------------------------------------------------------------------------------------
def _conn_parts(conn: str) -> dict[str, str]:
    out = {}
    for part in conn.split(";"):
        k, _, v = part.partition("=")
        if k.strip():
            out[k.strip().lower()] = v.strip()
    return out


def _azure(scheme: str, netloc: str, path: str, opts: dict[str, Any]) -> Built:
    container, _, host = netloc.partition("@")
    if not container:
        raise InvalidKeyError("an object-store URL must name a container")
    env = os.environ
    account = opts.pop("account_name", None) or (host.split(".", 1)[0] if host else None)
    key = opts.pop("account_key", None)
    sas = opts.pop("sas_token", None)
    conn = opts.pop("connection_string", None)
    anon = opts.pop("anon", None)
    host_opt = opts.pop("account_host", None)
    if opts.pop("credential", None) is not None:
        raise Untranslatable("credential objects")
    principal = {k: opts.pop(k) for k in ("client_id", "client_secret", "tenant_id") if k in opts}
    connect_timeout = opts.pop("connection_timeout", None)  # adlfs' name; its read_timeout has no twin
    opts.pop("read_timeout", None)
    _pop_all(opts)
    if not (account or key or sas or conn or principal) and env.get("AZURE_STORAGE_CONNECTION_STRING"):
        conn = env["AZURE_STORAGE_CONNECTION_STRING"]
    config: dict[str, Any] = {str(k): v for k, v in principal.items()}
    endpoint = None
    if conn:
        parts = _conn_parts(conn)
        if parts.get("usedevelopmentstorage") == "true":
            config["use_emulator"] = True
            endpoint = "http://127.0.0.1:10000"
        account = parts.get("accountname", account)
        key = parts.get("accountkey", key)
        sas = parts.get("sharedaccesssignature", sas)
        endpoint = parts.get("blobendpoint", endpoint)
    if host_opt:
        endpoint = f"https://{host_opt}"
    if account:
        config["account_name"] = account
    if anon:
        config["skip_signature"] = True
    elif key:
        config["account_key"] = key
    elif sas:
        config["sas_key"] = sas.lstrip("?")
    if endpoint and not config.get("use_emulator"):
        config["endpoint"] = endpoint.rstrip("/")
    store = _store_class("AzureStore")(container, prefix=_prefix(path), config=config,
                                       client_options=_client(endpoint, None, connect_timeout=connect_timeout))
    return Built(store, f"{scheme}://{container}/{path}".rstrip("/"),
                 custom_endpoint=bool(endpoint) and ".core.windows.net" not in str(endpoint))


# -- HTTP ---------------------------------------------------------------------------------------
def _http(url: str, opts: dict[str, Any]) -> Built:
    _pop_all(opts)
    # heavy: fsspec's HTTP filesystem lists a server's index pages, which obstore cannot
    from ocdbt_py.kvstore.fsspec_store import FsspecStore

    base = url.rstrip("/") + "/"
    store = _store_class("HTTPStore").from_url(base, client_options=_client(base, None))
    return Built(store, url.rstrip("/"), read_only=True, lister=FsspecStore.from_url(url, {}))
