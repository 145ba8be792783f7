"""Zarr v2 metadata: ``.zarray``, ``.zattrs`` and ``.zgroup``.

The chunk pipeline is expressed as a v3 codec chain so both formats share one decoder:
``order: "F"`` is a ``transpose`` (reversed dimensions), the dtype's byte order is a ``bytes``
codec and the compressor is a bytes -> bytes codec.  Output is byte-identical to what
TensorStore's ``zarr`` driver writes (compact, sorted keys, ``dimension_separator`` always
present, ``filters: null``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zarr3.chunk_grid import ChunkKeyEncoding, parse_shape
from zarr3.codecs import FILTERS, OBJECT_CODECS, CodecChain, compressor_from_v2, compressor_to_v2, filters_from_v2
from zarr3.codecs._filter import Filter
from zarr3.codecs.base import BytesBytesCodec, ChunkSpec, Codec
from zarr3.codecs.bytes import BytesCodec, StructBytesCodec
from zarr3.codecs.transpose import TransposeCodec
from zarr3.codecs.v2_filters import V2FilterCodec
from zarr3.dtypes import OBJECT, STRING, VLEN_BYTES, DataType, parse_dtype_v2, struct_v2_json, v2_dtype_string
from zarr3.engine import json_text
from zarr3.errors import MetadataError, UnsupportedError
from zarr3.fill_value import encode_fill_value_v2, parse_fill_value_v2
from zarr3.metadata_v3 import check_chunk_nbytes

__all__ = ["ArrayMetadataV2", "GroupMetadataV2", "parse_zarray"]


@dataclass(eq=False)
class ArrayMetadataV2:
    """A parsed (or to-be-written) ``.zarray`` (plus ``.zattrs``)."""

    shape: tuple[int, ...]
    data_type: DataType
    chunk_shape: tuple[int, ...]
    fill_value: np.ndarray | None
    compressor: BytesBytesCodec | None
    order: str = "C"
    dimension_separator: str = "."
    stored_dtype: np.dtype[Any] | None = None
    attributes: dict[str, Any] | None = None
    dtype_string: Any = None  # the v2 "dtype" member: a string, or a list for structured
    filters: list[Filter] | None = None  # numcodecs filters (incl. the object codec of |O arrays)
    chain: CodecChain = field(init=False, repr=False)

    zarr_format = 2
    dimension_names: tuple[str | None, ...] | None = None

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)
        self.chunk_shape = tuple(int(s) for s in self.chunk_shape)
        if len(self.chunk_shape) != len(self.shape):
            raise MetadataError("chunks", list(self.chunk_shape), f"expected {len(self.shape)} dimensions like shape")
        if self.order not in ("C", "F"):
            raise MetadataError("order", self.order, 'expected "C" or "F"')
        if self.dimension_separator not in (".", "/"):
            raise MetadataError("dimension_separator", self.dimension_separator, 'expected "." or "/"')
        check_chunk_nbytes(self.chunk_shape, self.data_type, "chunks")
        if self.stored_dtype is None:
            self.stored_dtype = self.data_type.dtype
        if self.dtype_string is None:
            if self.data_type.kind == "struct":
                self.dtype_string = struct_v2_json(self.stored_dtype)
            else:
                self.dtype_string = v2_dtype_string(self.data_type)
        endian = "big" if self.stored_dtype.byteorder == ">" else "little"
        codecs: list[Codec] = []
        if self.order == "F" and len(self.shape) > 1:
            codecs.append(TransposeCodec(range(len(self.shape) - 1, -1, -1)))
        if self.data_type.variable and not self.filters:
            self.filters = _default_object_codec(self.data_type)
        if self.filters:
            codecs.append(V2FilterCodec(self.filters, self.stored_dtype))
        elif self.data_type.kind == "struct":
            codecs.append(StructBytesCodec(self.stored_dtype))
        else:
            codecs.append(BytesCodec(endian))
        if self.compressor is not None:
            codecs.append(self.compressor)
        spec = ChunkSpec(self.chunk_shape, self.data_type, self.fill_value)
        self.chain = CodecChain(codecs, spec, "compressor")
        self._keys = ChunkKeyEncoding("v2", self.dimension_separator)
        if self.compressor is not None:
            self.compressor = self.chain.bb[0]

    @property
    def metadata_key(self) -> str:
        """The store key of this metadata document."""
        return ".zarray"

    @property
    def attrs(self) -> dict[str, Any]:
        """User attributes from ``.zattrs`` (empty dict if none)."""
        return dict(self.attributes or {})

    @property
    def codecs(self) -> list[Codec]:
        """The equivalent v3 codec list."""
        return self.chain.codecs

    def chunk_key(self, coords: Sequence[int]) -> str:
        """Store key of the chunk at grid position ``coords`` (``0`` for a 0-d array)."""
        return self._keys.encode(coords)

    def chunk_coords(self, key: str) -> tuple[int, ...] | None:
        """The grid position whose :meth:`chunk_key` is ``key`` (``None``: no chunk key)."""
        return self._keys.decode(key, len(self.shape))

    @classmethod
    def from_json(cls, obj: Any, attributes: dict[str, Any] | None = None) -> ArrayMetadataV2:
        """Parse and validate a decoded ``.zarray`` object."""
        if not isinstance(obj, Mapping):
            raise MetadataError(".zarray", obj, "expected a JSON object")
        if obj.get("zarr_format") != 2:
            raise MetadataError("zarr_format", obj.get("zarr_format"), "expected 2")
        for req in ("shape", "chunks", "dtype"):
            if req not in obj:
                raise MetadataError(req, None, "required member is missing")
        shape = parse_shape(obj["shape"], "shape")
        chunks = parse_shape(obj["chunks"], "chunks", minimum=1)
        if len(chunks) != len(shape):
            raise MetadataError("chunks", list(chunks), f"expected {len(shape)} dimensions like shape")
        dt, stored = parse_dtype_v2(obj["dtype"])
        filters = filters_from_v2(obj.get("filters"))
        if dt.kind == "object":
            dt = _object_type(filters)
            stored = dt.dtype
        compressor = compressor_from_v2(obj.get("compressor"), dt.itemsize)
        fill = parse_fill_value_v2(obj.get("fill_value"), dt, stored)
        order = obj.get("order", "C")
        if order not in ("C", "F"):
            raise MetadataError("order", order, 'expected "C" or "F"')
        sep = obj.get("dimension_separator", ".")
        if sep is None:
            sep = "."
        if sep not in (".", "/"):
            raise MetadataError("dimension_separator", sep, 'expected "." or "/"')
        return cls(
            shape=shape,
            data_type=dt,
            chunk_shape=chunks,
            fill_value=fill,
            compressor=compressor,
            order=order,
            dimension_separator=sep,
            stored_dtype=stored,
            attributes=attributes,
            dtype_string=obj["dtype"],
            filters=filters,
        )

    def to_json(self) -> dict[str, Any]:
        """The ``.zarray`` object as TensorStore writes it."""
        assert self.stored_dtype is not None
        return {
            "chunks": list(self.chunk_shape),
            "compressor": compressor_to_v2(self.compressor),
            "dimension_separator": self.dimension_separator,
            "dtype": self.dtype_string,
            "fill_value": encode_fill_value_v2(self.fill_value, self.data_type, self.stored_dtype),
            "filters": [f.to_v2() for f in self.filters] if self.filters else None,
            "order": self.order,
            "shape": list(self.shape),
            "zarr_format": 2,
        }

    def to_bytes(self) -> bytes:
        """Compact, key-sorted ``.zarray`` bytes."""
        return json_text.dumps(self.to_json()).encode("utf-8")

    def attrs_bytes(self) -> bytes | None:
        """``.zattrs`` bytes, or ``None`` when there are no attributes."""
        if not self.attributes:
            return None
        try:
            return json_text.dumps(self.attributes).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise MetadataError("attributes", self.attributes, f"not JSON-serializable: {e}") from e

    @property
    def nchunks(self) -> int:
        """Number of chunks in the grid."""
        return math.prod(-(-s // c) for s, c in zip(self.shape, self.chunk_shape))


def _object_type(filters: list[Filter]) -> DataType:
    """The data type of a v2 ``|O`` array, chosen by its object codec (the first filter)."""
    if not filters:
        raise MetadataError("filters", None, "an object (|O) array needs an object codec such as vlen-utf8")
    kind = OBJECT_CODECS.get(filters[0].codec_id)
    if kind is None:
        raise UnsupportedError(f"object codec {filters[0].codec_id!r}", "is not supported for |O arrays")
    return {"string": STRING, "vbytes": VLEN_BYTES}.get(kind, OBJECT)


def _default_object_codec(dt: DataType) -> list[Filter]:
    cid = {"string": "vlen-utf8", "vbytes": "vlen-bytes"}.get(dt.kind, "json2")
    return [FILTERS[cid].from_config({}, "filters[0]")]


@dataclass
class GroupMetadataV2:
    """A v2 group: ``.zgroup`` plus optional ``.zattrs``."""

    attributes: dict[str, Any] | None = None

    zarr_format = 2

    @property
    def metadata_key(self) -> str:
        """The store key of this metadata document."""
        return ".zgroup"

    @property
    def attrs(self) -> dict[str, Any]:
        """User attributes (empty dict if none)."""
        return dict(self.attributes or {})

    def to_bytes(self) -> bytes:
        """``.zgroup`` bytes."""
        return b'{"zarr_format":2}'

    def attrs_bytes(self) -> bytes | None:
        """``.zattrs`` bytes, or ``None`` when there are no attributes."""
        if not self.attributes:
            return None
        return json_text.dumps(self.attributes).encode("utf-8")


def parse_json_doc(data: bytes, name: str) -> Any:
    """Parse a JSON metadata document, reporting errors as :class:`MetadataError`."""
    try:
        return json_text.loads(data, allow_constants=True)  # zarr-python writes NaN attributes
    except (ValueError, UnicodeDecodeError) as e:
        raise MetadataError(name, bytes(data[:80]), f"not valid JSON: {e}") from e


def parse_zattrs(data: bytes | None) -> dict[str, Any] | None:
    """Parse ``.zattrs`` (``None`` if absent)."""
    if data is None:
        return None
    obj = parse_json_doc(data, ".zattrs")
    if not isinstance(obj, Mapping):
        raise MetadataError(".zattrs", obj, "expected a JSON object")
    return dict(obj)


def parse_zarray(data: bytes, zattrs: bytes | None = None) -> ArrayMetadataV2:
    """Parse ``.zarray`` bytes (and optional ``.zattrs`` bytes)."""
    return ArrayMetadataV2.from_json(parse_json_doc(data, ".zarray"), parse_zattrs(zattrs))
