"""Exception types raised by :mod:`zarr3`.

Every error derives from :class:`ZarrError`, itself an :class:`ocdbt_py.errors.OcdbtError`, so a
caller can catch one class for the whole engine.  Corrupt chunk data (a wrong decoded size, a
checksum mismatch, a shard index pointing past the shard) raises
:class:`ocdbt_py.errors.CorruptionError`, re-exported here for convenience.
"""

from __future__ import annotations

from typing import Any

from ocdbt_py.errors import CorruptionError, OcdbtError, ReadOnlyError
from ocdbt_py.errors import UnsupportedError as _OcdbtUnsupportedError

__all__ = [
    "ZarrError",
    "MetadataError",
    "ArrayNotFoundError",
    "NodeExistsError",
    "ChunkNotFoundError",
    "CodecUnavailableError",
    "UnsupportedError",
    "CorruptionError",
    "ReadOnlyError",
]


class ZarrError(OcdbtError):
    """Base class of every error raised by :mod:`zarr3`."""


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MetadataError(ZarrError, ValueError):
    """Array or group metadata is invalid or uses something unsupported.

    ``field`` names the offending metadata member (a dotted path such as
    ``"codecs[0].configuration.level"``) and ``value`` holds the value found there.
    """

    def __init__(self, field: str, value: Any, reason: str, *, path: str | None = None):
        self.field = field
        self.value = value
        self.reason = reason
        self.path = path
        where = f" in {path}" if path else ""
        super().__init__(f"invalid zarr metadata{where}: {field} = {_short(value)}: {reason}")


class ArrayNotFoundError(ZarrError, FileNotFoundError):
    """No array (or group) metadata exists at the requested location."""


class NodeExistsError(ZarrError, FileExistsError):
    """``create`` found an existing array or group and ``overwrite`` was not set."""


class ChunkNotFoundError(ZarrError, KeyError):
    """A chunk is missing and the array was opened with ``fill_missing=False``.

    Orbax checkpoints written with ``store_array_data_equal_to_fill_value`` store every chunk,
    so a missing chunk there means a damaged checkpoint, not fill values.
    """

    def __init__(self, key: str, message: str | None = None):
        self.key = key
        self.message = message or f"chunk {key!r} is missing"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return self.message


class UnsupportedError(ZarrError, _OcdbtUnsupportedError):
    """Valid data that uses a feature zarr3 does not implement (``feature`` names it).

    Also an :class:`ocdbt_py.errors.UnsupportedError` (and so a ``NotImplementedError``).
    """

    def __init__(self, feature: str, reason: str = "is not supported"):
        self.feature = feature
        super().__init__(f"{feature} {reason}")


class CodecUnavailableError(UnsupportedError, ImportError):
    """A codec cannot run here: it needs an optional package that is not installed, or the
    installed library was built without it (``reason`` says which)."""

    def __init__(self, codec: str, package: str | None = None, extra: str | None = None, *, reason: str | None = None):
        self.codec = codec
        self.package = package
        if reason is None:
            hint = f"pip install 'ocdbt-py[{extra}]'" if extra else f"pip install {package}"
            reason = f"needs the optional package {package!r} ({hint})"
        UnsupportedError.__init__(self, f"the {codec!r} codec", reason)
