"""Validation of keys and relative paths before they reach a storage backend.

A key is a ``/``-separated relative path.  Hostile input (a data-file table entry in a crafted
database, a zarr metadata field, a user argument) must never make a backend touch anything
outside the store's root, so every key is checked here first.
"""

from __future__ import annotations

import re

from ocdbt_py.errors import InvalidKeyError

__all__ = ["validate_key", "validate_prefix", "join_key", "MAX_KEY_BYTES"]

#: Longest key accepted, in UTF-8 bytes (OCDBT full paths are limited to 65535 bytes).
MAX_KEY_BYTES = 65535

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _check_text(key: str, what: str) -> None:
    if not isinstance(key, str):
        raise InvalidKeyError(f"{what} must be str, not {type(key).__name__}")
    if "\x00" in key:
        raise InvalidKeyError(f"{what} {key!r} contains NUL")
    if "\\" in key:
        raise InvalidKeyError(f"{what} {key!r} contains a backslash")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"{what} is longer than {MAX_KEY_BYTES} bytes")
    if key.startswith("/") or key.startswith("~"):
        raise InvalidKeyError(f"{what} {key!r} is absolute")
    if _SCHEME.match(key):
        raise InvalidKeyError(f"{what} {key!r} looks like a URL or drive path")


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`InvalidKeyError`.

    Rejected: empty keys, empty / ``.`` / ``..`` segments, absolute paths, backslashes, NUL,
    URL schemes (``s3:``, ``C:``) and keys over 65535 bytes.
    """
    _check_text(key, "key")
    if key == "":
        raise InvalidKeyError("key is empty")
    for seg in key.split("/"):
        if seg in ("", ".", ".."):
            raise InvalidKeyError(f"key {key!r} has an empty, '.' or '..' segment")
    return key


def validate_prefix(prefix: str) -> str:
    """Validate a listing prefix: like a key, but it may be empty or end with ``/``."""
    _check_text(prefix, "prefix")
    if prefix == "":
        return prefix
    body = prefix[:-1] if prefix.endswith("/") else prefix
    if body:
        for seg in body.split("/"):
            if seg in (".", ".."):
                raise InvalidKeyError(f"prefix {prefix!r} has a '.' or '..' segment")
            if seg == "":
                raise InvalidKeyError(f"prefix {prefix!r} has an empty segment")
    else:
        raise InvalidKeyError("prefix '/' is absolute")
    return prefix


def join_key(*parts: str) -> str:
    """Join non-empty path parts with ``/`` and validate the result as a key."""
    return validate_key("/".join(p.strip("/") for p in parts if p.strip("/")))
