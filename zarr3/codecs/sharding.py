"""The ``sharding_indexed`` array -> bytes codec.

A shard holds a grid of inner chunks, each encoded with the inner codec chain, plus an index:
a C-order ``uint64`` array ``[*chunks_per_shard, 2]`` of ``(offset, nbytes)``, encoded with
``index_codecs`` (fixed size, normally ``bytes`` + ``crc32c``) and stored at the ``start`` or
``end`` of the shard.  ``(2^64-1, 2^64-1)`` marks an inner chunk that is not stored (fill
value).  Inner chunks may be nested shards.

The array layer reads only the index (a suffix or prefix byte range) and the byte ranges of
the inner chunks a selection touches; :meth:`ShardingCodec.decode` decodes a whole shard.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import ArrayBytesCodec, Buffer, ChunkSpec, Codec, as_uint8, check_config
from zarr3.codecs.bytes import BytesCodec
from zarr3.codecs.chain import CodecChain, equals_fill
from zarr3.codecs.crc32c import Crc32cCodec
from zarr3.dtypes import DATA_TYPES
from zarr3.errors import MetadataError

__all__ = ["ShardingCodec", "MISSING", "MAX_SHARD_ENTRIES"]

#: Index value marking an inner chunk that is not stored.
MISSING = 0xFFFF_FFFF_FFFF_FFFF
#: Most inner chunks per shard accepted (TensorStore allows 2^30; an index that large would
#: need 16 GiB before reading a single chunk).
MAX_SHARD_ENTRIES = 1 << 26
_INT63 = (1 << 63) - 1


def _shape(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise MetadataError(field, value, "expected a list of positive integers")
    return tuple(value)


#: Parses the nested codec lists of a shard: installed by the codec registry
#: (:mod:`zarr3.codecs`), which imports this module, so this module never imports it back.
_parse_codecs: Callable[[Any, str], list[Codec]] | None = None


def use_codec_parser(parse: Callable[[Any, str], list[Codec]]) -> None:
    """Install the function that parses nested codec lists (called by the registry)."""
    global _parse_codecs
    _parse_codecs = parse


def _codec_list(value: Any, field: str) -> list[Codec]:
    if _parse_codecs is None:  # pragma: no cover - the registry installs it on import
        raise RuntimeError("zarr3.codecs did not install its codec parser")
    return _parse_codecs(value, field)


class ShardingCodec(ArrayBytesCodec):
    """Store a grid of inner chunks and their index in one value."""

    name = "sharding_indexed"

    def __init__(
        self,
        chunk_shape: tuple[int, ...],
        codecs: list[Codec] | None = None,
        index_codecs: list[Codec] | None = None,
        index_location: str = "end",
    ):
        if index_location not in ("start", "end"):
            raise MetadataError("index_location", index_location, 'expected "start" or "end"')
        self.chunk_shape = tuple(chunk_shape)
        self.codecs: list[Codec] = list(codecs) if codecs is not None else [BytesCodec()]
        self.index_codecs: list[Codec] = (
            list(index_codecs) if index_codecs is not None else [BytesCodec(), Crc32cCodec()]
        )
        self.index_location = index_location
        self.inner: CodecChain | None = None
        self.index_chain: CodecChain | None = None
        self.chunks_per_shard: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: Any, field: str) -> ShardingCodec:
        cfg = check_config(
            config,
            ("chunk_shape", "codecs", "index_codecs", "index_location"),
            field,
            required=("chunk_shape",),
        )
        chunk_shape = _shape(cfg["chunk_shape"], f"{field}.chunk_shape")
        codecs = _codec_list(cfg["codecs"], f"{field}.codecs") if "codecs" in cfg else None
        index_codecs = _codec_list(cfg["index_codecs"], f"{field}.index_codecs") if "index_codecs" in cfg else None
        loc = cfg.get("index_location", "end")
        if loc not in ("start", "end"):
            raise MetadataError(f"{field}.index_location", loc, 'expected "start" or "end"')
        return cls(chunk_shape, codecs, index_codecs, loc)

    def resolve(self, spec: ChunkSpec, field: str) -> ShardingCodec:
        cfg = f"{field}.configuration"
        if len(self.chunk_shape) != len(spec.shape):
            raise MetadataError(
                f"{cfg}.chunk_shape",
                list(self.chunk_shape),
                f"rank {len(self.chunk_shape)} does not match the shard rank {len(spec.shape)}",
            )
        for outer, inner in zip(spec.shape, self.chunk_shape):
            if outer % inner:
                raise MetadataError(
                    f"{cfg}.chunk_shape",
                    list(self.chunk_shape),
                    f"does not evenly divide the shard shape {list(spec.shape)}",
                )
        cps = tuple(o // i for o, i in zip(spec.shape, self.chunk_shape))
        if math.prod(cps) > MAX_SHARD_ENTRIES:
            raise MetadataError(
                f"{cfg}.chunk_shape",
                list(self.chunk_shape),
                f"{math.prod(cps)} inner chunks per shard exceeds the limit of {MAX_SHARD_ENTRIES}",
            )
        out = ShardingCodec(self.chunk_shape, self.codecs, self.index_codecs, self.index_location)
        out.inner = CodecChain(self.codecs, spec.with_shape(self.chunk_shape), f"{cfg}.codecs")
        index_spec = ChunkSpec(cps + (2,), DATA_TYPES["uint64"], np.array(MISSING, dtype=np.uint64))
        out.index_chain = CodecChain(self.index_codecs, index_spec, f"{cfg}.index_codecs")
        if out.index_chain.encoded_size is None:
            raise MetadataError(
                f"{cfg}.index_codecs",
                out.index_chain.to_json(),
                "only fixed-size index encodings are supported",
            )
        out.chunks_per_shard = cps
        return out

    def configuration(self) -> dict[str, Any]:
        inner = self.inner.to_json() if self.inner else [c.to_dict() for c in self.codecs]
        index = self.index_chain.to_json() if self.index_chain else [c.to_dict() for c in self.index_codecs]
        out: dict[str, Any] = {"chunk_shape": list(self.chunk_shape), "codecs": inner, "index_codecs": index}
        if self.index_location == "start":
            out["index_location"] = "start"
        return out

    # -- index ---------------------------------------------------------------------------
    def _chains(self) -> tuple[CodecChain, CodecChain]:
        assert self.inner is not None and self.index_chain is not None, "resolve() first"
        return self.inner, self.index_chain

    @property
    def num_entries(self) -> int:
        """Inner chunks per shard."""
        return math.prod(self.chunks_per_shard)

    @property
    def index_nbytes(self) -> int:
        """Size of the encoded index."""
        size = self._chains()[1].encoded_size
        assert size is not None
        return size

    def index_byte_range(self) -> tuple[int, int | None]:
        """The byte range holding the index: a prefix or a suffix of the shard."""
        n = self.index_nbytes
        return (0, n) if self.index_location == "start" else (-n, None)

    def decode_index(self, data: Buffer, shard_size: int | None = None) -> np.ndarray:
        """Decode the encoded index into a ``(num_entries, 2)`` uint64 array and validate it.

        A stored entry must not overflow and, when ``shard_size`` is known, must lie inside
        the shard; otherwise :class:`CorruptionError`.
        """
        if len(data) != self.index_nbytes:
            raise CorruptionError(f"shard index has {len(data)} bytes, expected {self.index_nbytes}")
        entries = self._chains()[1].decode(data).reshape(-1, 2)
        offsets = entries[:, 0]
        lengths = entries[:, 1]
        missing = (offsets == MISSING) & (lengths == MISSING)
        present = ~missing
        if present.any():
            off = offsets[present]
            ln = lengths[present]
            if (off > _INT63).any() or (ln > _INT63).any() or ((off + ln) > _INT63).any():
                bad = int(np.flatnonzero(present)[0])
                raise CorruptionError(f"invalid shard index entry {bad}: offset/length overflow")
            if shard_size is not None:
                end = off + ln
                over = end > shard_size
                if over.any():
                    i = int(np.flatnonzero(present)[int(np.flatnonzero(over)[0])])
                    raise CorruptionError(
                        f"shard index entry {i} (offset {int(offsets[i])}, {int(lengths[i])} bytes) "
                        f"points past the end of the {shard_size}-byte shard"
                    )
        return np.ascontiguousarray(entries)

    def split_shard(self, data: Buffer) -> tuple[np.ndarray, memoryview]:
        """Decode the index of a whole shard; returns ``(entries, shard bytes)``."""
        mv = as_uint8(data)
        n = self.index_nbytes
        if len(mv) < n:
            raise CorruptionError(f"shard of {len(mv)} bytes is shorter than its {n}-byte index")
        index_bytes = mv[:n] if self.index_location == "start" else mv[len(mv) - n :]
        return self.decode_index(index_bytes, len(mv)), mv

    # -- whole-shard coding ----------------------------------------------------------------
    def _inner_slices(self, idx: tuple[int, ...]) -> tuple[Any, ...]:
        # the trailing "..." keeps 0-d regions arrays (a bare () index would give a scalar)
        return (*(slice(i * c, (i + 1) * c) for i, c in zip(idx, self.chunk_shape)), Ellipsis)

    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        inner, _ = self._chains()
        entries, mv = self.split_shard(data)
        out = np.empty(spec.shape, dtype=spec.dtype.dtype)
        fill = spec.fill_value
        for flat, idx in enumerate(itertools.product(*(range(c) for c in self.chunks_per_shard))):
            off, n = int(entries[flat, 0]), int(entries[flat, 1])
            region = out[self._inner_slices(idx)]
            if off == MISSING and n == MISSING:
                region[...] = 0 if fill is None else fill
            else:
                inner.decode_into(mv[off : off + n], region)
        return out

    def encode_entries(self, arr: np.ndarray, *, write_empty_chunks: bool = False) -> list[Buffer | None]:
        """Encode every inner chunk of a shard-shaped array (``None`` for all-fill chunks)."""
        inner, _ = self._chains()
        fill = inner.spec.fill_value
        out: list[Buffer | None] = []
        for idx in itertools.product(*(range(c) for c in self.chunks_per_shard)):
            region = arr[self._inner_slices(idx)]
            if not write_empty_chunks and equals_fill(region, fill):
                out.append(None)
            else:
                out.append(inner.encode(region, write_empty_chunks=write_empty_chunks))
        return out

    def assemble(self, entries: list[Buffer | None]) -> bytes | None:
        """Build a shard from encoded inner chunks in C order; ``None`` if all are empty."""
        parts = self.assemble_parts(entries)
        return None if parts is None else b"".join(parts)

    def assemble_parts(self, entries: list[Buffer | None]) -> list[Buffer] | None:
        """Like :meth:`assemble` but returns the pieces to concatenate (no copy)."""
        _, index_chain = self._chains()
        if len(entries) != self.num_entries:
            raise ValueError(f"expected {self.num_entries} shard entries, got {len(entries)}")
        if all(e is None for e in entries):
            return None
        index = np.empty((len(entries), 2), dtype=np.uint64)
        pos = self.index_nbytes if self.index_location == "start" else 0
        parts: list[Buffer] = []
        for i, e in enumerate(entries):
            if e is None:
                index[i] = MISSING
            else:
                n = memoryview(e).nbytes
                index[i, 0] = pos
                index[i, 1] = n
                pos += n
                parts.append(e)
        encoded = index_chain.encode(index.reshape(self.chunks_per_shard + (2,)))
        assert encoded is not None
        if self.index_location == "start":
            return [bytes(encoded), *parts]
        parts.append(bytes(encoded))
        return parts

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer | None:
        return self.assemble(self.encode_entries(arr))

    def encode_shard(self, arr: np.ndarray, spec: ChunkSpec, *, write_empty_chunks: bool = False) -> Buffer | None:
        """Encode a whole shard, honouring ``write_empty_chunks``."""
        return self.assemble(self.encode_entries(arr, write_empty_chunks=write_empty_chunks))

    def max_encoded_size(self, spec: ChunkSpec) -> int:
        inner, _ = self._chains()
        return self.index_nbytes + self.num_entries * inner.max_encoded_size
