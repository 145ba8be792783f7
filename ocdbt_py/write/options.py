"""Database configuration constraints and writer options, spelled as in TensorStore's JSON spec.

``config`` fields act as *constraints*: when a database is created, unspecified fields take
TensorStore's defaults; when an existing database is opened, every specified field must match
the stored value.  Writer options (data-file prefixes, ``target_data_file_size``,
``assume_config``) only affect how this process writes and are never stored.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from ocdbt_py.errors import ConditionFailedError, InvalidKeyError
from ocdbt_py.format.config import MANIFEST_KIND_NUMBERED, MANIFEST_KIND_SINGLE, Config
from ocdbt_py.kvstore.keys import validate_key

__all__ = ["ConfigConstraints", "WriterOptions", "parse_options", "MAX_INLINE_VALUE_BYTES"]

#: Largest ``max_inline_value_bytes`` TensorStore accepts.
MAX_INLINE_VALUE_BYTES = 1 << 20
_ZSTD_MIN_LEVEL = -(1 << 17)
_ZSTD_MAX_LEVEL = 22
_UNSET: Any = object()
_KINDS = {"single": MANIFEST_KIND_SINGLE, "numbered": MANIFEST_KIND_NUMBERED}
_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")

_CONFIG_FIELDS = (
    "uuid",
    "manifest_kind",
    "max_inline_value_bytes",
    "max_decoded_node_bytes",
    "version_tree_arity_log2",
    "compression",
)
_WRITER_FIELDS = (
    "target_data_file_size",
    "value_data_prefix",
    "btree_node_data_prefix",
    "version_tree_node_data_prefix",
    "assume_config",
)


@dataclasses.dataclass(frozen=True)
class ConfigConstraints:
    """The config fields a caller asked for; ``None`` means "any / default"."""

    uuid: bytes | None = None
    manifest_kind: int | None = None
    max_inline_value_bytes: int | None = None
    max_decoded_node_bytes: int | None = None
    version_tree_arity_log2: int | None = None
    #: ``_UNSET``-free encoding: ``None`` unconstrained, ``("none",)`` no compression,
    #: ``("zstd", level)`` zstd at that level.
    compression: tuple[Any, ...] | None = None

    def create(self) -> Config:
        """A config for a new database: constraints, TensorStore defaults elsewhere."""
        d = Config()
        level: int | None = d.compression_level
        if self.compression is not None:
            level = None if self.compression[0] == "none" else int(self.compression[1])
        return Config(
            uuid=self.uuid if self.uuid is not None else os.urandom(16),
            manifest_kind=self.manifest_kind if self.manifest_kind is not None else MANIFEST_KIND_SINGLE,
            max_inline_value_bytes=_pick(self.max_inline_value_bytes, d.max_inline_value_bytes),
            max_decoded_node_bytes=_pick(self.max_decoded_node_bytes, d.max_decoded_node_bytes),
            version_tree_arity_log2=_pick(self.version_tree_arity_log2, d.version_tree_arity_log2),
            compression_level=level,
        )

    def check(self, stored: Config, where: str) -> None:
        """Raise :class:`ConditionFailedError` if ``stored`` violates a constraint."""
        stored_comp: tuple[Any, ...] = (
            ("none",) if stored.compression_level is None else ("zstd", stored.compression_level)
        )
        pairs: list[tuple[str, Any, Any]] = [
            ("uuid", self.uuid, stored.uuid),
            ("manifest_kind", self.manifest_kind, stored.manifest_kind),
            ("max_inline_value_bytes", self.max_inline_value_bytes, stored.max_inline_value_bytes),
            ("max_decoded_node_bytes", self.max_decoded_node_bytes, stored.max_decoded_node_bytes),
            ("version_tree_arity_log2", self.version_tree_arity_log2, stored.version_tree_arity_log2),
            ("compression", self.compression, stored_comp),
        ]
        for name, want, have in pairs:
            if want is not None and want != have:
                raise ConditionFailedError(
                    f"configuration mismatch on {name} for {where}: requested {_show(name, want)} "
                    f"but the database has {_show(name, have)}"
                )


def _pick(v: int | None, default: int) -> int:
    return default if v is None else v


def _show(name: str, v: Any) -> str:
    if name == "uuid":
        return str(v.hex())
    if name == "manifest_kind":
        return "numbered" if v == MANIFEST_KIND_NUMBERED else "single"
    if name == "compression":
        return "null" if v[0] == "none" else f'{{"id": "zstd", "level": {v[1]}}}'
    return str(v)


@dataclasses.dataclass(frozen=True)
class WriterOptions:
    """How this process writes; never stored in the database."""

    #: A data file is closed once its buffer reaches this size (0: unlimited).
    target_data_file_size: int = 1 << 31
    value_data_prefix: str = "d/"
    btree_node_data_prefix: str = "d/"
    version_tree_node_data_prefix: str = "d/"
    #: Skip writing the initial empty generation 1 when creating a database.
    assume_config: bool = False


def _int(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"config {name} must be an integer, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"config {name}={v} is outside {lo}..{hi}")
    return v


def _prefix(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name} must be a str, not {type(v).__name__}")
    try:
        validate_key(v + "0" * 32)
    except InvalidKeyError as e:
        raise InvalidKeyError(f"{name}={v!r} does not give valid data file keys: {e}") from e
    if v.startswith("manifest."):
        raise InvalidKeyError(f"{name}={v!r} would collide with manifest files")
    return v


def parse_options(config: Mapping[str, Any] | None) -> tuple[ConfigConstraints, WriterOptions]:
    """Split a TensorStore-style ``config`` dict into constraints and writer options.

    Writer options may be given at the top level of ``config`` (``target_data_file_size``,
    ``value_data_prefix``, ``btree_node_data_prefix``, ``version_tree_node_data_prefix``,
    ``assume_config``).  Unknown names raise ``ValueError``.
    """
    if config is None:
        return ConfigConstraints(), WriterOptions()
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, not {type(config).__name__}")
    unknown = set(config) - set(_CONFIG_FIELDS) - set(_WRITER_FIELDS)
    if unknown:
        raise ValueError(f"unknown config option(s): {', '.join(sorted(map(str, unknown)))}")
    c: dict[str, Any] = {}
    if config.get("uuid") is not None:
        u = config["uuid"]
        if isinstance(u, (bytes, bytearray)) and len(u) == 16:
            c["uuid"] = bytes(u)
        elif isinstance(u, str) and _HEX32.match(u):
            c["uuid"] = bytes.fromhex(u)
        else:
            raise ValueError(f"config uuid must be 32 hex digits, got {u!r}")
    if config.get("manifest_kind") is not None:
        k = config["manifest_kind"]
        if k not in _KINDS:
            raise ValueError(f'config manifest_kind must be "single" or "numbered", got {k!r}')
        c["manifest_kind"] = _KINDS[k]
    if config.get("max_inline_value_bytes") is not None:
        c["max_inline_value_bytes"] = _int(
            "max_inline_value_bytes", config["max_inline_value_bytes"], 0, MAX_INLINE_VALUE_BYTES
        )
    if config.get("max_decoded_node_bytes") is not None:
        c["max_decoded_node_bytes"] = _int(
            "max_decoded_node_bytes", config["max_decoded_node_bytes"], 0, (1 << 32) - 1
        )
    if config.get("version_tree_arity_log2") is not None:
        c["version_tree_arity_log2"] = _int(
            "version_tree_arity_log2", config["version_tree_arity_log2"], 1, 16
        )
    if "compression" in config:
        comp = config["compression"]
        if comp is None:
            c["compression"] = ("none",)
        elif isinstance(comp, Mapping) and comp.get("id") == "zstd" and set(comp) <= {"id", "level"}:
            c["compression"] = ("zstd", _int("compression.level", comp.get("level", 0),
                                             _ZSTD_MIN_LEVEL, _ZSTD_MAX_LEVEL))
        else:
            raise ValueError(f'config compression must be null or {{"id": "zstd", "level": N}}, got {comp!r}')
    w: dict[str, Any] = {}
    if config.get("target_data_file_size") is not None:
        w["target_data_file_size"] = _int("target_data_file_size", config["target_data_file_size"], 0, 1 << 62)
    for name in ("value_data_prefix", "btree_node_data_prefix", "version_tree_node_data_prefix"):
        if config.get(name) is not None:
            w[name] = _prefix(name, config[name])
    if config.get("assume_config") is not None:
        if not isinstance(config["assume_config"], bool):
            raise TypeError("assume_config must be a bool")
        w["assume_config"] = config["assume_config"]
    return ConfigConstraints(**c), WriterOptions(**w)
