"""The regular chunk grid and the chunk key encodings (``default`` and ``v2``).

``default`` keys are ``c`` followed by the chunk indices (``c/0/1``, or ``c.0.1`` with the
``.`` separator; ``c`` alone for a 0-d array).  ``v2`` keys are the bare indices (``0.1`` or
``0/1``; ``0`` for a 0-d array).  Every key built here passes
:func:`ocdbt_py.kvstore.validate_key`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ocdbt_py.kvstore import validate_key
from zarr3.errors import MetadataError

__all__ = ["ChunkKeyEncoding", "parse_chunk_grid", "MAX_RANK", "MAX_DIM"]

#: Highest rank accepted (TensorStore's limit).
MAX_RANK = 32
#: Largest extent accepted for a dimension.
MAX_DIM = (1 << 62) - 1


@dataclass(frozen=True)
class ChunkKeyEncoding:
    """How chunk grid coordinates become store keys."""

    name: str = "default"
    separator: str = "/"

    @classmethod
    def from_json(cls, value: Any, field: str = "chunk_key_encoding") -> ChunkKeyEncoding:
        """Parse a v3 ``chunk_key_encoding`` object (a bare name is accepted too)."""
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, Mapping):
            raise MetadataError(field, value, "expected an object")
        for key in value:
            if key not in ("name", "configuration", "must_understand"):
                raise MetadataError(f"{field}.{key}", value[key], "unknown member")
        name = value.get("name")
        if name not in ("default", "v2"):
            raise MetadataError(f"{field}.name", name, 'expected "default" or "v2"')
        config = value.get("configuration") or {}
        if not isinstance(config, Mapping):
            raise MetadataError(f"{field}.configuration", config, "expected an object")
        for key in config:
            if key != "separator":
                raise MetadataError(f"{field}.configuration.{key}", config[key], "unknown member")
        sep = config.get("separator", "/" if name == "default" else ".")
        if sep not in ("/", "."):
            raise MetadataError(f"{field}.configuration.separator", sep, 'expected "/" or "."')
        return cls(name, sep)

    def to_json(self) -> dict[str, Any]:
        """The form TensorStore writes: the configuration only for a non-default separator."""
        default_sep = "/" if self.name == "default" else "."
        if self.separator == default_sep:
            return {"name": self.name}
        return {"configuration": {"separator": self.separator}, "name": self.name}

    def decode(self, key: str, rank: int) -> tuple[int, ...] | None:
        """The grid position of ``key`` if it is exactly the key :meth:`encode` gives for it
        (canonical decimal numbers, ``rank`` of them), else ``None``."""
        parts = key.split(self.separator)
        if self.name == "default":
            if not parts or parts[0] != "c":
                return None
            parts = parts[1:]
        elif rank == 0:
            return () if key == "0" else None
        if len(parts) != rank:
            return None
        out = []
        for p in parts:
            if not p.isascii() or not p.isdigit() or (len(p) > 1 and p[0] == "0") or len(p) > 20:
                return None
            out.append(int(p))
        return tuple(out)

    def encode(self, coords: Sequence[int]) -> str:
        """The key of the chunk at grid position ``coords``."""
        parts = [str(int(c)) for c in coords]
        if self.name == "default":
            key = self.separator.join(["c", *parts])
        else:
            key = self.separator.join(parts) if parts else "0"
        return validate_key(key)


def parse_shape(value: Any, field: str, *, minimum: int = 0) -> tuple[int, ...]:
    """Validate a list of dimension extents."""
    if not isinstance(value, (list, tuple)):
        raise MetadataError(field, value, "expected a list of integers")
    if len(value) > MAX_RANK:
        raise MetadataError(field, value, f"rank {len(value)} exceeds the maximum of {MAX_RANK}")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum or v > MAX_DIM:
            raise MetadataError(field, value, f"expected integers in [{minimum}, {MAX_DIM}]")
    return tuple(int(v) for v in value)


def parse_chunk_grid(value: Any, rank: int, field: str = "chunk_grid") -> tuple[int, ...]:
    """Parse a v3 ``chunk_grid``; only ``regular`` grids exist in TensorStore's driver."""
    if not isinstance(value, Mapping):
        raise MetadataError(field, value, "expected an object")
    name = value.get("name")
    if name != "regular":
        raise MetadataError(f"{field}.name", name, 'unsupported chunk grid (only "regular")')
    for key in value:
        if key not in ("name", "configuration", "must_understand"):
            raise MetadataError(f"{field}.{key}", value[key], "unknown member")
    config = value.get("configuration")
    if not isinstance(config, Mapping) or "chunk_shape" not in config:
        raise MetadataError(f"{field}.configuration", config, "expected an object with chunk_shape")
    for key in config:
        if key != "chunk_shape":
            raise MetadataError(f"{field}.configuration.{key}", config[key], "unknown member")
    shape = parse_shape(config["chunk_shape"], f"{field}.configuration.chunk_shape", minimum=1)
    if len(shape) != rank:
        raise MetadataError(f"{field}.configuration.chunk_shape", list(shape), f"expected {rank} dimensions like shape")
    return shape
