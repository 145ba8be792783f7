"""Reading the small JSON files of a checkpoint with explicit size limits.

:func:`read_json` is the one reader of a checkpoint's JSON files: it is handed the store the
restore settled on and names the file it read in its errors; :func:`parse_json` parses bytes
read elsewhere, its errors naming the document as its caller calls it.
"""

from __future__ import annotations

from typing import Any

from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore.base import KvStore
from zarr3.engine.json_text import parse

__all__ = ["read_json", "read_bytes", "parse_json", "MAX_JSON_BYTES"]

#: Largest JSON file accepted (``_METADATA`` of a 100k-parameter model is ~40 MiB).
MAX_JSON_BYTES = 512 << 20


def read_bytes(kv: KvStore, key: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
    """The value at ``key`` (``None`` if absent), refusing values longer than ``limit``."""
    data = kv.get(key, (0, limit + 1))
    if data is not None and len(data) > limit:
        raise CorruptionError(f"{key} is larger than the {limit}-byte limit", path=kv.url)
    return data


def _parse(data: bytes) -> Any:
    # nesting deeper than 128 levels and integer literals over 64 digits are ValueErrors
    return parse(data.decode("utf-8"), allow_nan=True)


def parse_json(data: bytes, *, what: str) -> Any:
    """Parse JSON bytes; raise :class:`CorruptionError` naming ``what`` on failure (nesting
    deeper than 128 levels and integer literals over 64 digits are failures too)."""
    try:
        return _parse(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptionError(f"{what} is not valid JSON: {e}") from e


def read_json(kv: KvStore, key: str, limit: int = MAX_JSON_BYTES) -> Any | None:
    """Parsed JSON at ``key``, ``None`` if absent (a :class:`CorruptionError` naming the file
    if it is longer than ``limit`` or not valid JSON)."""
    data = read_bytes(kv, key, limit)
    if data is None:
        return None
    try:
        return _parse(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptionError(f"{key} is not valid JSON: {e}", path=f"{kv.url.rstrip('/')}/{key}") from e
