"""Storage backends behind one small interface, :class:`KvStore`.

Use :func:`open_kvstore` to get a store for a path or any fsspec URL.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ocdbt_py.errors import UnsupportedError
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
        # heavy: backends load fsspec and client libraries, only for URLs that need them
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

    Local paths (``file://`` and ``local://`` URLs too, with any storage options) use the fast
    :class:`LocalStore`; ``s3://``, ``gs://``/``gcs://``, ``az://``/``abfs://`` and
    ``http(s)://`` URLs use obstore (:mod:`ocdbt_py.kvstore.obstore_store`) when it is installed
    and takes the options, else the fsspec object-store backends (atomic conditional writes
    through each service's preconditions); everything else goes through :class:`FsspecStore`.
    ``backend="fsspec"``/``"obstore"`` among the options (or ``OCDBT_PY_BACKEND``) picks one.
    ``storage_options`` go to fsspec, except ``single_writer=True``, which allows committing
    where the storage cannot make conditional writes atomic (safe only with one writer
    process).  A :class:`KvStore` is returned unchanged.
    """
    if isinstance(location, KvStore):
        return location
    loc = os.fspath(location)
    if not isinstance(loc, str):
        raise TypeError(f"expected a path or URL, got {type(location).__name__}")
    if not storage_options or set(storage_options) == {"single_writer"}:  # local: always atomic
        if loc.startswith("file://") and "::" not in loc:
            return LocalStore(loc[len("file://"):], read_only=read_only)
        if not _URL.match(loc) and "::" not in loc:
            return LocalStore(loc, read_only=read_only)
    fast = _obstore(loc, storage_options, read_only)
    if fast is not None:
        return fast
    backend = _object_store_class(loc)
    if backend is not None:
        return backend.from_url(loc, storage_options, read_only=True if read_only else None)
    # heavy: backends load fsspec and client libraries, only for URLs that need them
    from ocdbt_py.kvstore.fsspec_store import FsspecStore

    opts = dict(storage_options or {})
    single_writer = bool(opts.pop("single_writer", False))
    opts.pop("backend", None)
    store = FsspecStore.from_url(loc, opts, read_only=True if read_only else None)
    local = store.plain_local_root()
    if local is not None:  # local://, file:// with storage options: nothing of fsspec's is lost
        return LocalStore(local, read_only=store.read_only)
    if single_writer and not store.read_only:
        # heavy: backends load fsspec and client libraries, only for URLs that need them
        from ocdbt_py.kvstore.single_writer import SingleWriterStore

        return SingleWriterStore(store)
    return store


_OBSTORE_SCHEMES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "http", "https"}


def _obstore(loc: str, storage_options: dict[str, Any] | None, read_only: bool) -> KvStore | None:
    """The obstore backend for ``loc`` when obstore is installed and takes these options
    (``backend="fsspec"`` in the options, or ``OCDBT_PY_BACKEND=fsspec``, declines it); else
    ``None``.  ``backend="obstore"`` makes a refusal an error instead of the fsspec route."""
    want = (storage_options or {}).get("backend") or os.environ.get("OCDBT_PY_BACKEND") or "auto"
    if want not in ("auto", "obstore", "fsspec"):
        raise ValueError(f"backend must be 'obstore' or 'fsspec', not {want!r}")
    scheme = loc.split("://", 1)[0].lower() if "://" in loc else ""
    if want == "fsspec" or "::" in loc or scheme not in _OBSTORE_SCHEMES:
        return None
    try:
        # optional: obstore is an extra (the [s3], [gcs], [azure] and [http] extras bring it)
        from ocdbt_py.kvstore.obstore_options import Untranslatable
        from ocdbt_py.kvstore.obstore_store import ObstoreStore

        opts = {**(storage_options or {}), "backend": want}  # "obstore" from the environment insists too
        return ObstoreStore.from_url(loc, opts, read_only=True if read_only else None)
    except (ImportError, Untranslatable) as e:
        if want == "obstore":
            raise UnsupportedError(f"cannot open {loc} through obstore: {e}") from e
        return None


def _object_store_class(loc: str) -> Any:
    """The object-store backend for an ``s3://``, ``gs://``/``gcs://`` or ``az://``/``abfs[s]://``
    URL (not chained with ``::``), else ``None``."""
    if "::" in loc:
        return None
    scheme = loc.split("://", 1)[0].lower() if "://" in loc else ""
    if scheme in ("s3", "s3a"):
        # heavy: backends load fsspec and client libraries, only for URLs that need them
        from ocdbt_py.kvstore.s3 import S3Store

        return S3Store
    if scheme in ("gs", "gcs"):
        # heavy: backends load fsspec and client libraries, only for URLs that need them
        from ocdbt_py.kvstore.gcs import GcsStore

        return GcsStore
    if scheme in ("az", "abfs", "abfss"):
        # heavy: backends load fsspec and client libraries, only for URLs that need them
        from ocdbt_py.kvstore.azure import AzureStore

        return AzureStore
    return None
