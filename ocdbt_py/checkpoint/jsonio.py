"""Reading the small JSON files of a checkpoint with explicit size limits."""

from __future__ import annotations

from typing import Any

from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore.base import KvStore
from zarr3.engine.json_text import parse

__all__ = ["read_json", "read_bytes", "MAX_JSON_BYTES"]

#: Largest JSON file accepted (``_METADATA`` of a 100k-parameter model is ~40 MiB).
MAX_JSON_BYTES = 512 << 20


def read_bytes(kv: KvStore, key: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
    """The value at ``key`` (``None`` if absent), refusing values longer than ``limit``."""
    data = kv.get(key, (0, limit + 1))
    if data is not None and len(data) > limit:
        raise CorruptionError(f"{key} is larger than the {limit}-byte limit", path=kv.url)
    return data


def parse_json(data: bytes, *, what: str) -> Any:
    """Parse JSON bytes; raise :class:`CorruptionError` naming ``what`` on failure (nesting
    deeper than 128 levels and integer literals over 64 digits are failures too)."""
    try:
        return parse(data.decode("utf-8"), allow_nan=True)
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptionError(f"{what} is not valid JSON: {e}") from e


def read_json(kv: KvStore, key: str, limit: int = MAX_JSON_BYTES) -> Any | None:
    """Parsed JSON at ``key``, ``None`` if absent."""
    data = read_bytes(kv, key, limit)
    if data is None:
        return None
    return parse_json(data, what=f"{kv.url.rstrip('/')}/{key}")
