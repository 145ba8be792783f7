"""Azure Blob reads over the REST API, signed by us, on the threaded HTTP reader (see :mod:`.direct`).

Used when the configuration is one we fully understand: a connection string (an
``AccountName``/``AccountKey`` pair or a ``SharedAccessSignature``, with ``BlobEndpoint`` or
``DefaultEndpointsProtocol``/``EndpointSuffix``; azurite's included), or ``account_name`` with
``account_key`` or ``sas_token`` (options or ``AZURE_STORAGE_*`` variables); nothing else in
the options, no proxies, and neither ``OCDBT_PY_THREADED_HTTP`` nor ``OCDBT_PY_AZURE_OWN_HTTP``
set to ``0``.  Azure AD credentials, managed identities and anonymous access stay with adlfs.

Shared Key requests are signed as the Blob service specifies (``Authorization: SharedKey
account:signature``, an HMAC-SHA256 over the canonical request); SAS requests carry the
token in their query.  Any unexpected status raises :class:`~ocdbt_py.kvstore.direct.Fallback`
and adlfs takes over.  Nothing here logs or echoes a key or a token.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import email.utils
import hashlib
import hmac
import os
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from typing import Any

from ocdbt_py.kvstore.direct import ERROR_BODY, Fallback, off, proxied, range_headers, ranged_answer
from ocdbt_py.kvstore.rangeio import HttpRangeReader, HttpStatusError

__all__ = ["AzureDirect", "parse_connection_string"]

#: adlfs options the direct path understands (others: adlfs only)
_PLAIN_OPTIONS = frozenset({
    "account_name", "account_key", "sas_token", "connection_string", "skip_instance_cache",
    "use_listings_cache", "listings_expiry_time", "max_concurrency", "blocksize", "asynchronous", "loop",
    "default_fill_cache", "default_cache_type", "version_aware",
})
#: the Blob service version we speak (azurite and Azure both accept it)
API_VERSION = "2021-12-02"
#: largest listing page or error body read
MAX_LISTING_PAGE = 32 << 20
#: most listing pages followed for one listing
MAX_PAGES = 10_000
_SIGNED_HEADERS = ("Content-Encoding", "Content-Language", "Content-Length", "Content-MD5", "Content-Type",
                   "Date", "If-Modified-Since", "If-Match", "If-None-Match", "If-Unmodified-Since", "Range")


def parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` as a dict (keys as written; values may contain ``=``)."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out


def _q(s: str, safe: str = "") -> str:
    return urllib.parse.quote(s, safe=safe)


class AzureDirect:
    """Reads of one storage account's Blob endpoint, with a Shared Key or a SAS token."""

    #: blobs asked for per listing page (Azure gives at most 5000)
    page_size = 5000

    def __init__(self, reader: HttpRangeReader, endpoint: str, account: str, *, key: bytes | None = None,
                 sas: str | None = None, clock: Callable[[], str] | None = None):
        if (key is None) == (sas is None):
            raise ValueError("give exactly one of key and sas")
        self.reader = reader
        self.endpoint = endpoint.rstrip("/")
        self.account = account
        self._key = key
        self._sas = sas.lstrip("?") if sas is not None else None
        self._clock = clock or (lambda: email.utils.formatdate(usegmt=True))

    # -- configuration -----------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: Mapping[str, Any], reader_for: Callable[[Any], HttpRangeReader],
                     env: Mapping[str, str] | None = None) -> AzureDirect | None:
        """A direct reader for adlfs ``options``, or ``None`` where only adlfs can reach the store."""
        env = os.environ if env is None else env
        if off(env, "OCDBT_PY_THREADED_HTTP") or off(env, "OCDBT_PY_AZURE_OWN_HTTP") or proxied(env):
            return None
        if not set(options) <= _PLAIN_OPTIONS:
            return None
        conn = options.get("connection_string")
        if conn is None and not any(options.get(k) for k in ("account_name", "account_key", "sas_token")):
            conn = env.get("AZURE_STORAGE_CONNECTION_STRING")
        if conn is not None:
            if not isinstance(conn, str):
                return None
            return cls._from_connection_string(parse_connection_string(conn), reader_for)
        account = options.get("account_name") or env.get("AZURE_STORAGE_ACCOUNT_NAME")
        key = options.get("account_key") or (None if options.get("sas_token") else env.get("AZURE_STORAGE_ACCOUNT_KEY"))
        sas = options.get("sas_token") or (None if key else env.get("AZURE_STORAGE_SAS_TOKEN"))
        if not isinstance(account, str) or not account.isalnum():
            return None
        return cls._make(reader_for, f"https://{account}.blob.core.windows.net", account, key, sas)

    @classmethod
    def _from_connection_string(cls, cs: Mapping[str, str], reader_for: Callable[[Any], HttpRangeReader]
                                ) -> AzureDirect | None:
        known = {"DefaultEndpointsProtocol", "AccountName", "AccountKey", "BlobEndpoint", "EndpointSuffix",
                 "SharedAccessSignature", "QueueEndpoint", "TableEndpoint", "FileEndpoint"}
        if not set(cs) <= known:
            return None
        account = cs.get("AccountName")
        endpoint = cs.get("BlobEndpoint")
        if endpoint is None:
            if not account:
                return None
            proto = cs.get("DefaultEndpointsProtocol", "https")
            endpoint = f"{proto}://{account}.blob.{cs.get('EndpointSuffix', 'core.windows.net')}"
        u = urllib.parse.urlsplit(endpoint)
        if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
            return None
        if not account:  # SAS with only a BlobEndpoint: the account is its first host label
            account = u.hostname.split(".", 1)[0]
        return cls._make(reader_for, endpoint, account, cs.get("AccountKey"), cs.get("SharedAccessSignature"))

    @classmethod
    def _make(cls, reader_for: Callable[[Any], HttpRangeReader], endpoint: str, account: str, key: Any, sas: Any
              ) -> AzureDirect | None:
        if key and isinstance(key, str):
            try:
                raw = base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError):
                return None
            return cls(reader_for(None), endpoint, account, key=raw)
        if sas and isinstance(sas, str):
            return cls(reader_for(None), endpoint, account, sas=sas)
        return None

    # -- signing -----------------------------------------------------------------------------
    def url(self, container: str, blob: str | None = None, query: list[tuple[str, str]] | None = None) -> str:
        """The request URL (with the SAS token, when that is the credential)."""
        path = f"{self.endpoint}/{_q(container)}" + ("" if blob is None else "/" + _q(blob, safe="/"))
        parts = [urllib.parse.urlencode(query)] if query else []
        if self._sas:
            parts.append(self._sas)
        return path + ("?" + "&".join(parts) if parts else "")

    def sign(self, method: str, url: str, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` plus ``x-ms-date``, ``x-ms-version`` and (Shared Key) ``Authorization``."""
        out = dict(headers)
        out["x-ms-date"] = self._clock()
        out["x-ms-version"] = API_VERSION
        if self._key is None:
            return out
        lower = {k.lower(): v for k, v in out.items()}
        fields = [method] + [lower.get(h.lower(), "") for h in _SIGNED_HEADERS]
        if fields[3] == "0":
            fields[3] = ""  # Content-Length 0 is signed as empty
        canon_headers = "".join(f"{k}:{' '.join(v.split())}\n" for k, v in sorted(lower.items())
                                if k.startswith("x-ms-"))
        u = urllib.parse.urlsplit(url)
        resource = f"/{self.account}{u.path or '/'}"
        params: dict[str, list[str]] = {}
        for k, v in urllib.parse.parse_qsl(u.query, keep_blank_values=True):
            params.setdefault(k.lower(), []).append(v)
        for k in sorted(params):
            resource += f"\n{k}:{','.join(sorted(params[k]))}"
        to_sign = "\n".join(fields) + "\n" + canon_headers + resource
        sig = base64.b64encode(hmac.new(self._key, to_sign.encode("utf-8"), hashlib.sha256).digest()).decode()
        out["Authorization"] = f"SharedKey {self.account}:{sig}"
        return out

    # -- requests ----------------------------------------------------------------------------
    def _call(self, method: str, url: str, headers: dict[str, str] | None, max_body: int
              ) -> tuple[int, dict[str, str], bytes]:
        try:
            return self.reader.request(method, url, self.sign(method, url, headers or {}), max_body=max_body)
        except HttpStatusError as e:
            raise Fallback(str(e)) from e

    def get(self, container: str, blob: str, start: int, stop: int | None, *, max_body: int) -> bytes | None:
        """Bytes ``[start, stop)``; ``None`` if the blob does not exist; ``b""`` past its end."""
        headers = range_headers(start, stop, "adlfs")
        status, _, body = self._call("GET", self.url(container, blob), headers, max(max_body, ERROR_BODY))
        return ranged_answer(status, body, start, stop)

    def head(self, container: str, blob: str) -> int | None:
        """The blob's size; ``None`` if it does not exist."""
        status, hdrs, _ = self._call("HEAD", self.url(container, blob), None, 0)
        if status == 404:
            return None
        length = hdrs.get("content-length") or ""
        if status != 200 or not length.isdigit():
            raise Fallback(f"HTTP {status}")
        return int(length)

    def list(self, container: str, prefix: str) -> builtins.list[tuple[str, int]]:
        """Every ``(name, size)`` below ``prefix`` (recursively)."""
        out: list[tuple[str, int]] = []
        marker = ""
        for _ in range(MAX_PAGES):
            q = [("restype", "container"), ("comp", "list"), ("prefix", prefix), ("maxresults", str(self.page_size))]
            if marker:
                q.append(("marker", marker))
            status, _, body = self._call("GET", self.url(container, None, q), None, MAX_LISTING_PAGE)
            if status != 200:
                raise Fallback(f"HTTP {status}")
            page, marker = self._parse_listing(body)
            out.extend(page)
            if not marker:
                return out
        raise Fallback("listing has too many pages")

    @staticmethod
    def _parse_listing(body: bytes) -> tuple[builtins.list[tuple[str, int]], str]:
        if b"<!DOCTYPE" in body[:1024] or b"<!ENTITY" in body:
            raise Fallback("listing with a DTD")
        try:
            root = ET.fromstring(body)  # noqa: S314 - no DTD (checked above), from the user's own account
        except ET.ParseError as e:
            raise Fallback(f"unreadable listing: {e}") from e
        if root.tag != "EnumerationResults":
            raise Fallback("not a List Blobs result")
        page: list[tuple[str, int]] = []
        for b in root.iter("Blob"):
            name = b.findtext("Name")
            size = b.findtext("Properties/Content-Length") or ""
            if name is None or not size.isdigit():
                raise Fallback("listing entry without name or size")
            page.append((name, int(size)))
        return page, root.findtext("NextMarker") or ""

    def read_into(self, container: str, blob: str, start: int, buf: memoryview) -> int | None:
        """Read ``len(buf)`` bytes from ``start`` into ``buf`` (``None``: no such blob)."""
        if len(buf) == 0:
            return 0
        url = self.url(container, blob)
        # the reader sends exactly this Range header: sign it
        headers = self.sign("GET", url, {"Range": f"bytes={start}-{start + len(buf) - 1}"})
        return self.reader.read_into(url, start, buf, headers)
