"""A :class:`KvStore` over any fsspec filesystem (local, memory, zip, http, s3, gcs, ...)."""

from __future__ import annotations

import builtins
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
from ocdbt_py.kvstore.keys import validate_key, validate_prefix

__all__ = ["FsspecStore"]

#: Protocols that fsspec can only read.
_READ_ONLY_PROTOCOLS = {"http", "https", "zip", "tar", "github", "reference", "libarchive"}


def _is_missing(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return True
    # aiohttp / fsspec http raise these for 404s in some versions
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return status == 404


def _dir_root(fs: Any, root: str) -> str:
    """The store root for ``url_to_fs``'s answer: in a ``dir::<url>`` chain the URL's path
    names the ``DirFileSystem``'s own directory (its ``path``), which is ``""`` inside it."""
    if getattr(fs, "protocol", None) == "dir" and root and root.rstrip("/") == str(getattr(fs, "path", "")).rstrip("/"):
        return ""
    return root


class FsspecStore(KvStore):
    """Keys are paths below ``root`` on the fsspec filesystem ``fs``.

    Build one with :meth:`from_url`; ``storage_options`` go straight to fsspec.
    """

    #: :meth:`get_many` merges ranges of one object separated by at most this many bytes
    coalesce_gap: int = 1 << 20
    #: ... as long as a merged request stays within this many bytes
    coalesce_max_span: int = 32 << 20

    def __init__(self, fs: Any, root: str, *, read_only: bool | None = None):
        self.fs = fs
        self.root = root.rstrip("/")
        protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        if read_only is None:
            read_only = bool(set(protos) & _READ_ONLY_PROTOCOLS)
        self.read_only = read_only
        self._http = bool(set(protos) & {"http", "https"})

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
        except (ImportError, ValueError) as e:
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

    def _path(self, key: str) -> str:
        validate_key(key)
        return f"{self.root}/{key}" if self.root else key

    # -- capabilities ----------------------------------------------------------------------
    def fsspec_location(self, key: str = "") -> tuple[Any, str] | None:
        return self.fs, (self._path(key) if key else self.root)

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
        return StorageError(f"{what} {self.url}/{key} failed: {type(exc).__name__}: {exc}")

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
            return bytes(self.fs.cat_file(path, start=start, end=stop))
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
                out[i] = bytes(res)
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
        yield from self._listed(prefix, None, None)

    def _listed(self, prefix: str, start: str | None, stop: str | None) -> builtins.list[tuple[str, int | None]]:
        validate_prefix(prefix)
        slash = prefix.rfind("/")
        top = prefix[: slash + 1] if slash >= 0 else ""
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
        keys = []
        pb, lo = prefix.encode(), None if start is None else start.encode()
        hi = None if stop is None else stop.encode()
        for p, size in found:
            p = self.fs._strip_protocol(p)
            if self._http:
                p = urllib.parse.unquote(p)
            kb = p[n:].lstrip("/").encode()
            if not kb.startswith(pb) or (lo is not None and kb < lo) or (hi is not None and kb >= hi):
                continue
            keys.append((kb, size))
        keys.sort()
        return [(kb.decode(), size) for kb, size in keys]

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
        path = self._path(key)
        self._check_writable()
        try:
            parent = path.rsplit("/", 1)[0]
            if parent != path:
                self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(path, bytes(value))
        except Exception as e:
            raise self._fail("writing", key, e) from e

    def delete(self, key: str) -> None:
        path = self._path(key)
        self._check_writable()
        try:
            self.fs.rm_file(path)
        except Exception as e:
            if _is_missing(e):
                return
            raise self._fail("deleting", key, e) from e


