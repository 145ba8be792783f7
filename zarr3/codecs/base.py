"""Codec interfaces and the codec chain.

A Zarr v3 chunk goes through zero or more array -> array codecs, exactly one array -> bytes
codec and zero or more bytes -> bytes codecs.  :class:`CodecChain` binds such a list to the
chunk's shape, data type and fill value (a :class:`ChunkSpec`), validates it, and encodes and
decodes whole chunks.  Every decode is bounded: the expected size of each stage is computed
from the chunk spec, and a stage that produces more (or, where the size is exact, a different
amount) raises :class:`~ocdbt_py.errors.CorruptionError`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Union

import numpy as np

from zarr3.dtypes import DataType
from zarr3.errors import MetadataError

__all__ = [
    "Buffer",
    "ChunkSpec",
    "Codec",
    "ArrayArrayCodec",
    "ArrayBytesCodec",
    "BytesBytesCodec",
    "ByteSource",
    "check_config",
    "as_uint8",
    "encoder_int",
    "clamp",
]

#: Anything exposing the buffer protocol that codecs accept and return.
Buffer = Union[bytes, bytearray, memoryview]


@dataclass(frozen=True)
class ChunkSpec:
    """Shape, data type and fill value of the chunk a codec sees."""

    shape: tuple[int, ...]
    dtype: DataType
    fill_value: np.ndarray | None = None

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded chunk."""
        return self.size * self.dtype.itemsize

    def with_shape(self, shape: Sequence[int]) -> ChunkSpec:
        """The same spec with another shape."""
        return ChunkSpec(tuple(int(s) for s in shape), self.dtype, self.fill_value)


def check_config(config: Any, allowed: Sequence[str], field: str, *, required: Sequence[str] = ()) -> Mapping[str, Any]:
    """Validate a codec ``configuration`` object: a mapping with only ``allowed`` keys."""
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise MetadataError(field, config, "codec configuration must be an object")
    for key in config:
        if key not in allowed:
            raise MetadataError(f"{field}.{key}", config[key], "unknown codec configuration member")
    for key in required:
        if key not in config:
            raise MetadataError(f"{field}.{key}", None, "required codec configuration member")
    return config


def encoder_int(value: Any, field: str) -> int:
    """An encoder-only integer setting (a compression level, lz4's acceleration).

    The decoder never needs it, so any integer a peer wrote is accepted (zarr-python writes
    gzip ``level: -1``, lz4 ``acceleration: 0``, zstd ``level: 100``); encoding clamps it to
    what the library takes (:func:`clamp`).  Only a non-integer is invalid metadata.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise MetadataError(field, value, "expected an integer")
    return value


def clamp(value: int, lo: int, hi: int) -> int:
    """``value`` limited to ``[lo, hi]`` (encoder settings a library would reject)."""
    return max(lo, min(hi, value))


def as_uint8(data: Buffer | np.ndarray) -> memoryview:
    """A flat unsigned-byte memoryview of ``data`` without copying."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8).data
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


class Codec(abc.ABC):
    """Base class of every codec.  ``name`` is the Zarr v3 codec name."""

    name: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Any, field: str) -> Codec:
        """Build the codec from its ``configuration`` object (``field`` names it in errors)."""

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any] | str, field: str = "codec") -> Codec:
        """Build the codec from a v3 metadata entry ``{"name": ..., "configuration": ...}``."""
        if isinstance(entry, str):
            entry = {"name": entry}
        name = entry.get("name")
        if name != cls.name:
            raise MetadataError(f"{field}.name", name, f"expected {cls.name!r}")
        return cls.from_config(entry.get("configuration"), f"{field}.configuration")

    @abc.abstractmethod
    def configuration(self) -> dict[str, Any] | None:
        """The ``configuration`` object TensorStore would write, or ``None`` for none."""

    def to_dict(self) -> dict[str, Any]:
        """The codec as a v3 metadata entry: ``{"configuration": ..., "name": ...}``."""
        config = self.configuration()
        if config is None:
            return {"name": self.name}
        return {"configuration": config, "name": self.name}

    def resolve(self, spec: ChunkSpec, field: str) -> Codec:
        """Validate against (and specialise for) the chunk spec this codec will see."""
        return self

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(repr(self.to_dict()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.configuration() or ''})"


class ArrayArrayCodec(Codec):
    """Transforms an array into another array (``transpose``)."""

    @abc.abstractmethod
    def encoded_spec(self, spec: ChunkSpec) -> ChunkSpec:
        """The spec of the array this codec produces from an array of ``spec``."""

    @abc.abstractmethod
    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> np.ndarray:
        """Encode ``arr`` (of ``spec``)."""

    @abc.abstractmethod
    def decode(self, arr: np.ndarray, spec: ChunkSpec) -> np.ndarray:
        """Decode ``arr`` back into an array of ``spec`` (a view where possible)."""


class ArrayBytesCodec(Codec):
    """Serialises an array to bytes (``bytes``, ``sharding_indexed``)."""

    @abc.abstractmethod
    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer | None:
        """Serialise ``arr``; ``None`` means "nothing to store" (an all-fill shard)."""

    @abc.abstractmethod
    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        """Deserialise bytes into an array of ``spec`` (may be a read-only view of ``data``)."""

    def encoded_size(self, spec: ChunkSpec) -> int | None:
        """Exact encoded size if it does not depend on the data, else ``None``."""
        return None

    @abc.abstractmethod
    def max_encoded_size(self, spec: ChunkSpec) -> int:
        """Upper bound of the encoded size."""


class ByteSource(Protocol):
    """Encoded bytes that arrive in pieces (a remote read in parts): what
    :meth:`BytesBytesCodec.decode_stream_into` and :meth:`~zarr3.codecs.chain.CodecChain.decode_stream_into` read."""

    @property
    def nbytes(self) -> int:
        """The length of the whole."""

    def head(self, n: int) -> Buffer:
        """The first ``n`` bytes (fewer only if the whole is shorter), waiting for them."""

    def read(self, n: int) -> Buffer:
        """The next piece of at most ``n`` bytes (waiting for it), empty at the end."""


class BytesBytesCodec(Codec):
    """Transforms bytes into bytes (compressors, checksums)."""

    @abc.abstractmethod
    def encode(self, data: Buffer) -> Buffer:
        """Encode ``data``."""

    @abc.abstractmethod
    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        """Decode ``data``.

        ``size`` is the exact decoded size when known; ``bound`` always limits the output.
        Implementations must never allocate more than ``bound`` plus a small constant.
        """

    def decode_into(self, data: Buffer, out: memoryview) -> None:
        """Decode ``data`` into ``out``, which has exactly the decoded size."""
        res = self.decode(data, len(out), len(out))
        out[:] = as_uint8(res)

    #: whether :meth:`decode_stream_into` decodes as the input arrives
    streams = False

    def decode_stream_into(self, source: ByteSource, out: memoryview) -> None:
        """Decode the bytes ``source`` yields into ``out`` (exactly the decoded size) as they
        arrive.  Only where :attr:`streams`."""
        raise NotImplementedError

    def check_decodable(self, data: Buffer, size: int | None) -> None:
        """Raise :class:`CorruptionError` if ``data`` cannot decode to ``size`` bytes, judged
        cheaply from its header and length (called before any chunk-sized buffer is
        allocated for it).  The default checks nothing."""

    def encoded_size(self, decoded_size: int | None) -> int | None:
        """Exact encoded size for a given decoded size, if fixed (checksums), else ``None``."""
        return None

    def verifies(self, data: Buffer | None) -> bool:
        """Whether decoding checks a checksum over the stored bytes, so that a changed byte
        fails instead of decoding to other values.  ``data`` is a stored value when at hand
        (a codec whose stored values say so themselves, like a zstd frame, looks at it);
        ``None`` asks about the configuration alone.  The default: no checksum."""
        return False

    @abc.abstractmethod
    def max_encoded_size(self, decoded_size: int) -> int:
        """Upper bound of the encoded size for ``decoded_size`` input bytes."""
