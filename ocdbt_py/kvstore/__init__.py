"""Storage backends behind one small interface, :class:`KvStore`.

Use :func:`open_kvstore` to get a store for a path or any fsspec URL.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest
from ocdbt_py.kvstore.keys import validate_key, validate_prefix
from ocdbt_py.kvstore.local import LocalStore
from ocdbt_py.kvstore.memory import MemoryStore
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = [
    "ByteRange",
    "KvStore",
    "ReadRequest",
    "LocalStore",
    "MemoryStore",
    "PrefixStore",
    "FsspecStore",
    "open_kvstore",
    "validate_key",
    "validate_prefix",
]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


def __getattr__(name: str) -> Any:
    if name == "FsspecStore":  # imported lazily: fsspec costs import time
        from ocdbt_py.kvstore.fsspec_store import FsspecStore

        return FsspecStore
    raise AttributeError(name)


def open_kvstore(
    location: str | os.PathLike[str] | KvStore,
    storage_options: dict[str, Any] | None = None,
    *,
    read_only: bool = False,
) -> KvStore:
    """Return a :class:`KvStore` for a local path, a ``file://`` URL or any fsspec URL.

    Local paths use the fast :class:`LocalStore`; everything else goes through
    :class:`FsspecStore` with ``storage_options`` passed to fsspec.  A :class:`KvStore` is
    returned unchanged.
    """
    if isinstance(location, KvStore):
        return location
    loc = os.fspath(location)
    if not isinstance(loc, str):
        raise TypeError(f"expected a path or URL, got {type(location).__name__}")
    if not storage_options:
        if loc.startswith("file://") and "::" not in loc:
            return LocalStore(loc[len("file://"):], read_only=read_only)
        if not _URL.match(loc) and "::" not in loc:
            return LocalStore(loc, read_only=read_only)
    from ocdbt_py.kvstore.fsspec_store import FsspecStore

    return FsspecStore.from_url(loc, storage_options, read_only=True if read_only else None)
