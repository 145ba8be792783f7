"""A :class:`KvStore` over any fsspec filesystem (local, memory, zip, http, s3, gcs, ...)."""

from __future__ import annotations

import builtins
import os
import stat
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

from ocdbt_py.errors import ReadOnlyError, StorageError
from ocdbt_py.kvstore.base import (
    ByteRange,
    KvStore,
    ReadRequest,
    check_range,
    normalize_request,
)
from ocdbt_py.kvstore.coalesce import coalesced_get_many
from ocdbt_py.kvstore.credentials import storage_failure
from ocdbt_py.kvstore.keys import validate_key, validate_prefix
from ocdbt_py.kvstore.local import open_beneath, open_dir_beneath, symlink_error

__all__ = ["FsspecStore"]

#: Protocols that fsspec can only read.
_READ_ONLY_PROTOCOLS = {"http", "https", "zip", "tar", "github", "reference", "libarchive"}


def _is_missing(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return True
    # aiohttp / fsspec http raise these for 404s in some versions
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return status == 404


def _fit(data: bytes, start: int, stop: int | None) -> bytes:
    """The answer to a read of ``[start, stop)``: a body longer than the range is a whole object
    from a server that ignored ``Range`` (plain HTTP servers), so the range is cut out of it."""
    if stop is not None and len(data) > stop - start:
        return data[start:stop]
    return data


#: Opening a key only to see that no link leads to it: ``O_PATH`` (Linux) opens neither the
#: file's data nor a FIFO, and with ``O_NOFOLLOW`` gives a descriptor of a final link itself.
_PROBE_FLAGS = getattr(os, "O_PATH", os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))


def local_target(fs: Any, root: str) -> tuple[str, bool] | None:
    """``(local directory, plain)`` when the innermost filesystem of ``fs`` is fsspec's local
    one: the directory that holds the store rooted at ``root``, and whether ``fs`` is that
    plain ``LocalFileSystem`` itself (not wrapped).  Looks through the caching filesystems
    (``simplecache``/``filecache``/``blockcache``: same paths, target in ``.fs``) and
    ``dir::`` (``.fs`` below ``.path``); ``None`` for anything else (archives, remote stores,
    unknown wrappers)."""
    # optional: fsspec is imported only by the stores that use it
    from fsspec.implementations.cached import CachingFileSystem
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    path, plain = root, True
    for _ in range(32):
        if isinstance(fs, LocalFileSystem):
            return str(LocalFileSystem._strip_protocol(path)), plain and type(fs) is LocalFileSystem
        if isinstance(fs, CachingFileSystem):
            fs = fs.fs
        elif isinstance(fs, DirFileSystem):
            path, fs = fs._join(path), fs.fs
        else:
            return None
        plain = False
    return None


#: The extra that installs the fsspec backend of a URL scheme (``pip install 'ocdbt-py[EXTRA]'``).
_SCHEME_EXTRAS = {"http": "http", "https": "http", "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs",
                  "az": "azure", "abfs": "azure", "abfss": "azure"}


def _dir_root(fs: Any, root: str) -> str:
    """The store root for ``url_to_fs``'s answer: in a ``dir::<url>`` chain the URL's path
    names the ``DirFileSystem``'s own directory (its ``path``), which is ``""`` inside it."""
    if getattr(fs, "protocol", None) == "dir" and root and root.rstrip("/") == str(getattr(fs, "path", "")).rstrip("/"):
        return ""
    return root


class FsspecStore(KvStore):
    """Keys are paths below ``root`` on the fsspec filesystem ``fs``.

    Build one with :meth:`from_url`; ``storage_options`` go straight to fsspec.

    When the innermost filesystem is a local directory (``simplecache::file://``,
    ``filecache::``, ``blockcache::``, ``dir::file://``, or fsspec's ``LocalFileSystem`` itself,
    which :func:`~ocdbt_py.kvstore.open_kvstore` opens as a :class:`LocalStore` instead), no
    symbolic link takes an operation out of the root, as in :class:`LocalStore`: before fsspec
    sees a key's path, the path is opened in that directory, for reads and sizes resolved
    beneath the root (links that stay inside followed, see
    :func:`~ocdbt_py.kvstore.local.open_beneath`), for writes and streaming
    (:meth:`fsspec_location`) with no link followed at all, and a link refused raises
    :class:`StorageError` naming it (never its target).  Writes refuse a link anywhere in the
    key, the last component included;
    :meth:`delete` refuses a linked directory but removes a linked key itself (the link, never
    its target), like :class:`LocalStore`.  Listings are :class:`LocalStore`'s: a linked
    directory is not descended into (its files are not listed, and it is not a directory
    of the store), a linked file is listed by name (reading it is refused; its size is
    unknown), and listing a prefix whose directory is a link raises.  The root itself may be a
    link.  The check comes before fsspec opens the path, so a link swapped in between the two
    by someone writing to the directory at the same time is not caught (:class:`LocalStore`
    opens what it checked).
    """

    #: :meth:`get_many` merges ranges of one object separated by at most this many bytes
    coalesce_gap: int = 1 << 20
    #: ... as long as a merged request stays within this many bytes
    coalesce_max_span: int = 32 << 20
    #: the local directory below which no link is followed (the innermost fs is local), else None
    _no_follow: str | None = None
    _plain_local: bool = False

    def __init__(self, fs: Any, root: str, *, read_only: bool | None = None):
        self.fs = fs
        self.root = root.rstrip("/")
        protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        if read_only is None:
            read_only = bool(set(protos) & _READ_ONLY_PROTOCOLS)
        self.read_only = read_only
        self._http = bool(set(protos) & {"http", "https"})
        target = local_target(fs, self.root)
        if target is not None:
            self._no_follow, self._plain_local = target

    @classmethod
    def from_url(
        cls,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        read_only: bool | None = None,
    ) -> FsspecStore:
        """Open the filesystem for ``url`` (any fsspec URL, chained URLs included)."""
        # optional: fsspec loads its backends on first use
        import fsspec.core

        try:
            fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except ImportError as e:
            scheme = url.split("://", 1)[0].rsplit("::", 1)[-1].lower() if "://" in url else ""
            extra = _SCHEME_EXTRAS.get(scheme)
            hint = f"pip install 'ocdbt-py[{extra}]'" if extra else "install the fsspec backend it names"
            raise StorageError(f"cannot open {url}: the {scheme or 'fsspec'} backend needs an optional package "
                               f"that is not installed ({hint}; fsspec says: {e})") from e
        except ValueError as e:
            raise StorageError(f"cannot open {url}: {e}") from e
        return cls(fs, _dir_root(fs, root), read_only=read_only)

    @property
    def url(self) -> str:
        try:
            if self.fs.protocol == "dir":  # name the directory, not the path inside it
                return f"dir::{self.fs.fs.unstrip_protocol(self.fs._join(self.root))}"
            return str(self.fs.unstrip_protocol(self.root))
        except Exception:  # pragma: no cover - exotic filesystems
            return self.root

    def plain_local_root(self) -> str | None:
        """The directory of this store when its filesystem is fsspec's plain
        ``LocalFileSystem`` (a :class:`LocalStore` there loses nothing), else ``None``."""
        return (self._no_follow or "/") if self._plain_local else None

    def _path(self, key: str, *, last_may_be_link: bool = False, write: bool = False) -> str:
        """The fsspec path of ``key``, once the key is known to stay below a local root: for a
        read, resolved beneath it (links inside followed); for a ``write``, through no link at
        all (``last_may_be_link``: its directories only)."""
        validate_key(key)
        if self._no_follow is not None:
            self._refuse_links(key, last_may_be_link, write)
        return f"{self.root}/{key}" if self.root else key

    def _refuse_links(self, key: str, last_may_be_link: bool, write: bool) -> None:
        """Raise :class:`StorageError` naming the first symbolic link on ``key``'s path below
        the local root that the operation may not follow (reads: one leading out of the root;
        writes: any).  An absent or unreachable component ends the check quietly: every
        component before it was checked, and the operation itself then fails the same way."""
        root = self._no_follow
        assert root is not None
        parts = key.split("/")
        try:
            if last_may_be_link or write:
                dfd = open_dir_beneath(root, parts[:-1], url=self.url)  # no link followed
                try:
                    if not last_may_be_link and stat.S_ISLNK(os.stat(parts[-1], dir_fd=dfd,
                                                                     follow_symlinks=False).st_mode):
                        raise symlink_error(self.url, key)
                finally:
                    os.close(dfd)
                return
            os.close(open_beneath(root, key, _PROBE_FLAGS, url=self.url, validated=True))  # resolved beneath
        except StorageError:
            raise
        except OSError:
            return

    # -- capabilities ----------------------------------------------------------------------
    def fsspec_location(self, key: str = "") -> tuple[Any, str] | None:
        """``(fs, path)``; below a local root, a key reached through any link is refused first
        (streaming writers use it: they follow no link)."""
        return self.fs, (self._path(key, write=True) if key else self.root)

    @property
    def _protocols(self) -> set[str]:
        protos = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        return set(protos)

    @property
    def is_remote(self) -> bool:
        return not (self._protocols & {"file", "local", "memory"})

    @property
    def renames_atomically(self) -> bool:
        # Orbax and our save write in place on object stores; commit_success.txt commits there
        return bool(self._protocols & {"file", "local"})

    def _fail(self, what: str, key: str, exc: BaseException) -> StorageError:
        return storage_failure(what, f"{self.url}/{key}", exc)

    # -- reading -------------------------------------------------------------------------
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        path = self._path(key)
        check_range(byte_range)
        try:
            if byte_range is None:
                return bytes(self.fs.cat_file(path))
            start, stop = byte_range
            if stop is not None and stop <= start:
                # zero-length read: existence check only
                return b"" if self.fs.exists(path) and not self.fs.isdir(path) else None
            if start < 0:
                size = self.fs.size(path)
                start = max(size + start, 0)
            return _fit(bytes(self.fs.cat_file(path, start=start, end=stop)), start, stop)
        except Exception as e:
            if _is_missing(e):
                return None
            raise self._fail("reading", key, e) from e

    def size(self, key: str) -> int | None:
        path = self._path(key)
        try:
            info = self.fs.info(path)
        except Exception as e:
            if _is_missing(e):
                return None
            raise self._fail("reading", key, e) from e
        if info.get("type") == "directory":
            return None
        size = info.get("size")
        if size is None:  # some filesystems (http without Content-Length) do not know
            data = self.get(key)
            return None if data is None else len(data)
        return int(size)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        """Read many keys or ranges; on async filesystems nearby ranges of one object are
        merged (within :attr:`coalesce_gap` bytes, up to :attr:`coalesce_max_span` per request)
        and all requests go out concurrently in one event-loop call."""
        reqs = [normalize_request(r) for r in requests]
        if len(reqs) <= 1 or not getattr(self.fs, "async_impl", False):
            return super().get_many(reqs)

        return coalesced_get_many(
            reqs, self._fetch_concurrently, gap=self.coalesce_gap, max_span=self.coalesce_max_span
        )

    def _fetch_concurrently(self, reqs: Sequence[tuple[str, ByteRange | None]]) -> list[bytes | None]:
        """Issue ``reqs`` (already coalesced) concurrently; ``None`` for missing objects."""
        for _, r in reqs:
            check_range(r)
        # whole objects and plain ranges go out in one cat_ranges call; suffixes and
        # zero-length reads (existence checks) take the single-request path
        simple = [
            i for i, (_, r) in enumerate(reqs) if r is None or (r[0] >= 0 and r[1] is not None and r[1] > r[0])
        ]
        out: list[bytes | None] = [None] * len(reqs)
        if len(simple) == 1:
            k, r = reqs[simple[0]]
            out[simple[0]] = self.get(k, r)
        elif simple:
            paths = [self._path(reqs[i][0]) for i in simple]
            starts = [None if reqs[i][1] is None else reqs[i][1][0] for i in simple]  # type: ignore[index]
            ends = [None if reqs[i][1] is None else reqs[i][1][1] for i in simple]  # type: ignore[index]
            try:
                results = self.fs.cat_ranges(paths, starts, ends, on_error="return")
            except Exception as e:
                raise self._fail("reading", reqs[simple[0]][0], e) from e
            for i, res in zip(simple, results):
                if isinstance(res, BaseException):
                    if _is_missing(res):
                        continue
                    raise self._fail("reading", reqs[i][0], res) from res
                rng = reqs[i][1]
                out[i] = bytes(res) if rng is None else _fit(bytes(res), rng[0], rng[1])
        done = set(simple)
        for i, (k, r) in enumerate(reqs):
            if i not in done:
                out[i] = self.get(k, r)
        return out

    def list(
        self, prefix: str = "", *, start: str | None = None, stop: str | None = None
    ) -> Iterator[str]:
        for key, _ in self._listed(prefix, start, stop):
            yield key

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int | None]]:
        yield from self._listed(prefix, None, None, sized=True)

    def _listed(
        self, prefix: str, start: str | None, stop: str | None, *, sized: bool = False
    ) -> builtins.list[tuple[str, int | None]]:
        validate_prefix(prefix)
        slash = prefix.rfind("/")
        top = prefix[: slash + 1] if slash >= 0 else ""
        if self._no_follow is not None:
            return self._filtered(self._local_find(top, prefix, sized), prefix, start, stop)
        base = f"{self.root}/{top}".rstrip("/") if (self.root or top) else ""
        try:
            found = self._find(base)
        except FileNotFoundError:
            found = []
        except Exception as e:
            raise self._fail("listing", prefix, e) from e
        root = self.fs._strip_protocol(self.root).rstrip("/") if self.root else ""
        if self._http:
            root = urllib.parse.unquote(root)
        n = len(root) + 1 if root else 0
        found_keys: builtins.list[tuple[str, int | None]] = []
        for p, size in found:
            p = self.fs._strip_protocol(p)
            if self._http:
                p = urllib.parse.unquote(p)
            if n and not p.startswith(root + "/"):
                continue  # the root itself: ``find`` of a path that is one object answers with it
            key = p[n:].lstrip("/")
            if key:
                found_keys.append((key, size))
        return self._filtered(found_keys, prefix, start, stop)

    @staticmethod
    def _filtered(
        found: builtins.list[tuple[str, int | None]], prefix: str, start: str | None, stop: str | None
    ) -> builtins.list[tuple[str, int | None]]:
        """The keys of ``found`` below ``prefix`` and in ``[start, stop)``, sorted as bytes."""
        keys = []
        pb, lo = prefix.encode(), None if start is None else start.encode()
        hi = None if stop is None else stop.encode()
        for key, size in found:
            kb = key.encode("utf-8", "surrogateescape")
            if not kb.startswith(pb) or (lo is not None and kb < lo) or (hi is not None and kb >= hi):
                continue
            keys.append((kb, size))
        keys.sort()
        return [(kb.decode("utf-8", "surrogateescape"), size) for kb, size in keys]

    def _local_find(self, top: str, prefix: str, sized: bool) -> builtins.list[tuple[str, int | None]]:
        """Every key below directory ``top`` of the local root (``sized``: with the sizes of
        regular files), walked as :meth:`LocalStore.list` walks: with directory descriptors,
        never into a linked directory; a link in ``top`` itself raises."""
        root = self._no_follow
        assert root is not None
        try:
            dfd = open_dir_beneath(root, [n for n in top.split("/") if n], url=self.url)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except StorageError:
            raise
        except OSError as e:
            raise self._fail("listing", prefix, e) from e
        pb = prefix.encode()
        out: builtins.list[tuple[str, int | None]] = []
        try:
            for dirpath, dirnames, filenames, fd in os.fwalk(".", dir_fd=dfd):  # never follows links
                rel = "" if dirpath == "." else dirpath[2:] + "/"
                relb = top.encode() + rel.encode("utf-8", "surrogateescape")
                # prune directories that cannot hold a key with the prefix
                dirnames[:] = [
                    d for d in dirnames
                    if (relb + d.encode("utf-8", "surrogateescape") + b"/").startswith(pb)
                    or pb.startswith(relb + d.encode("utf-8", "surrogateescape") + b"/")
                ]
                for f in filenames:
                    size = None
                    if sized:
                        try:
                            st = os.stat(f, dir_fd=fd, follow_symlinks=False)
                        except OSError:
                            continue  # removed while listing
                        size = st.st_size if stat.S_ISREG(st.st_mode) else None
                    out.append((top + rel + f, size))
        except OSError as e:
            raise self._fail("listing", prefix, e) from e
        finally:
            os.close(dfd)
        return out

    def _find(self, base: str) -> builtins.list[tuple[str, int | None]]:
        """Every file below directory path ``base`` (recursively), as ``fs.find`` gives it,
        with its size where the listing says it."""
        if self._http:
            return [(p, None) for p in self._http_find(base + "/")]
        found = self.fs.find(base, withdirs=False, detail=True)
        if isinstance(found, builtins.list):  # adlfs, when base is a file: [path] despite detail=True
            found = {p: None for p in found if isinstance(p, str)}
        out: builtins.list[tuple[str, int | None]] = []
        for p, info in found.items():
            size = info.get("size") if isinstance(info, dict) else None
            out.append((p, int(size) if isinstance(size, int) and size >= 0 else None))
        return out

    def _http_find(self, top: str) -> builtins.list[str]:
        """Recursive listing from HTML directory indexes (directories end with ``/``)."""
        out: list[str] = []
        stack = [top]
        seen = 0
        while stack:
            d = stack.pop()
            seen += 1
            if seen > 100_000:
                raise StorageError(f"listing {self.url} visited too many directories")
            for e in self.fs.ls(d, detail=True):
                name = e["name"]
                if not name.startswith(d) or name == d:
                    continue  # parent links and the like
                if e.get("type") == "directory" or name.endswith("/"):
                    stack.append(name if name.endswith("/") else name + "/")
                else:
                    out.append(name)
        return out

    # -- writing -------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.url} is read-only")

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        path = self._path(key, write=True)
        self._check_writable()
        try:
            parent = path.rsplit("/", 1)[0]
            if parent != path:
                self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(path, bytes(value))
        except Exception as e:
            raise self._fail("writing", key, e) from e

    def delete(self, key: str) -> None:
        path = self._path(key, last_may_be_link=True)  # a linked key: the link is removed
        self._check_writable()
        try:
            self.fs.rm_file(path)
        except Exception as e:
            if _is_missing(e):
                return
            raise self._fail("deleting", key, e) from e


