"""Opening the database a command names, with helpful errors for checkpoint directories.

An Orbax checkpoint *item* directory is an OCDBT database (``manifest.ocdbt`` at its root).
When the location is not a database but directories below it are (a checkpoint step
directory, or a checkpoint root), :func:`open_kvstore_checked` raises a
:class:`~ocdbt_py.cli.errors.UsageError` (exit status 2) listing them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.options import storage_options

if TYPE_CHECKING:
    from ocdbt_py.kvstore.base import KvStore
    from ocdbt_py.store import OcdbtStore

__all__ = ["open_database", "open_kvstore_checked", "find_item_dirs", "normalize_url"]

_MANIFEST = "manifest.ocdbt"
#: Subdirectories looked into at each level when searching for item databases.
_MAX_SCAN = 200
_MAX_SHOWN = 20


def normalize_url(url: str) -> str:
    """Accept the manifest file itself: ``.../db/manifest.ocdbt`` means ``.../db``."""
    u = url.rstrip("/") if len(url) > 1 else url
    if u == _MANIFEST:
        return "."
    if u.endswith("/" + _MANIFEST):
        return u[: -len(_MANIFEST) - 1] or "/"
    return url


def _subdirs(kv: KvStore, prefix: str) -> list[str]:
    """Names of the directories directly below ``prefix`` (cheaply where the backend allows)."""
    try:
        where = kv.fsspec_location(prefix.strip("/"))
    except Exception:
        where = None
    if where is not None:  # fsspec: one directory listing, not a walk
        fs, path = where
        try:
            entries = fs.ls(path, detail=True)
        except Exception:
            return []
        out = []
        for e in entries:
            if e.get("type") == "directory":
                name = str(e.get("name", "")).rstrip("/").rsplit("/", 1)[-1]
                if name:
                    out.append(name)
        return sorted(out)
    try:
        return kv.list_dir(prefix)[0]
    except Exception:
        return []


def find_item_dirs(kv: KvStore) -> list[str]:
    """Relative paths of OCDBT databases one or two directory levels below ``kv``'s root."""
    found: list[str] = []
    level1 = _subdirs(kv, "")[:_MAX_SCAN]
    for d in level1:
        if kv.exists(f"{d}/{_MANIFEST}"):
            found.append(d)
    if found:
        return found
    for d in level1[:_MAX_SCAN // 10]:
        for sub in _subdirs(kv, d + "/")[:_MAX_SCAN // 10]:
            if kv.exists(f"{d}/{sub}/{_MANIFEST}"):
                found.append(f"{d}/{sub}")
    return found


def _join(url: str, rel: str) -> str:
    return url.rstrip("/") + "/" + rel if url not in ("", ".") else rel


def open_kvstore_checked(args: argparse.Namespace) -> KvStore:
    """The store at ``args.url``; raises a helpful error when it holds no ``manifest.ocdbt``."""
    from ocdbt_py.errors import NotFoundError
    from ocdbt_py.kvstore import open_kvstore

    url = normalize_url(args.url)
    kv = open_kvstore(url, storage_options(args), read_only=True)
    if kv.exists(_MANIFEST):
        return kv
    items = find_item_dirs(kv)
    if not items:
        raise NotFoundError(f"no OCDBT database at {args.url} (no {_MANIFEST} there)")
    shown = "\n".join(f"  {_join(url, d)}" for d in items[:_MAX_SHOWN])
    more = f"\n  ... and {len(items) - _MAX_SHOWN} more" if len(items) > _MAX_SHOWN else ""
    what = "this directory below it holds one" if len(items) == 1 else "these directories below it hold one each"
    cmd = getattr(args, "command", None) or "ls"
    raise UsageError(
        f"{args.url} is not an OCDBT database (no {_MANIFEST}), but {what} "
        f"(a checkpoint step or root directory?):\n{shown}{more}\n"
        f"pass one of them, e.g.: ocdbt {cmd} {_join(url, items[0])}"
    )


def open_database(args: argparse.Namespace, version: Any = None) -> OcdbtStore:
    """Open the database at ``args.url`` (at ``version``, default ``args.version`` if present)."""
    from ocdbt_py.store import OcdbtStore

    kv = open_kvstore_checked(args)
    if version is None:
        version = getattr(args, "version", None)
    return OcdbtStore(kv, version=version)
