"""Zarr v3 ``zarr.json`` metadata for arrays and groups.

Parsing is strict the way TensorStore's is: unknown members are rejected unless they are
objects marked ``{"must_understand": false}`` (kept and written back), and every error names
the field and value.  Output is byte-identical to TensorStore's: compact JSON, keys sorted,
``attributes``/``dimension_names`` omitted when empty or all null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zarr3.chunk_grid import ChunkKeyEncoding, parse_chunk_grid, parse_shape
from zarr3.codecs import CodecChain, parse_codecs
from zarr3.codecs.base import ChunkSpec, Codec
from zarr3.dtypes import DataType, parse_data_type_v3
from zarr3.engine import json_text
from zarr3.errors import MetadataError
from zarr3.fill_value import encode_fill_value_v3, parse_fill_value_v3

__all__ = ["ArrayMetadataV3", "GroupMetadataV3", "parse_zarr_json", "MAX_CHUNK_NBYTES"]

#: Largest decoded chunk accepted, in bytes (a chunk is allocated whole when read).
MAX_CHUNK_NBYTES = 1 << 34

_ARRAY_KEYS = {
    "zarr_format",
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
    "attributes",
    "dimension_names",
    "storage_transformers",
}


def _extensions(obj: Mapping[str, Any], known: set[str]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for key, value in obj.items():
        if key in known:
            continue
        if isinstance(value, Mapping) and value.get("must_understand") is False:
            extra[key] = value
        else:
            raise MetadataError(key, value, 'unsupported metadata field (not marked "must_understand": false)')
    return extra


def _attributes(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise MetadataError("attributes", value, "expected an object")
    return dict(value)


def check_chunk_nbytes(chunk_shape: Sequence[int], dt: DataType, field: str) -> None:
    """Reject chunks too large to decode (they are allocated whole)."""
    nbytes = math.prod(chunk_shape) * dt.itemsize
    if nbytes > MAX_CHUNK_NBYTES:
        raise MetadataError(
            field, list(chunk_shape), f"a chunk of {nbytes} bytes exceeds the limit of {MAX_CHUNK_NBYTES}"
        )


@dataclass(eq=False)
class ArrayMetadataV3:
    """A parsed (or to-be-written) v3 array ``zarr.json``."""

    shape: tuple[int, ...]
    data_type: DataType
    chunk_shape: tuple[int, ...]
    fill_value: np.ndarray
    codecs: list[Codec]
    chunk_key_encoding: ChunkKeyEncoding = field(default_factory=ChunkKeyEncoding)
    attributes: dict[str, Any] | None = None
    dimension_names: tuple[str | None, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    chain: CodecChain = field(init=False, repr=False)

    zarr_format = 3

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)
        self.chunk_shape = tuple(int(s) for s in self.chunk_shape)
        if len(self.chunk_shape) != len(self.shape):
            raise MetadataError(
                "chunk_grid.configuration.chunk_shape",
                list(self.chunk_shape),
                f"expected {len(self.shape)} dimensions like shape",
            )
        check_chunk_nbytes(self.chunk_shape, self.data_type, "chunk_grid.configuration.chunk_shape")
        if self.dimension_names is not None:
            names = tuple(self.dimension_names)
            if len(names) != len(self.shape) or not all(n is None or isinstance(n, str) for n in names):
                raise MetadataError("dimension_names", list(names), f"expected {len(self.shape)} strings or nulls")
            self.dimension_names = names
        spec = ChunkSpec(self.chunk_shape, self.data_type, self.fill_value)
        self.chain = CodecChain(self.codecs, spec, "codecs")
        self.codecs = self.chain.codecs

    @property
    def metadata_key(self) -> str:
        """The store key of this metadata document."""
        return "zarr.json"

    @property
    def attrs(self) -> dict[str, Any]:
        """User attributes (empty dict if none)."""
        return dict(self.attributes or {})

    def chunk_key(self, coords: Sequence[int]) -> str:
        """Store key of the chunk at grid position ``coords``."""
        return self.chunk_key_encoding.encode(coords)

    def chunk_coords(self, key: str) -> tuple[int, ...] | None:
        """The grid position whose :meth:`chunk_key` is ``key`` (``None``: no chunk key)."""
        return self.chunk_key_encoding.decode(key, len(self.shape))

    @classmethod
    def from_json(cls, obj: Any) -> ArrayMetadataV3:
        """Parse and validate a decoded ``zarr.json`` object of an array."""
        if not isinstance(obj, Mapping):
            raise MetadataError("zarr.json", obj, "expected a JSON object")
        if obj.get("zarr_format") != 3:
            raise MetadataError("zarr_format", obj.get("zarr_format"), "expected 3")
        if obj.get("node_type") != "array":
            raise MetadataError("node_type", obj.get("node_type"), 'expected "array"')
        for req in ("shape", "data_type", "chunk_grid", "fill_value", "codecs"):
            if req not in obj:
                raise MetadataError(req, None, "required member is missing")
        extra = _extensions(obj, _ARRAY_KEYS)
        st = obj.get("storage_transformers")
        if st not in (None, []):
            raise MetadataError("storage_transformers", st, "storage transformers are not supported")
        shape = parse_shape(obj["shape"], "shape")
        dt = parse_data_type_v3(obj["data_type"])
        chunk_shape = parse_chunk_grid(obj["chunk_grid"], len(shape))
        cke = ChunkKeyEncoding.from_json(obj.get("chunk_key_encoding", {"name": "default"}))
        fill = parse_fill_value_v3(obj["fill_value"], dt)
        codecs = parse_codecs(obj["codecs"])
        dims = obj.get("dimension_names")
        if dims is not None and not isinstance(dims, list):
            raise MetadataError("dimension_names", dims, "expected a list")
        return cls(
            shape=shape,
            data_type=dt,
            chunk_shape=chunk_shape,
            fill_value=fill,
            codecs=codecs,
            chunk_key_encoding=cke,
            attributes=_attributes(obj.get("attributes")),
            dimension_names=None if dims is None else tuple(dims),
            extra=extra,
        )

    def to_json(self) -> dict[str, Any]:
        """The metadata object, normalised as TensorStore writes it."""
        out: dict[str, Any] = {
            "chunk_grid": {"configuration": {"chunk_shape": list(self.chunk_shape)}, "name": "regular"},
            "chunk_key_encoding": self.chunk_key_encoding.to_json(),
            "codecs": self.chain.to_json(),
            "data_type": self.data_type.v3_json,
            "fill_value": encode_fill_value_v3(self.fill_value, self.data_type),
            "node_type": "array",
            "shape": list(self.shape),
            "zarr_format": 3,
        }
        if self.attributes:
            out["attributes"] = self.attributes
        if self.dimension_names is not None and any(n is not None for n in self.dimension_names):
            out["dimension_names"] = list(self.dimension_names)
        out.update(self.extra)
        return out

    def to_bytes(self) -> bytes:
        """Compact, key-sorted UTF-8 JSON, byte-identical to TensorStore's output."""
        try:
            return json_text.dumps(self.to_json()).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise MetadataError("attributes", self.attributes, f"not JSON-serializable: {e}") from e


@dataclass
class GroupMetadataV3:
    """A v3 group ``zarr.json``."""

    attributes: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    zarr_format = 3

    @property
    def metadata_key(self) -> str:
        """The store key of this metadata document."""
        return "zarr.json"

    @property
    def attrs(self) -> dict[str, Any]:
        """User attributes (empty dict if none)."""
        return dict(self.attributes or {})

    @classmethod
    def from_json(cls, obj: Any) -> GroupMetadataV3:
        """Parse a group ``zarr.json`` object."""
        if not isinstance(obj, Mapping):
            raise MetadataError("zarr.json", obj, "expected a JSON object")
        if obj.get("zarr_format") != 3:
            raise MetadataError("zarr_format", obj.get("zarr_format"), "expected 3")
        if obj.get("node_type") != "group":
            raise MetadataError("node_type", obj.get("node_type"), 'expected "group"')
        extra = _extensions(obj, {"zarr_format", "node_type", "attributes", "consolidated_metadata"})
        return cls(_attributes(obj.get("attributes")), extra)

    def to_json(self) -> dict[str, Any]:
        """The group metadata object."""
        out: dict[str, Any] = {"node_type": "group", "zarr_format": 3}
        if self.attributes:
            out["attributes"] = self.attributes
        out.update(self.extra)
        return out

    def to_bytes(self) -> bytes:
        """Compact, key-sorted UTF-8 JSON."""
        return json_text.dumps(self.to_json()).encode("utf-8")


def parse_zarr_json(data: bytes) -> ArrayMetadataV3 | GroupMetadataV3:
    """Parse ``zarr.json`` bytes into array or group metadata."""
    try:
        obj = json_text.loads(data, allow_constants=True)  # zarr-python writes NaN attributes
    except (ValueError, UnicodeDecodeError) as e:
        raise MetadataError("zarr.json", data[:80], f"not valid JSON: {e}") from e
    if isinstance(obj, Mapping) and obj.get("node_type") == "group":
        return GroupMetadataV3.from_json(obj)
    return ArrayMetadataV3.from_json(obj)
