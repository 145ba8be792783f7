"""A resolved codec pipeline for one chunk spec: array->array*, array->bytes, bytes->bytes*."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import (
    ArrayArrayCodec,
    ArrayBytesCodec,
    Buffer,
    BytesBytesCodec,
    ByteSource,
    ChunkSpec,
    Codec,
    as_uint8,
)
from zarr3.codecs.bytes import BytesCodec
from zarr3.codecs.crc32c import Crc32cCodec
from zarr3.errors import MetadataError

__all__ = ["CodecChain", "equals_fill"]


def equals_fill(arr: np.ndarray, fill: np.ndarray | None) -> bool:
    """Whether every element of ``arr`` has exactly the bits of ``fill`` (``None`` = zeros).

    TensorStore compares bit patterns, so ``-0.0`` differs from ``0.0`` and a NaN equals the
    fill value only if the payload matches.
    """
    itemsize = arr.dtype.itemsize
    if arr.size == 0:
        return True
    if arr.dtype.kind in "OT":  # variable-length elements: compare values
        target = "" if fill is None and arr.dtype.kind == "T" else (None if fill is None else fill[()])
        return bool(all(x == target for x in arr.reshape(-1).tolist()))
    if arr.dtype.kind in "SU":  # fixed-size strings: compare the raw bytes of each element
        rows = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).reshape(-1, itemsize)
        pattern = bytes(itemsize) if fill is None else np.asarray(fill, arr.dtype).tobytes()
        return bool((rows == np.frombuffer(pattern, np.uint8)).all())
    if itemsize in (1, 2, 4, 8) and arr.dtype.names is None:
        # cheap early exit: real data rarely starts or ends with the fill value
        ubits = np.dtype(f"u{itemsize}")
        target_bits = 0 if fill is None else int(np.asarray(fill).reshape(1).view(ubits)[0])
        for corner in ((0,) * arr.ndim, (-1,) * arr.ndim):
            if int(np.asarray(arr[corner]).reshape(1).view(ubits)[0]) != target_bits:
                return False
    if (
        itemsize in (1, 2, 4, 8)
        and arr.dtype.kind != "V"
        or (arr.dtype.kind == "V" and itemsize in (1, 2, 4, 8) and arr.dtype.names is None)
    ):
        try:
            bits = arr.view(f"u{itemsize}")
        except ValueError:
            bits = np.ascontiguousarray(arr).view(f"u{itemsize}")
        if fill is None:
            return not bits.any()
        target = np.asarray(fill).reshape(1).view(f"u{itemsize}")[0]
        if target == 0:
            return not bits.any()
        return bool((bits == target).all())
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    pattern = bytes(itemsize) if fill is None else np.asarray(fill).tobytes()
    if not any(pattern):
        return not flat.any()
    return bool((flat.reshape(-1, itemsize) == np.frombuffer(pattern, np.uint8)).all())


class CodecChain:
    """A codec list bound to the chunk spec it encodes.

    ``sizes[i]`` is the exact size of the bytes entering bytes->bytes codec ``i`` (``None`` if
    data dependent) and ``bounds[i]`` an upper bound; the last entries describe the final
    encoded value.
    """

    def __init__(self, codecs: Sequence[Codec], spec: ChunkSpec, field: str = "codecs"):
        self.spec = spec
        aa: list[ArrayArrayCodec] = []
        aa_specs: list[ChunkSpec] = []
        ab: ArrayBytesCodec | None = None
        bb: list[BytesBytesCodec] = []
        cur = spec
        for i, codec in enumerate(codecs):
            f = f"{field}[{i}]"
            if isinstance(codec, ArrayArrayCodec):
                if ab is not None:
                    raise MetadataError(f"{f}.name", codec.name, "array -> array codec after the array -> bytes codec")
                resolved = codec.resolve(cur, f)
                assert isinstance(resolved, ArrayArrayCodec)
                aa.append(resolved)
                aa_specs.append(cur)
                cur = resolved.encoded_spec(cur)
            elif isinstance(codec, ArrayBytesCodec):
                if ab is not None:
                    raise MetadataError(f"{f}.name", codec.name, "second array -> bytes codec")
                resolved_ab = codec.resolve(cur, f)
                assert isinstance(resolved_ab, ArrayBytesCodec)
                ab = resolved_ab
            elif isinstance(codec, BytesBytesCodec):
                if ab is None:
                    raise MetadataError(f"{f}.name", codec.name, "bytes -> bytes codec before the array -> bytes codec")
                resolved_bb = codec.resolve(cur, f)
                assert isinstance(resolved_bb, BytesBytesCodec)
                bb.append(resolved_bb)
            else:  # pragma: no cover - all codecs derive from one of the three
                raise MetadataError(f"{f}.name", getattr(codec, "name", codec), "not a codec")
        if ab is None:
            raise MetadataError(field, [c.to_dict() for c in codecs], "no array -> bytes codec (e.g. bytes)")
        self.aa = aa
        self.aa_specs = aa_specs
        self.ab = ab
        self.ab_spec = cur
        self.bb = bb
        sizes: list[int | None] = [ab.encoded_size(cur)]
        bounds: list[int] = [ab.max_encoded_size(cur)]
        for codec in bb:
            sizes.append(codec.encoded_size(sizes[-1]))
            bounds.append(codec.max_encoded_size(bounds[-1]))
        self.sizes = sizes
        self.bounds = bounds
        # Fast path: the stored bytes (after bytes->bytes decoding) are the chunk in C order.
        self.direct = not aa and isinstance(ab, BytesCodec) and ab.native and spec.dtype.kind != "raw"

    @property
    def codecs(self) -> list[Codec]:
        """The resolved codecs, in metadata order."""
        return [*self.aa, self.ab, *self.bb]

    def to_json(self) -> list[dict[str, Any]]:
        """The codec list as TensorStore writes it."""
        return [c.to_dict() for c in self.codecs]

    @property
    def encoded_size(self) -> int | None:
        """Exact size of an encoded chunk, if it does not depend on the data."""
        return self.sizes[-1]

    @property
    def max_encoded_size(self) -> int:
        """Upper bound of an encoded chunk's size."""
        return self.bounds[-1]

    def carries_checksum(self, data: Buffer | None = None) -> bool:
        """Whether decoding the stored chunk ``data`` checks a checksum over its bytes (a
        ``crc32c`` codec, a numcodecs checksum, a zstd frame with its content checksum; for a
        shard, the inner chunks' codecs).  Without one, a changed byte that still decodes
        yields other values unnoticed.  ``data=None`` judges the metadata alone."""
        for i in range(len(self.bb) - 1, -1, -1):
            if self.bb[i].verifies(data if i == len(self.bb) - 1 else None):
                return True
        inner = getattr(self.ab, "inner", None)
        return isinstance(inner, CodecChain) and inner.carries_checksum(None)

    # -- decoding ------------------------------------------------------------------------
    def check_decodable(self, data: Buffer) -> None:
        """Cheap check that stored ``data`` can decode to this chunk (its outermost codec
        judges from the header and length); call it before allocating a chunk buffer.
        Without a compressor (no bytes -> bytes codec, or only checksums) the stored value is
        the chunk itself: its size must be exact."""
        for i in range(len(self.bb) - 1, -1, -1):
            codec = self.bb[i]
            codec.check_decodable(data, self.sizes[i])
            if not isinstance(codec, Crc32cCodec):
                return
            mv = as_uint8(data)  # a checksum trailer: judge what it wraps
            if len(mv) < 4:
                return
            data = mv[:-4]
        size = self.sizes[0]
        n = as_uint8(data).nbytes
        if size is not None and n != size:
            raise CorruptionError(f"chunk holds {n} bytes, expected {size} for shape "
                                  f"{list(self.spec.shape)} of {self.spec.dtype.name}")

    def _decode_bytes(self, data: Buffer, scratch: memoryview | None) -> Buffer:
        """Undo the bytes->bytes codecs; the result may live in ``scratch``."""
        bb = self.bb
        for i in range(len(bb) - 1, 0, -1):
            data = bb[i].decode(data, self.sizes[i], self.bounds[i])
        if bb:
            size0 = self.sizes[0]
            if scratch is not None and size0 is not None and len(scratch) >= size0:
                target = scratch[:size0]
                bb[0].decode_into(data, target)
                return target
            data = bb[0].decode(data, size0, self.bounds[0])
        return data

    def decode(self, data: Buffer, scratch: memoryview | None = None) -> np.ndarray:
        """Decode a stored chunk into an array of ``spec.shape``.

        The result may be a read-only view of ``data`` or of ``scratch``; copy it before the
        next decode that uses the same scratch buffer.
        """
        raw = self._decode_bytes(data, scratch)
        arr = self.ab.decode(raw, self.ab_spec)
        for codec, spec in zip(reversed(self.aa), reversed(self.aa_specs)):
            arr = codec.decode(arr, spec)
        return arr

    def decode_into(self, data: Buffer, out: np.ndarray, scratch: memoryview | None = None) -> None:
        """Decode a stored chunk straight into ``out`` (shape ``spec.shape``)."""
        if self.direct and out.flags.c_contiguous and out.flags.writeable:
            target = as_uint8(out)
            bb = self.bb
            if not bb:
                src = as_uint8(data)
                if len(src) != len(target):
                    # let the bytes codec produce the error message
                    self.ab.decode(data, self.ab_spec)
                target[:] = src
                return
            for i in range(len(bb) - 1, 0, -1):
                data = bb[i].decode(data, self.sizes[i], self.bounds[i])
            bb[0].decode_into(data, target)
            return
        np.copyto(out, self.decode(data, scratch), casting="no")

    def streams_into(self, out: np.ndarray) -> bool:
        """Whether :meth:`decode_stream_into` can decode into ``out`` as the stored bytes
        arrive: the chunk is stored as its native bytes, uncompressed or under one codec that
        decodes a stream (zstd), and ``out`` is contiguous and writable."""
        return bool(self.direct and out.flags.c_contiguous and out.flags.writeable
                    and (not self.bb or (len(self.bb) == 1 and self.bb[0].streams)))

    def decode_stream_into(self, source: ByteSource, out: np.ndarray) -> None:
        """Decode the stored chunk ``source`` yields straight into ``out`` (shape
        ``spec.shape``), each piece as it arrives.  Only where :meth:`streams_into`."""
        target = as_uint8(out)
        if self.bb:
            self.bb[0].decode_stream_into(source, target)
            return
        n = source.nbytes
        if n != len(target):
            raise CorruptionError(f"chunk holds {n} bytes, expected {len(target)} for shape "
                                  f"{list(self.spec.shape)} of {self.spec.dtype.name}")
        got = 0
        while got < n:
            piece = as_uint8(source.read(n - got))
            if not len(piece):
                break
            target[got: got + len(piece)] = piece
            got += len(piece)
        if got != n:
            raise CorruptionError(f"chunk holds {got} bytes, expected {n}")

    # -- encoding ------------------------------------------------------------------------
    def encode(self, arr: np.ndarray, *, write_empty_chunks: bool = False) -> Buffer | None:
        """Encode a chunk of ``spec.shape``; ``None`` means "store nothing" (empty shard)."""
        for aa, spec in zip(self.aa, self.aa_specs):
            arr = aa.encode(arr, spec)
        ab = self.ab
        if hasattr(ab, "encode_shard"):
            data = ab.encode_shard(arr, self.ab_spec, write_empty_chunks=write_empty_chunks)  # type: ignore[attr-defined]
        else:
            data = ab.encode(arr, self.ab_spec)
        if data is None:
            return None
        for bb in self.bb:
            data = bb.encode(data)
        return data
