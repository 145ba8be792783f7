"""The database configuration stored at the start of every manifest."""

from __future__ import annotations

import dataclasses
from typing import Any

from ocdbt_py.format.reader import Reader, put_i32le, put_varint

__all__ = ["Config", "decode_config", "encode_config", "MANIFEST_KIND_SINGLE", "MANIFEST_KIND_NUMBERED"]

MANIFEST_KIND_SINGLE = 0
MANIFEST_KIND_NUMBERED = 1
_ZSTD_MIN_LEVEL = -(1 << 17)
_ZSTD_MAX_LEVEL = 22


@dataclasses.dataclass(frozen=True)
class Config:
    """OCDBT database configuration, with TensorStore's field names and defaults.

    ``compression_level`` is ``None`` for uncompressed nodes, else the zstd level (0 = zstd's
    default).
    """

    uuid: bytes = b"\x00" * 16
    manifest_kind: int = MANIFEST_KIND_SINGLE
    max_inline_value_bytes: int = 100
    max_decoded_node_bytes: int = 8 * 1024 * 1024
    version_tree_arity_log2: int = 4
    compression_level: int | None = 0

    def to_json(self) -> dict[str, Any]:
        """The config as TensorStore's JSON spec spells it."""
        return {
            "uuid": self.uuid.hex(),
            "manifest_kind": "numbered" if self.manifest_kind == MANIFEST_KIND_NUMBERED else "single",
            "max_inline_value_bytes": self.max_inline_value_bytes,
            "max_decoded_node_bytes": self.max_decoded_node_bytes,
            "version_tree_arity_log2": self.version_tree_arity_log2,
            "compression": None
            if self.compression_level is None
            else {"id": "zstd", "level": self.compression_level},
        }


def decode_config(r: Reader) -> Config:
    """Read the config fields of a manifest body."""
    uuid = r.take(16, "uuid")
    pos = r.pos
    kind = r.byte("manifest kind")
    if kind > 1:
        raise r.error(f"unknown manifest kind {kind}", pos)
    max_inline = r.varint32("max_inline_value_bytes")
    max_node = r.varint32("max_decoded_node_bytes")
    pos = r.pos
    arity = r.byte("version_tree_arity_log2")
    if not 1 <= arity <= 16:
        raise r.error(f"version_tree_arity_log2 {arity} is outside 1..16", pos)
    pos = r.pos
    method = r.varint32("compression method")
    level: int | None
    if method == 0:
        level = None
    elif method == 1:
        lpos = r.pos
        level = r.i32le("zstd level")
        if not _ZSTD_MIN_LEVEL <= level <= _ZSTD_MAX_LEVEL:
            raise r.error(f"zstd level {level} out of range", lpos)
    else:
        raise r.error(f"unknown compression method {method}", pos)
    return Config(uuid, kind, max_inline, max_node, arity, level)


def encode_config(out: bytearray, config: Config) -> None:
    """Append the config fields."""
    if len(config.uuid) != 16:
        raise ValueError("uuid must be 16 bytes")
    out += config.uuid
    out.append(config.manifest_kind)
    put_varint(out, config.max_inline_value_bytes)
    put_varint(out, config.max_decoded_node_bytes)
    out.append(config.version_tree_arity_log2)
    if config.compression_level is None:
        put_varint(out, 0)
    else:
        put_varint(out, 1)
        put_i32le(out, config.compression_level)
