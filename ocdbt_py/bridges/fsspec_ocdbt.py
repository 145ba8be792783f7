"""An fsspec filesystem for the keys of an OCDBT database: protocol ``ocdbt``.

Paths are keys inside the database; the database's own URL follows ``::``, as with fsspec's
``zip`` and ``reference`` filesystems::

    fsspec.open("ocdbt://params.w/.zarray::s3://bucket/ckpt/1000/params")
    zarr.open_array("ocdbt://params.w::file:///ckpt/1000/params", mode="r")
    xarray.open_zarr("ocdbt://ds::file:///data/db")

or directly: ``OcdbtFileSystem("/ckpt/1000/params")`` / ``fsspec.filesystem("ocdbt",
fo=url, target_options={...})``.  ``version=`` (a generation number or ISO-8601 time) reads
an older commit.  The filesystem is read-only unless made with ``mode="a"`` (or ``"r+"``):
then ``pipe_file``/``rm_file``/files opened for writing go into one transaction, which
:meth:`OcdbtFileSystem.commit` commits atomically (one new generation); reads see the
uncommitted writes.

Directories are implied by ``/`` in keys (OCDBT has none of its own); ``ls`` skips over each
subdirectory with one B+tree descent, so listing a directory does not read every key below it.
Registered with fsspec through the ``fsspec.specs`` entry point; :func:`register` does the same
at run time (for an environment installed before the entry point existed).

fsspec's own abstract test classes run against it (``tests/bridges/test_fsspec_abstract.py``):
``AbstractCopyTests``, ``AbstractGetTests``, ``AbstractPutTests``, ``AbstractOpenTests`` and
``AbstractPipeTests``, all their cases.  What does not apply: empty directories (the suite's
``supports_empty_directories`` fixture is ``False``: a directory exists only while a key lies
below it, as on object stores), and ``fsspec/tests/abstract/mv.py`` (module-level tests of
``LocalFileSystem``, no class to subclass).  ``open(path, "xb")`` and
``pipe_file(path, mode="create")`` raise ``FileExistsError`` for a present key and make the
commit conditional on the key staying absent.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
from fsspec import AbstractFileSystem
from fsspec.spec import AbstractBufferedFile

import ocdbt_py
from ocdbt_py.errors import ReadOnlyError
from ocdbt_py.store import OcdbtStore, Version

__all__ = ["OcdbtFileSystem", "register", "PROTOCOL"]

PROTOCOL = "ocdbt"
_LOCAL = (None, "", "file", "local")


def register() -> None:
    """Register :class:`OcdbtFileSystem` for ``ocdbt://`` with fsspec (harmless if it is)."""
    fsspec.register_implementation(PROTOCOL, OcdbtFileSystem, clobber=True)


def _db_url(fo: str, target_protocol: str | None) -> str:
    if target_protocol in _LOCAL or "://" in fo:
        return fo
    return f"{target_protocol}://{fo}"


class OcdbtFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """The keys of one OCDBT database (one version of it) as files."""

    protocol = PROTOCOL
    root_marker = ""
    #: Not cached by fsspec: each instance opens the database anew, so a later open sees the
    #: commits made since (one manifest read), and writable instances never share a transaction.
    cachable = False

    def __init__(
        self,
        fo: str = "",
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        version: Version | None = None,
        mode: str = "r",
        **kwargs: Any,
    ):
        """``fo``: the database URL or path (with ``target_protocol``/``target_options`` as
        fsspec passes them for chained URLs); ``version``: an older commit to read; ``mode``:
        ``"r"`` (default), ``"r+"`` or ``"a"`` (writable, see :meth:`commit`)."""
        kwargs.pop("asynchronous", None)  # zarr asks for it; a sync filesystem is wrapped by the caller
        super().__init__(fo=fo, target_protocol=target_protocol, target_options=target_options,
                         version=version, mode=mode, **kwargs)
        if not fo:
            raise ValueError("ocdbt:// needs the database location after '::' (ocdbt://KEY::file:///db), or fo=")
        self.db_url = _db_url(str(fo), target_protocol)
        opts = dict(target_options or {})
        self.db: OcdbtStore = ocdbt_py.open(self.db_url, version=version, storage_options=opts or None,
                                           mode=mode)
        self._lock = threading.Lock()
        self._txn: Any = None

    # -- paths -------------------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        p = str(path)
        if p.startswith(f"{PROTOCOL}://"):
            p = p[len(PROTOCOL) + 3:]
        elif p.startswith(f"{PROTOCOL}::"):
            p = p[len(PROTOCOL) + 2:]
        return p.split("::", 1)[0].strip("/")

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return {}

    def unstrip_protocol(self, name: str) -> str:
        return f"{PROTOCOL}://{name}"

    # -- the view reads go through: the open transaction (read-your-writes) or the version ---
    @property
    def writable(self) -> bool:
        """Whether this filesystem takes writes (``mode="a"``/``"r+"``)."""
        return not self.db.read_only

    def _txn_or_none(self) -> Any:
        return self._txn

    def _get(self, key: str, rng: tuple[int, int | None] | None = None) -> bytes | None:
        t = self._txn_or_none()
        if t is not None:
            v = t.get(key.encode("utf-8"))
            if v is None or rng is None:
                return v
            return v[rng[0]:] if rng[1] is None else v[rng[0]:rng[1]]
        return self.db.get(key.encode("utf-8"), rng)

    def _entries(self, prefix: str, start: str | None = None) -> Iterator[tuple[str, int]]:
        t = self._txn_or_none()
        if t is not None:
            for k in t.list(prefix.encode("utf-8"), None if start is None else start.encode("utf-8")):
                v = t.get(k)
                yield k.decode("utf-8", "surrogateescape"), 0 if v is None else len(v)
            return
        for e in self.db.entries(prefix.encode("utf-8"), None if start is None else start.encode("utf-8")):
            yield e.key.decode("utf-8", "surrogateescape"), e.size

    # -- listing ------------------------------------------------------------------------------
    def _children(self, path: str) -> list[dict[str, Any]]:
        prefix = f"{path}/" if path else ""
        out: list[dict[str, Any]] = []
        start: str | None = None
        while True:
            it = self._entries(prefix, start)
            restart = None
            for key, size in it:
                rest = key[len(prefix):]
                if "/" in rest:
                    d = prefix + rest.split("/", 1)[0]
                    out.append({"name": d, "size": 0, "type": "directory"})
                    restart = d + "0"  # past every key d + "/...": "0" follows "/" in byte order
                    break
                out.append({"name": key, "size": size, "type": "file"})
            if restart is None:
                return out
            start = restart

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """The files and subdirectories directly below ``path`` (a file lists itself)."""
        path = self._strip_protocol(path)
        out = self._children(path)
        if not out:
            out = [self.info(path)]  # a file, or FileNotFoundError
        return out if detail else [o["name"] for o in out]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """``{"name", "size", "type"}`` of a key (file) or a key prefix (directory)."""
        path = self._strip_protocol(path)
        if not path:
            return {"name": "", "size": 0, "type": "directory"}
        for key, size in self._entries(path):
            if key == path:
                return {"name": path, "size": size, "type": "file"}
            break
        for _ in self._entries(path + "/"):
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(f"{self.unstrip_protocol(path)} (in {self.db_url})")

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        """Every file below ``path`` in one ordered walk of the B+tree (no per-directory listing)."""
        if maxdepth is not None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        path = self._strip_protocol(path)
        prefix = f"{path}/" if path else ""
        out: dict[str, dict[str, Any]] = {}
        for key, size in self._entries(prefix):
            if withdirs:
                parts = key[len(prefix):].split("/")[:-1]
                for i in range(len(parts)):
                    d = prefix + "/".join(parts[:i + 1])
                    out.setdefault(d, {"name": d, "size": 0, "type": "directory"})
            out[key] = {"name": key, "size": size, "type": "file"}
        if not out and path:
            try:
                one = self.info(path)
                if one["type"] == "file":
                    out[path] = one
            except FileNotFoundError:
                pass
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    # -- reading -------------------------------------------------------------------------------
    def _range(self, path: str, start: int | None, end: int | None) -> tuple[int, int | None] | None:
        if start is None and end is None:
            return None
        s = start or 0
        if (s < 0 and end is not None) or (end is not None and end < 0):
            size = self.size(path)
            s = max(size + s, 0) if s < 0 else s
            end = max(size + end, 0) if end < 0 else end
        if end is not None and end < s:
            end = s
        return s, end

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """The value of a key, or the byte range ``[start, end)`` of it (negative: from the end)."""
        path = self._strip_protocol(path)
        v = self._get(path, self._range(path, start, end))
        if v is None:
            raise FileNotFoundError(f"{self.unstrip_protocol(path)} (in {self.db_url})")
        return v

    def cat_ranges(self, paths: Sequence[str], starts: Any, ends: Any, max_gap: int | None = None,
                   on_error: str = "return", **kwargs: Any) -> list[Any]:
        """Many ranges in one batch: one B+tree traversal and concurrent reads (``get_many``)."""
        n = len(paths)
        starts = list(starts) if isinstance(starts, (list, tuple)) else [starts] * n
        ends = list(ends) if isinstance(ends, (list, tuple)) else [ends] * n
        keys = [self._strip_protocol(p) for p in paths]
        if self._txn is not None:
            vals: list[Any] = []
            for k, s, e in zip(keys, starts, ends):
                try:
                    vals.append(self.cat_file(k, s, e))
                except FileNotFoundError as err:
                    if on_error != "return":
                        raise
                    vals.append(err)
            return vals
        reqs = [(k.encode("utf-8"), self._range(k, s, e)) for k, s, e in zip(keys, starts, ends)]
        got = self.db.get_many(reqs)
        out: list[Any] = []
        for k, v in zip(keys, got):
            if v is None:
                missing = FileNotFoundError(f"{self.unstrip_protocol(k)} (in {self.db_url})")
                if on_error != "return":
                    raise missing
                out.append(missing)
            else:
                out.append(v)
        return out

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if "r" in mode:
            return _OcdbtFile(self, path, mode, block_size or "default", cache_options=cache_options,
                              size=self.size(path))
        self._require_writable()
        exclusive = "x" in mode
        if exclusive and self._get(path) is not None:
            raise FileExistsError(f"{self.unstrip_protocol(path)} (in {self.db_url})")
        return _WriteFile(self, path, "create" if exclusive else "overwrite")

    # -- writing -------------------------------------------------------------------------------
    def _require_writable(self) -> Any:
        if self.db.read_only:
            raise ReadOnlyError(f"ocdbt://…::{self.db_url} is read-only; make the filesystem with mode='a' to write")
        with self._lock:
            if self._txn is None:
                self._txn = self.db.transaction()
            return self._txn

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Stage ``value`` at key ``path`` in the open transaction (see :meth:`commit`).

        ``mode="create"``: ``FileExistsError`` if the key exists; the commit is then also
        conditional on the key still being absent (``ConditionFailedError`` otherwise)."""
        t = self._require_writable()
        path = self._strip_protocol(path)
        if mode == "create":
            if self._get(path) is not None:
                raise FileExistsError(f"{self.unstrip_protocol(path)} (in {self.db_url})")
            t.put(path.encode("utf-8"), bytes(value), if_equal=None)
        else:
            t.put(path.encode("utf-8"), bytes(value))
        self.invalidate_cache()

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Stage a copy of the value of key ``path1`` at key ``path2``."""
        src = self._strip_protocol(path1)
        value = self._get(src)
        if value is None:
            raise FileNotFoundError(f"{self.unstrip_protocol(src)} (in {self.db_url})")
        self.pipe_file(path2, value)

    def rm_file(self, path: str) -> None:
        """Stage the deletion of a key."""
        self._require_writable().delete(self._strip_protocol(path).encode("utf-8"))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Stage deletions (``recursive``: every key below a directory)."""
        for p in [path] if isinstance(path, str) else path:
            p = self._strip_protocol(p)
            if recursive:
                for k in self.find(p):
                    self.rm_file(k)
            if self.exists(p) and self.info(p)["type"] == "file":
                self.rm_file(p)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories are implied by keys: nothing to do."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Directories are implied by keys: nothing to do."""

    def commit(self) -> int:
        """Commit the staged writes atomically as one new generation; returns it (the current
        generation when nothing is staged)."""
        with self._lock:
            t, self._txn = self._txn, None
        if t is None:
            return self.db.generation
        self.invalidate_cache()
        return int(t.commit())

    def discard(self) -> None:
        """Drop the staged writes."""
        with self._lock:
            t, self._txn = self._txn, None
        if t is not None:
            t.abort()


class _OcdbtFile(AbstractBufferedFile):  # type: ignore[misc]
    """A value read in ranges on demand."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path, start, end)  # type: ignore[no-any-return]


class _WriteFile(io.BytesIO):
    """A file opened for writing: staged in the transaction when closed."""

    def __init__(self, fs: OcdbtFileSystem, path: str, mode: str = "overwrite"):
        super().__init__()
        self._fs = fs
        self._path = path
        self._mode = mode

    def close(self) -> None:
        if not self.closed:
            self._fs.pipe_file(self._path, self.getvalue(), mode=self._mode)
        super().close()
