"""Zarr codecs: one module per codec, a registry and the codec chain.

v3 codecs: ``bytes``, ``transpose``, ``zstd``, ``gzip``, ``blosc``, ``crc32c``,
``sharding_indexed``, ``vlen-utf8``, ``vlen-bytes`` and zarr-python's ``numcodecs.*``.
v2 compressors (``zstd``, ``blosc``, ``zlib``, ``gzip``, ``bz2``, ``lz4``, ``lzma``,
``shuffle``, ``crc32``, ``adler32``, ``crc32c``) map onto bytes -> bytes codecs through
:func:`compressor_from_v2`; v2 ``filters`` (numcodecs filters and object codecs) onto
:class:`~zarr3.codecs.v2_filters.V2FilterCodec` through :func:`filters_from_v2`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zarr3.codecs import (  # noqa: F401 - importing registers the v2 filters
    astype,
    bitround,
    categorize,
    delta,
    fixedscaleoffset,
    json2,
    packbits,
    quantize,
)
from zarr3.codecs._filter import FILTERS, Filter
from zarr3.codecs.base import (
    ArrayArrayCodec,
    ArrayBytesCodec,
    BytesBytesCodec,
    ChunkSpec,
    Codec,
)
from zarr3.codecs.blosc import BloscCodec
from zarr3.codecs.bytes import BytesCodec
from zarr3.codecs.bz2 import Bz2Codec
from zarr3.codecs.chain import CodecChain
from zarr3.codecs.checksum32 import CHECKSUMS, Checksum32Codec
from zarr3.codecs.crc32c import Crc32cCodec
from zarr3.codecs.gzip import GzipCodec
from zarr3.codecs.lz4 import Lz4Codec
from zarr3.codecs.lzma import LzmaCodec
from zarr3.codecs.numcodecs_v3 import PREFIX, numcodecs_codec, use_compressor_parser
from zarr3.codecs.sharding import ShardingCodec, use_codec_parser
from zarr3.codecs.shuffle import ShuffleCodec, ShuffleFilter
from zarr3.codecs.transpose import TransposeCodec
from zarr3.codecs.vlen_bytes import VlenBytesCodec, VlenBytesFilter
from zarr3.codecs.vlen_utf8 import VlenUtf8Codec, VlenUtf8Filter
from zarr3.codecs.zlib import ZlibCodec
from zarr3.codecs.zstd import ZstdCodec
from zarr3.errors import MetadataError, UnsupportedError

__all__ = [
    "Codec",
    "ArrayArrayCodec",
    "ArrayBytesCodec",
    "BytesBytesCodec",
    "ChunkSpec",
    "CodecChain",
    "BytesCodec",
    "TransposeCodec",
    "ZstdCodec",
    "GzipCodec",
    "BloscCodec",
    "Crc32cCodec",
    "ShardingCodec",
    "ZlibCodec",
    "Bz2Codec",
    "Lz4Codec",
    "CODECS",
    "register_codec",
    "codec_from_dict",
    "parse_codecs",
    "compressor_from_v2",
    "compressor_to_v2",
    "filters_from_v2",
    "LzmaCodec",
    "ShuffleCodec",
    "Checksum32Codec",
    "VlenUtf8Codec",
    "VlenBytesCodec",
    "Filter",
    "FILTERS",
    "OBJECT_CODECS",
    "UNSUPPORTED_OBJECT_CODECS",
    "ShuffleFilter",
    "VlenBytesFilter",
    "VlenUtf8Filter",
]

#: v3 codec classes by name.
CODECS: dict[str, type[Codec]] = {
    c.name: c
    for c in (
        BytesCodec,
        TransposeCodec,
        ZstdCodec,
        GzipCodec,
        BloscCodec,
        Crc32cCodec,
        ShardingCodec,
        VlenUtf8Codec,
        VlenBytesCodec,
    )
}
#: v2 object codecs (first filter of an ``|O`` array) and the data type kind they give.
OBJECT_CODECS = {"vlen-utf8": "string", "vlen-bytes": "vbytes", "json2": "object", "categorize": "object"}
#: object codecs zarr3 will not read, and why.
UNSUPPORTED_OBJECT_CODECS = {
    "pickle": "is never read: unpickling runs arbitrary code",
    "msgpack2": "is not supported",
    "vlen-array": "is not supported",
    "json": "is not supported (numcodecs' legacy json codec)",
}
_V2_COMPRESSORS = "adler32, blosc, bz2, crc32, crc32c, gzip, lz4, lzma, shuffle, zlib, zstd"
# zarr-python once wrote the bytes codec as "endian"; accept it on read.
_ALIASES = {"endian": "bytes"}


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Register an extra v3 codec class (usable as a decorator)."""
    CODECS[cls.name] = cls
    return cls


def codec_from_dict(entry: Any, field: str = "codecs[0]") -> Codec:
    """Build a codec from a v3 metadata entry (``{"name": ..., "configuration": ...}`` or a name)."""
    if isinstance(entry, Codec):
        return entry
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, Mapping):
        raise MetadataError(field, entry, "expected a codec object or name")
    for key in entry:
        if key not in ("name", "configuration", "must_understand"):
            raise MetadataError(f"{field}.{key}", entry[key], "unknown codec member")
    name = entry.get("name")
    if not isinstance(name, str):
        raise MetadataError(f"{field}.name", name, "expected a codec name")
    if name.startswith(PREFIX):
        return numcodecs_codec(name, entry.get("configuration"), field, 0)
    cls = CODECS.get(_ALIASES.get(name, name))
    if cls is None:
        raise UnsupportedError(f"codec {name!r} ({field})", f"is not supported (known: {sorted(CODECS)}, numcodecs.*)")
    return cls.from_config(entry.get("configuration"), f"{field}.configuration")


def parse_codecs(value: Any, field: str = "codecs") -> list[Codec]:
    """Parse a v3 ``codecs`` list."""
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise MetadataError(field, value, "expected a list of codecs")
    return [codec_from_dict(e, f"{field}[{i}]") for i, e in enumerate(value)]


def compressor_from_v2(config: Any, itemsize: int, field: str = "compressor") -> BytesBytesCodec | None:
    """Build the bytes -> bytes codec for a v2 ``compressor`` object (``None`` for null)."""
    if config is None:
        return None
    if isinstance(config, BytesBytesCodec):
        return config
    if not isinstance(config, Mapping):
        raise MetadataError(field, config, "expected a compressor object or null")
    cid = config.get("id")
    cfg = dict(config)
    if cid == "zstd":
        return ZstdCodec.from_v2(cfg, field)
    if cid == "blosc":
        return BloscCodec.from_v2(cfg, field, itemsize)
    if cid == "zlib":
        return ZlibCodec.from_v2(cfg, field)
    if cid == "gzip":
        return GzipCodec.from_v2(cfg, field)
    if cid == "bz2":
        return Bz2Codec.from_v2(cfg, field)
    if cid == "lz4":
        return Lz4Codec.from_v2(cfg, field)
    if cid == "lzma":
        return LzmaCodec.from_v2(cfg, field)
    if cid == "shuffle":
        return ShuffleCodec.from_v2(cfg, field)
    if cid in CHECKSUMS:
        return Checksum32Codec.from_v2(cfg, field)
    if not isinstance(cid, str):
        raise MetadataError(f"{field}.id", cid, "expected a codec id string")
    raise UnsupportedError(f"compressor {cid!r} ({field})", f"is not supported (known: {_V2_COMPRESSORS})")


def filters_from_v2(value: Any, field: str = "filters") -> list[Filter]:
    """Parse a v2 ``filters`` member (``null`` or a list of numcodecs configurations)."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 16:
        raise MetadataError(field, value, "expected null or a list of at most 16 filters")
    out: list[Filter] = []
    for i, entry in enumerate(value):
        f = f"{field}[{i}]"
        if not isinstance(entry, Mapping):
            raise MetadataError(f, entry, "expected a filter object with an id")
        cid = entry.get("id")
        if not isinstance(cid, str):
            raise MetadataError(f"{f}.id", cid, "expected a filter id string")
        if cid in UNSUPPORTED_OBJECT_CODECS:
            raise UnsupportedError(f"object codec {cid!r} ({f})", UNSUPPORTED_OBJECT_CODECS[cid])
        cls = FILTERS.get(cid)
        if cls is None:
            raise UnsupportedError(f"filter {cid!r} ({f})", f"is not supported (known: {sorted(FILTERS)})")
        out.append(cls.from_config(entry, f))
    return out


def compressor_to_v2(codec: BytesBytesCodec | None) -> dict[str, Any] | None:
    """The v2 ``compressor`` object for a codec (``None`` for no compression)."""
    if codec is None:
        return None
    to_v2 = getattr(codec, "to_v2", None)
    if to_v2 is None:
        raise MetadataError("compressor", codec.name, "has no zarr v2 form")
    result: dict[str, Any] = to_v2()
    return result


use_codec_parser(parse_codecs)
use_compressor_parser(compressor_from_v2)
