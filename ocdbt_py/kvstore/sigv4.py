"""AWS Signature Version 4 for S3 requests, without botocore.

Creating a botocore client loads its JSON service and endpoint models: 0.1-0.2 s of CPU before
the first request, which is a third of a small checkpoint's restore.  The reads a restore
makes (GET, HEAD, ListObjectsV2) need only a signature, which is a few HMACs, so
:mod:`ocdbt_py.kvstore.s3direct` signs them here and keeps botocore for everything else.

Two forms (both with an unsigned payload, as S3 allows):

* :func:`sign_headers`: the ``Authorization`` header and the ``x-amz-*`` headers it covers;
* :func:`presign_url`: a URL that carries the signature in its query (``X-Amz-*`` parameters),
  for a reader that sends plain GETs.

The canonical request is the one the SigV4 documentation defines: the method, the path with
each segment URI-encoded once (S3 does not double-encode), the query parameters sorted and
encoded, the signed headers lower-cased, sorted and trimmed, and the payload hash.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import threading
import urllib.parse
from collections.abc import Mapping

__all__ = ["Credentials", "UNSIGNED_PAYLOAD", "uri_encode", "sign_headers", "presign_url"]

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_ALGORITHM = "AWS4-HMAC-SHA256"
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")


class Credentials:
    """An access key, its secret and an optional session token (never shown by ``repr``)."""

    __slots__ = ("access_key", "secret_key", "token")

    def __init__(self, access_key: str, secret_key: str, token: str | None = None):
        if not access_key or not secret_key:
            raise ValueError("credentials need an access key and a secret key")
        self.access_key = access_key
        self.secret_key = secret_key
        self.token = token or None

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key[:4]}..., secret_key=<hidden>)"


def uri_encode(text: str, *, keep_slash: bool) -> str:
    """Percent-encode the UTF-8 bytes of ``text`` except SigV4's unreserved characters
    (and ``/`` when ``keep_slash``), with upper-case hex digits."""
    out = []
    for b in text.encode("utf-8"):
        if b in _UNRESERVED or (keep_slash and b == 0x2F):
            out.append(chr(b))
        else:
            out.append(f"%{b:02X}")
    return "".join(out)


_key_cache: dict[tuple[str, str, str, str], bytes] = {}
_key_lock = threading.Lock()


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = (secret, date, region, service)
    with _key_lock:
        hit = _key_cache.get(k)
    if hit is not None:
        return hit
    key = hmac.new(("AWS4" + secret).encode("utf-8"), date.encode("ascii"), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    with _key_lock:
        if len(_key_cache) > 64:
            _key_cache.clear()
        _key_cache[k] = key
    return key


def _stamp(now: datetime.datetime | None) -> tuple[str, str]:
    t = (now or datetime.datetime.now(datetime.timezone.utc)).astimezone(datetime.timezone.utc)
    return t.strftime("%Y%m%dT%H%M%SZ"), t.strftime("%Y%m%d")


def _split(url: str) -> tuple[str, str, list[tuple[str, str]]]:
    """``(host header, canonical URI, query pairs)``; the URL's path must already be encoded
    the way it goes on the wire (see :func:`uri_encode`)."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError("SigV4 signs http(s) URLs with a host")
    host = u.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    default = 443 if u.scheme == "https" else 80
    if u.port is not None and u.port != default:
        host = f"{host}:{u.port}"
    pairs = urllib.parse.parse_qsl(u.query, keep_blank_values=True)
    return host, u.path or "/", pairs


def _canonical_query(pairs: list[tuple[str, str]]) -> str:
    enc = sorted((uri_encode(k, keep_slash=False), uri_encode(v, keep_slash=False)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in enc)


def _signature(creds: Credentials, region: str, service: str, amz_date: str, date: str, canonical: str) -> str:
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join((_ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()))
    key = _signing_key(creds.secret_key, date, region, service)
    return hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()


def sign_headers(
    method: str,
    url: str,
    creds: Credentials,
    region: str,
    *,
    headers: Mapping[str, str] | None = None,
    service: str = "s3",
    payload_hash: str = UNSIGNED_PAYLOAD,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """The headers to send with ``method url``: ``headers`` (all of them signed) plus
    ``x-amz-date``, ``x-amz-content-sha256``, ``x-amz-security-token`` (with a session token)
    and ``Authorization``.  ``Host`` is signed too but left to the HTTP client to send."""
    amz_date, date = _stamp(now)
    host, path, pairs = _split(url)
    out = {k: v for k, v in (headers or {}).items()}
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload_hash
    if creds.token:
        out["x-amz-security-token"] = creds.token
    signed = {k.lower(): " ".join(str(v).split()) for k, v in out.items()}
    signed["host"] = host
    names = sorted(signed)
    canonical = "\n".join((
        method.upper(),
        path,
        _canonical_query(pairs),
        "".join(f"{n}:{signed[n]}\n" for n in names),
        ";".join(names),
        payload_hash,
    ))
    sig = _signature(creds, region, service, amz_date, date, canonical)
    out["Authorization"] = (f"{_ALGORITHM} Credential={creds.access_key}/{date}/{region}/{service}/aws4_request, "
                            f"SignedHeaders={';'.join(names)}, Signature={sig}")
    return out


def presign_url(
    method: str,
    url: str,
    creds: Credentials,
    region: str,
    *,
    expires: int = 3600,
    service: str = "s3",
    now: datetime.datetime | None = None,
) -> str:
    """``url`` with a query-string signature valid for ``expires`` seconds (1 to 604800);
    only ``host`` is signed, so the holder may add headers such as ``Range``."""
    if not 1 <= expires <= 604800:
        raise ValueError("a presigned URL expires after 1 to 604800 seconds")
    amz_date, date = _stamp(now)
    host, path, pairs = _split(url)
    pairs = list(pairs) + [
        ("X-Amz-Algorithm", _ALGORITHM),
        ("X-Amz-Credential", f"{creds.access_key}/{date}/{region}/{service}/aws4_request"),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    if creds.token:
        pairs.append(("X-Amz-Security-Token", creds.token))
    query = _canonical_query(pairs)
    canonical = "\n".join((method.upper(), path, query, f"host:{host}\n", "host", UNSIGNED_PAYLOAD))
    sig = _signature(creds, region, service, amz_date, date, canonical)
    u = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path or "/", f"{query}&X-Amz-Signature={sig}", ""))
