"""GCS reads over the JSON API, sent by us on the threaded HTTP reader (see :mod:`.direct`).

Used when gcsfs's configuration is one we fully understand: anonymous access (an emulator
through ``STORAGE_EMULATOR_HOST`` or ``endpoint_url``, or ``token="anon"``), or credentials
gcsfs already holds, whose bearer token it keeps fresh (``fs.credentials.apply``); with no
options beyond :data:`_PLAIN_OPTIONS`, no requester-pays project, no proxies, and neither
``OCDBT_PY_THREADED_HTTP`` nor ``OCDBT_PY_GCS_OWN_HTTP`` set to ``0``.

Requests: ``GET {endpoint}/download/storage/v1/b/{bucket}/o/{object}?alt=media`` with a
``Range`` header for data, ``GET .../storage/v1/b/{bucket}/o/{object}`` for the size, and
``GET .../storage/v1/b/{bucket}/o?prefix=...&pageToken=...`` for listings.  Any status other
than the expected ones raises :class:`~ocdbt_py.kvstore.direct.Fallback` and gcsfs takes over.
"""

from __future__ import annotations

import builtins
import json
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from ocdbt_py.kvstore.direct import ERROR_BODY, Fallback, off, proxied, range_headers, ranged_answer
from ocdbt_py.kvstore.rangeio import HttpRangeReader, HttpStatusError

__all__ = ["GcsDirect"]

#: gcsfs options the direct path understands (others: gcsfs only)
_PLAIN_OPTIONS = frozenset({
    "token", "project", "access", "endpoint_url", "default_location", "cache_timeout", "skip_instance_cache",
    "use_listings_cache", "listings_expiry_time", "secure_serialize", "check_connection", "timeout",
    "block_size", "consistency", "asynchronous", "loop", "version_aware",
})
#: largest listing page or metadata document read
MAX_JSON = 32 << 20
#: most listing pages followed for one listing
MAX_PAGES = 10_000


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class GcsDirect:
    """Reads of one GCS endpoint (``location``), authorised by ``auth`` (adds headers) or anonymous."""

    #: objects asked for per listing page (GCS gives at most 1000)
    page_size = 1000

    def __init__(self, reader: HttpRangeReader, location: str, auth: Callable[[dict[str, str]], None] | None):
        self.reader = reader
        self.location = location.rstrip("/")
        self.auth = auth

    @classmethod
    def from_fs(cls, fs: Any, options: Mapping[str, Any], reader_for: Callable[[Any], HttpRangeReader],
                env: Mapping[str, str] | None = None) -> GcsDirect | None:
        """A direct reader for the gcsfs filesystem ``fs`` opened with ``options``, or ``None``."""
        env = os.environ if env is None else env
        if off(env, "OCDBT_PY_THREADED_HTTP") or off(env, "OCDBT_PY_GCS_OWN_HTTP") or proxied(env):
            return None
        if not set(options) <= _PLAIN_OPTIONS or getattr(fs, "requester_pays", False):
            return None
        if getattr(fs, "session_kwargs", None):
            return None
        location = getattr(fs, "_location", None)
        if not isinstance(location, str):
            return None
        u = urllib.parse.urlsplit(location)
        if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment or u.path not in ("", "/"):
            return None
        creds = getattr(fs, "credentials", None)
        if creds is None:
            return None
        auth = None if getattr(creds, "credentials", None) is None else creds.apply
        if auth is None and getattr(creds, "method", "anon") != "anon":
            return None
        return cls(reader_for(None), location, auth)

    # -- requests ------------------------------------------------------------------------------
    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = dict(extra or {})
        if self.auth is not None:
            try:
                self.auth(h)
            except Exception as e:  # noqa: BLE001 - refreshing the token failed: gcsfs reports it
                raise Fallback(f"credentials: {type(e).__name__}") from e
        return h

    def _call(self, method: str, url: str, headers: dict[str, str] | None, max_body: int
              ) -> tuple[int, dict[str, str], bytes]:
        try:
            return self.reader.request(method, url, self._headers(headers), max_body=max_body)
        except HttpStatusError as e:
            raise Fallback(str(e)) from e

    def media_url(self, bucket: str, name: str) -> str:
        """The URL of an object's bytes."""
        return f"{self.location}/download/storage/v1/b/{_q(bucket)}/o/{_q(name)}?alt=media"

    def get(self, bucket: str, name: str, start: int, stop: int | None, *, max_body: int) -> bytes | None:
        """Bytes ``[start, stop)``; ``None`` if the object does not exist; ``b""`` past its end."""
        headers = range_headers(start, stop, "gcsfs")
        status, _, body = self._call("GET", self.media_url(bucket, name), headers, max(max_body, ERROR_BODY))
        return ranged_answer(status, body, start, stop)

    def head(self, bucket: str, name: str) -> int | None:
        """The object's size; ``None`` if it does not exist."""
        status, _, body = self._call("GET", f"{self.location}/storage/v1/b/{_q(bucket)}/o/{_q(name)}", None, MAX_JSON)
        if status == 404:
            return None
        if status != 200:
            raise Fallback(f"HTTP {status}")
        size = self._json(body).get("size")
        if not (isinstance(size, (str, int)) and str(size).isdigit()):
            raise Fallback("object metadata without a size")
        return int(size)

    def list(self, bucket: str, prefix: str) -> builtins.list[tuple[str, int]]:
        """Every ``(name, size)`` below ``prefix`` (recursively)."""
        out: list[tuple[str, int]] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            q = [("prefix", prefix), ("maxResults", str(self.page_size))]
            if token:
                q.append(("pageToken", token))
            url = f"{self.location}/storage/v1/b/{_q(bucket)}/o?" + urllib.parse.urlencode(q)
            status, _, body = self._call("GET", url, None, MAX_JSON)
            if status != 200:
                raise Fallback(f"HTTP {status}")
            doc = self._json(body)
            items = doc.get("items", [])
            if not isinstance(items, list):
                raise Fallback("listing without items")
            for it in items:
                name, size = (it.get("name"), it.get("size")) if isinstance(it, dict) else (None, None)
                if not isinstance(name, str) or not (isinstance(size, (str, int)) and str(size).isdigit()):
                    raise Fallback("listing entry without name or size")
                out.append((name, int(size)))
            token = doc.get("nextPageToken")
            if not token:
                return out
            if not isinstance(token, str):
                raise Fallback("listing with a malformed page token")
        raise Fallback("listing has too many pages")

    def read_into(self, bucket: str, name: str, start: int, buf: memoryview) -> int | None:
        """Read ``len(buf)`` bytes from ``start`` into ``buf`` (``None``: no such object)."""
        return self.reader.read_into(self.media_url(bucket, name), start, buf, self._headers())

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise Fallback("unreadable JSON response") from e
        if not isinstance(doc, dict):
            raise Fallback("unexpected JSON response")
        return doc
