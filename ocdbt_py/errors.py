"""Exception types raised by ocdbt-py.

Every error the library raises on purpose derives from :class:`OcdbtError`, so callers can
catch one class.  Errors that describe bad arguments also derive from the matching built-in
(`ValueError`, `KeyError`, ...) so idiomatic ``except`` clauses keep working.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "OcdbtError",
    "CorruptionError",
    "NotFoundError",
    "UnsupportedError",
    "ReadOnlyError",
    "InvalidKeyError",
    "ConditionFailedError",
    "StorageError",
    "ResourceError",
    "TreeMismatchError",
    "TopologyMismatchError",
    "MissingDependencyError",
]


class OcdbtError(Exception):
    """Base class of every error raised by ocdbt-py."""


class CorruptionError(OcdbtError):
    """Stored data violates the format: bad magic, length, version, checksum, truncation, ...

    ``path`` names the file (or key) and ``offset`` the byte position where the problem was
    found, when they are known.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        self.reason = message
        self.path = path
        self.offset = offset
        where = ""
        if path is not None:
            where = f" in {path!r}"
            if offset is not None:
                where += f" at offset {offset}"
        elif offset is not None:
            where = f" at offset {offset}"
        super().__init__(message + where)


class NotFoundError(OcdbtError, FileNotFoundError):
    """There is no database (or no requested version / item) at the given location."""


class UnsupportedError(OcdbtError, NotImplementedError):
    """The data uses a feature, or the backend lacks a capability, that is not supported."""


class ReadOnlyError(OcdbtError, PermissionError):
    """A write was attempted on a store opened read-only."""


class InvalidKeyError(OcdbtError, ValueError):
    """A key or path is malformed or unsafe (``..``, absolute, NUL, URL scheme, too long)."""


class ConditionFailedError(OcdbtError):
    """A conditional write lost: the key was present, or changed since the given generation."""


class StorageError(OcdbtError, OSError):
    """The underlying storage failed or could not be reached."""


class ResourceError(OcdbtError, MemoryError):
    """A request needs more memory than can be had: e.g. an array whose metadata declares
    2^40 elements.  ``nbytes`` is the size asked for, when known."""

    def __init__(self, message: str, *, nbytes: int | None = None):
        self.nbytes = nbytes
        super().__init__(message)


class TreeMismatchError(OcdbtError, ValueError):
    """A restore target's tree does not name the checkpoint's leaves (a target lacking a
    stored leaf, or naming one not stored; Orbax raises ``ValueError`` for both)."""


class TopologyMismatchError(OcdbtError, ValueError):
    """The checkpoint recorded shardings over devices this process does not have, and the
    restore target gives none to use instead (Orbax raises ``ValueError``)."""
class MissingDependencyError(OcdbtError, ModuleNotFoundError):
    """A feature needs an optional package that is not installed; the message names the
    ``pip install 'ocdbt-py[extra]'`` that brings it (``extra`` and ``package`` are kept)."""

    def __init__(self, package: str, extra: str, purpose: str):
        self.package = package
        self.extra = extra
        super().__init__(f"{purpose} needs the optional package {package!r}, which is not installed: "
                         f"pip install 'ocdbt-py[{extra}]'", name=package)

    @classmethod
    def require(cls, module: str, extra: str, purpose: str) -> ModuleType:
        """``importlib.import_module(module)``, or this error when the module (or the package
        it belongs to) is not installed.  ``purpose`` says what needed it (``"to_dask()"``)."""
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            top = module.split(".")[0]
            if e.name is not None and e.name.split(".")[0] != top:
                raise  # the package is there but one of its own dependencies is missing
            raise cls(top, extra, purpose) from e
