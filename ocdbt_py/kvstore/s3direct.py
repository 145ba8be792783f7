"""S3 reads (GET, HEAD, ListObjectsV2) signed by us and sent on the threaded HTTP reader.

A restore's first requests used to wait for botocore to build its client (0.1-0.2 s of
loading service models, more than the restore's network time on a fast link).  When the
configuration is one we fully understand, :class:`S3Direct` makes those reads itself:
:mod:`~ocdbt_py.kvstore.sigv4` signs them and :mod:`~ocdbt_py.kvstore.rangeio`'s threads send
them.  Writes, deletes and anything unusual stay with s3fs/botocore.

"Fully understand" is deliberately narrow (:meth:`S3Direct.from_options` returns ``None``
otherwise and everything goes through s3fs as before):

* static credentials: ``key``/``secret`` (and ``token``) in ``storage_options``, or
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``) with no profile
  chosen; or ``anon=True`` (unsigned requests).  Profiles, SSO, instance roles and other
  providers need botocore's resolver.
* a known endpoint and region: an explicit endpoint (``endpoint_url``, ``AWS_ENDPOINT_URL_S3``,
  ``AWS_ENDPOINT_URL``; path-style addressing unless ``config_kwargs={"s3":
  {"addressing_style": "virtual"}}``, region ``us-east-1`` unless given), or AWS itself with a
  region (``client_kwargs={"region_name": ...}`` or ``AWS_DEFAULT_REGION``) and no AWS config
  file that could say otherwise.
* no options beyond the ones listed in :data:`_PLAIN_OPTIONS`, no proxies, no FIPS/dual-stack
  endpoints, and ``OCDBT_PY_THREADED_HTTP`` / ``OCDBT_PY_S3_OWN_SIGNING`` not set to ``0``.

A response the direct path does not expect (a redirect to another region, a refused
signature, a missing bucket rather than a missing key) raises :class:`Fallback`: the store then
stops using the direct path and repeats the read through s3fs, which reports real errors in
its own words.  Nothing here logs or echoes credentials or signed URLs.
"""

from __future__ import annotations

import builtins
import os
import re
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ocdbt_py.kvstore.direct import Fallback, off
from ocdbt_py.kvstore.rangeio import HttpRangeReader, HttpStatusError
from ocdbt_py.kvstore.sigv4 import Credentials, presign_url, sign_headers, uri_encode

__all__ = ["S3Direct", "Fallback"]

#: storage_options the direct path understands (others: s3fs only)
_PLAIN_OPTIONS = frozenset({
    "key", "secret", "token", "anon", "endpoint_url", "client_kwargs", "config_kwargs", "use_ssl",
    "use_listings_cache", "skip_instance_cache", "listings_expiry_time", "max_paths",
    "default_block_size", "default_fill_cache", "default_cache_type", "asynchronous", "loop",
})
_PLAIN_CLIENT = frozenset({"region_name", "endpoint_url", "verify"})
_PLAIN_CONFIG = frozenset({"max_pool_connections", "connect_timeout", "read_timeout", "retries", "s3"})
#: environment variables that change how botocore reaches S3 in ways we do not reproduce
_ENV_OPT_OUT = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT",
                "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT", "AWS_S3_USE_ARN_REGION",
                "AWS_S3_DISABLE_MULTIREGION_ACCESS_POINTS",
                "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"

#: largest listing page or error body read (S3 pages hold at most 1000 keys: well below this)
MAX_LISTING_PAGE = 32 << 20
#: most listing pages followed for one listing (10 million keys)
MAX_LISTING_PAGES = 10_000


def _aws_config_exists(env: Mapping[str, str]) -> bool:
    try:
        home = env.get("HOME") or str(Path.home())
        path = env.get("AWS_CONFIG_FILE") or str(Path(home) / ".aws" / "config")
        return Path(path).expanduser().exists()
    except (OSError, RuntimeError):
        return True  # cannot tell: assume it might say something


class S3Direct:
    """Signed reads of one S3 endpoint: object URLs, GET (whole or a range), HEAD, listing."""

    #: keys asked for per listing page (S3 never gives more than 1000)
    page_keys = 1000

    def __init__(self, reader: HttpRangeReader, creds: Credentials | None, region: str,
                 endpoint: str | None, *, virtual: bool):
        self.reader = reader
        self.creds = creds
        self.region = region
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.virtual = virtual

    # -- configuration -----------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: Mapping[str, Any], reader_for: Any,
                     env: Mapping[str, str] | None = None) -> S3Direct | None:
        """A direct reader for s3fs ``options``, or ``None`` where only botocore knows how to
        reach the store (see the module docstring).  ``reader_for(verify)`` gives the
        threaded HTTP reader for a TLS setting."""
        env = os.environ if env is None else env
        if off(env, "OCDBT_PY_THREADED_HTTP") or off(env, "OCDBT_PY_S3_OWN_SIGNING"):
            return None
        if any(env.get(v) for v in _ENV_OPT_OUT):
            return None
        if not set(options) <= _PLAIN_OPTIONS:
            return None
        client = options.get("client_kwargs") or {}
        config = options.get("config_kwargs") or {}
        if not isinstance(client, Mapping) or not isinstance(config, Mapping):
            return None
        if not set(client) <= _PLAIN_CLIENT or not set(config) <= _PLAIN_CONFIG:
            return None
        s3cfg = config.get("s3") or {}
        if not isinstance(s3cfg, Mapping) or not set(s3cfg) <= {"addressing_style"}:
            return None
        style = s3cfg.get("addressing_style", "auto")
        if style not in ("auto", "path", "virtual"):
            return None
        creds = cls._credentials(options, env)
        if creds is False or creds is True:
            return None
        endpoint = options.get("endpoint_url") or client.get("endpoint_url")
        if not endpoint and env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() != "true":
            endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        region = client.get("region_name") or env.get("AWS_DEFAULT_REGION")
        if endpoint:
            if not isinstance(endpoint, str):
                return None
            u = urllib.parse.urlsplit(endpoint)
            if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
                return None
            if u.path not in ("", "/"):
                return None
            if options.get("use_ssl") is False and u.scheme == "https":
                return None
            virtual = style == "virtual"
            region = region or "us-east-1"
        else:
            if not region or _aws_config_exists(env) or options.get("use_ssl") is False:
                return None
            if not re.fullmatch(r"[a-z0-9-]+", str(region)):
                return None
            virtual = style != "path"
        verify = client.get("verify", env.get("AWS_CA_BUNDLE") or None)
        if not (verify is None or isinstance(verify, (bool, str))):
            return None
        return cls(reader_for(verify), creds, str(region), endpoint, virtual=virtual)

    @staticmethod
    def _credentials(options: Mapping[str, Any], env: Mapping[str, str]) -> Credentials | None | bool:
        """Static credentials, ``None`` for anonymous access, ``False`` when only botocore's
        resolver can find them."""
        if options.get("anon"):
            return None
        key, secret, token = options.get("key"), options.get("secret"), options.get("token")
        if key is not None or secret is not None:
            if not (isinstance(key, str) and key and isinstance(secret, str) and secret):
                return False
            if token is not None and not isinstance(token, str):
                return False
            return Credentials(key, secret, token)
        if token is not None:
            return False
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            return Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or env.get("AWS_SECURITY_TOKEN"))
        return False

    # -- addressing --------------------------------------------------------------------------
    def _base(self, bucket: str) -> tuple[str, str]:
        """``(scheme://host[:port], path prefix)`` for requests about ``bucket``."""
        if self.endpoint is None:
            host = f"s3.{self.region}.amazonaws.com"
            if self.region.startswith("cn-"):
                host += ".cn"
            if self.virtual and _DNS_BUCKET.match(bucket) and "." not in bucket:
                return f"https://{bucket}.{host}", ""
            return f"https://{host}", "/" + uri_encode(bucket, keep_slash=False)
        if self.virtual and _DNS_BUCKET.match(bucket):
            u = urllib.parse.urlsplit(self.endpoint)
            return f"{u.scheme}://{bucket}.{u.netloc}", ""
        return self.endpoint, "/" + uri_encode(bucket, keep_slash=False)

    def object_url(self, bucket: str, name: str) -> str:
        """The unsigned URL of object ``name`` in ``bucket``."""
        base, pre = self._base(bucket)
        return f"{base}{pre}/{uri_encode(name, keep_slash=True)}"

    def presign(self, bucket: str, name: str, expires: int) -> str:
        """A GET URL for the object that needs no further signing (anonymous: the plain URL)."""
        url = self.object_url(bucket, name)
        if self.creds is None:
            return url
        return presign_url("GET", url, self.creds, self.region, expires=expires)

    def _signed(self, method: str, url: str, headers: dict[str, str] | None = None) -> dict[str, str]:
        if self.creds is None:
            return dict(headers or {})
        return sign_headers(method, url, self.creds, self.region, headers=headers)

    # -- requests ----------------------------------------------------------------------------
    def _call(self, method: str, url: str, headers: dict[str, str] | None, max_body: int
              ) -> tuple[int, dict[str, str], bytes]:
        try:
            return self.reader.request(method, url, self._signed(method, url, headers), max_body=max_body)
        except HttpStatusError as e:
            raise Fallback(str(e)) from e

    @staticmethod
    def _error_code(body: bytes) -> str:
        m = re.search(rb"<Code>([A-Za-z0-9.]{1,64})</Code>", body[:4096])
        return m.group(1).decode() if m else ""

    def _unexpected(self, status: int, body: bytes) -> Fallback:
        return Fallback(f"HTTP {status} {self._error_code(body)}".strip())

    def get(self, bucket: str, name: str, start: int, stop: int | None, *, max_body: int) -> bytes | None:
        """Bytes ``[start, stop)`` of the object (``stop=None``: to its end), ``None`` if the
        object does not exist, ``b""`` for a range at or past its end."""
        if start < 0:
            raise Fallback("suffix ranges go through s3fs")
        headers: dict[str, str] = {}
        if start > 0 or stop is not None:
            headers["Range"] = f"bytes={start}-" + ("" if stop is None else str(stop - 1))
        status, hdrs, body = self._call("GET", self.object_url(bucket, name), headers, max_body)
        if status == 200:
            if start > 0:
                raise Fallback("range ignored")
            return body if stop is None else body[:stop]
        if status == 206:
            return body
        if status == 416:
            return b""
        if status == 404 and self._error_code(body) == "NoSuchKey":
            return None
        raise self._unexpected(status, body)

    def read_into(self, bucket: str, name: str, start: int, buf: memoryview) -> int | None:
        """Read ``len(buf)`` bytes from ``start`` into ``buf`` through a presigned URL."""
        return self.reader.read_into(self.presign(bucket, name, 3600), start, buf)

    def head(self, bucket: str, name: str) -> int | None:
        """The object's size, ``None`` if it does not exist."""
        status, hdrs, body = self._call("HEAD", self.object_url(bucket, name), None, 0)
        if status == 200 and (hdrs.get("content-length") or "").isdigit():
            return int(hdrs["content-length"])
        # HEAD has no body to tell a missing key from a missing bucket: ask the bucket
        if status == 404 and self._bucket_exists(bucket):
            return None
        raise self._unexpected(status, body)

    def _bucket_exists(self, bucket: str) -> bool:
        base, pre = self._base(bucket)
        url = f"{base}{pre}/?list-type=2&max-keys=0"
        status, _, body = self._call("GET", url, None, MAX_LISTING_PAGE)
        return status == 200

    def list(self, bucket: str, prefix: str) -> builtins.list[tuple[str, int]]:
        """Every ``(key, size)`` below ``prefix`` (recursively), in the server's order."""
        base, pre = self._base(bucket)
        out: list[tuple[str, int]] = []
        token: str | None = None
        for _ in range(MAX_LISTING_PAGES):
            q = [("list-type", "2"), ("encoding-type", "url"), ("prefix", prefix),
                 ("max-keys", str(self.page_keys))]
            if token is not None:
                q.append(("continuation-token", token))
            url = f"{base}{pre}/?" + "&".join(f"{k}={uri_encode(v, keep_slash=False)}" for k, v in q)
            status, _, body = self._call("GET", url, None, MAX_LISTING_PAGE)
            if status != 200:
                raise self._unexpected(status, body)
            page, token = self._parse_listing(body)
            out.extend(page)
            if token is None:
                return out
        raise Fallback("listing has too many pages")

    @staticmethod
    def _parse_listing(body: bytes) -> tuple[builtins.list[tuple[str, int]], str | None]:
        if b"<!DOCTYPE" in body[:1024] or b"<!ENTITY" in body:
            raise Fallback("listing with a DTD")
        try:
            root = ET.fromstring(body)  # noqa: S314 - no DTD (checked above), from the user's own server
        except ET.ParseError as e:
            raise Fallback(f"unreadable listing: {e}") from e
        ns = _NS if root.tag.startswith(_NS) else ""
        if root.tag != f"{ns}ListBucketResult":
            raise Fallback("not a ListObjectsV2 result")
        url_encoded = (root.findtext(f"{ns}EncodingType") or "").lower() == "url"
        page: list[tuple[str, int]] = []
        for c in root.iter(f"{ns}Contents"):
            key = c.findtext(f"{ns}Key")
            size = c.findtext(f"{ns}Size") or ""
            if key is None or not size.isdigit():
                raise Fallback("listing entry without key or size")
            page.append((urllib.parse.unquote_plus(key) if url_encoded else key, int(size)))
        truncated = (root.findtext(f"{ns}IsTruncated") or "").lower() == "true"
        token = root.findtext(f"{ns}NextContinuationToken") if truncated else None
        if truncated and not token:
            raise Fallback("truncated listing without a continuation token")
        return page, token
