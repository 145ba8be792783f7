"""Opening the locations a command names: one check for missing paths, a bounded wait for
object stores, and helpful errors for checkpoint directories.

:func:`check_locations` runs before every command (from :mod:`ocdbt_py.cli.app`): each
location declared with ``add_location(..., must_exist=True)`` must exist, else the command
ends with ``error: URL does not exist`` and exit status 1, whatever the command.  On an
object store that check is the first request, made with ``--timeout`` as its deadline, so
an unreachable store fails in seconds with one line.

An Orbax checkpoint *item* directory is an OCDBT database (``manifest.ocdbt`` at its root).
When the location is not a database but directories below it are (a checkpoint step
directory, or a checkpoint root), :func:`open_kvstore_checked` raises a
:class:`~ocdbt_py.cli.errors.UsageError` (exit status 2) listing them.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ocdbt_py.cli.errors import CliError, UsageError
from ocdbt_py.cli.options import DEFAULT_TIMEOUT, LOCATIONS, is_remote, storage_options
from ocdbt_py.errors import NotFoundError
from ocdbt_py.kvstore import open_kvstore

if TYPE_CHECKING:
    from ocdbt_py.kvstore.base import KvStore
    from ocdbt_py.store import OcdbtStore

__all__ = [
    "open_database",
    "open_kvstore_checked",
    "find_item_dirs",
    "normalize_url",
    "check_locations",
    "require_location",
    "missing",
    "not_a_database",
    "with_deadline",
]

T = TypeVar("T")

#: Set when a call was abandoned past its deadline: the ``ocdbt`` program then exits at once
#: rather than wait at interpreter shutdown for the storage library's worker threads.
ABANDONED = threading.Event()

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
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.store import OcdbtStore

    kv = open_kvstore_checked(args)
    if version is None:
        version = getattr(args, "version", None)
    return OcdbtStore(kv, version=version)


def missing(url: str, fix: str = "") -> CliError:
    """The one error for a location that does not exist (exit status 1, every command);
    ``fix``, when given, follows it after a semicolon."""
    return CliError(f"{url} does not exist" + (f"; {fix}" if fix else ""))


def with_deadline(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()``, or a one-line :class:`CliError` when it has not returned within ``seconds``
    (``0``: no limit).  The call runs in a daemon thread, which is left behind on timeout
    (the command is about to end)."""
    if not seconds:
        return fn()
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=call, name="ocdbt-first-contact", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        ABANDONED.set()
        raise CliError(f"{what}: no answer within {seconds:g} s (network or endpoint unreachable? "
                       "--timeout SECONDS to wait longer, --debug for details)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _remote_kind(url: str, args: argparse.Namespace) -> str | None:
    """``"dir"`` (a database, or a directory with something in it), ``"file"`` or ``None``."""
    opts = storage_options(args, url)
    kv = open_kvstore(url, opts, read_only=True)
    if kv.exists(_MANIFEST) or next(iter(kv.list("")), None) is not None:
        return "dir"
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/") or parent.endswith(":"):
        return None  # a bucket's root
    return "file" if open_kvstore(parent, opts, read_only=True).exists(name) else None


def not_a_database(url: str) -> CliError:
    """The one error for a plain file given where a database or checkpoint is expected."""
    return CliError(f"{url} is a file, not a database or checkpoint: give the directory that holds "
                    f"{_MANIFEST}, or a checkpoint item, step or root directory")


def _local_path(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def require_location(args: argparse.Namespace, dest: str = "url", fix: str = "", file_ok: bool = False) -> None:
    """Raise :func:`missing` (with ``fix``) unless the location ``args.<dest>`` exists, and
    :func:`not_a_database` when it is a plain file (unless ``file_ok``); on object stores, the
    answer must come within ``args.timeout`` seconds."""
    url = getattr(args, dest, None)
    if not isinstance(url, str):
        return
    loc = normalize_url(url)
    if is_remote(loc):
        timeout = getattr(args, "timeout", DEFAULT_TIMEOUT)
        kind = with_deadline(lambda: _remote_kind(loc, args), timeout, url)
    else:
        path = _local_path(loc)
        kind = "file" if os.path.isfile(path) else "dir" if os.path.exists(path) else None
    if kind is None:
        raise missing(url, fix)
    if kind == "file" and not file_ok:
        raise not_a_database(url)


def check_locations(args: argparse.Namespace) -> None:
    """:func:`require_location` for every location of the command declared ``must_exist``."""
    for dest, must_exist, *rest in getattr(args, LOCATIONS, None) or []:
        if must_exist:
            require_location(args, dest, file_ok=bool(rest and rest[0]))
