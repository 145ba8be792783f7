"""numcodecs ``lzma`` compressor (v2 ``{"id": "lzma"}``, v3 ``numcodecs.lzma``), decoded with bounds.

Output is limited the way the other compressors are (``max_length`` = bound + 1); the
decoder's memory is limited to :data:`LZMA_MEMLIMIT` (xz/alone formats) or by rejecting raw
filter chains whose dictionary is larger.
"""

from __future__ import annotations

import lzma as _lzma
from typing import Any

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import Buffer, BytesBytesCodec, check_config
from zarr3.errors import MetadataError

__all__ = ["LzmaCodec", "LZMA_MEMLIMIT"]

#: Most memory the xz decoder may use (xz's preset 9 needs ~65 MiB).
LZMA_MEMLIMIT = 1 << 28
_FORMATS = (_lzma.FORMAT_XZ, _lzma.FORMAT_ALONE, _lzma.FORMAT_RAW)


def _int_or_none(value: Any, field: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise MetadataError(field, value, "expected an integer or null")
    return value


def _filters(value: Any, field: str) -> list[dict[str, int]] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= 4:
        raise MetadataError(field, value, "expected a list of 1 to 4 filter objects")
    out = []
    for i, f in enumerate(value):
        if not isinstance(f, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in f.values()):
            raise MetadataError(f"{field}[{i}]", f, "expected an object of integers with an id")
        if "id" not in f or f.get("dict_size", 0) > LZMA_MEMLIMIT:
            raise MetadataError(f"{field}[{i}]", f, f"needs an id and a dict_size of at most {LZMA_MEMLIMIT}")
        out.append(dict(f))
    return out


class LzmaCodec(BytesBytesCodec):
    """LZMA/xz compression with numcodecs' settings (``format``, ``check``, ``preset``, ``filters``)."""

    name = "lzma"

    def __init__(self, format: int = 1, check: int = -1, preset: int | None = None, filters: Any = None):  # noqa: A002
        if format not in _FORMATS:
            raise MetadataError("format", format, f"expected one of {list(_FORMATS)}")
        if format == _lzma.FORMAT_RAW and filters is None:
            raise MetadataError("filters", None, "the raw lzma format needs filters")
        self.format = format
        self.check = check
        self.preset = preset
        self.filters = filters

    @classmethod
    def from_config(cls, config: Any, field: str) -> LzmaCodec:
        cfg = check_config(config, ("id", "format", "check", "preset", "filters"), field)
        fmt = cfg.get("format", 1)
        if fmt not in _FORMATS or isinstance(fmt, bool):
            raise MetadataError(f"{field}.format", fmt, f"expected one of {list(_FORMATS)}")
        return cls(
            fmt,
            _int_or_none(cfg.get("check", -1), f"{field}.check") or -1,
            _int_or_none(cfg.get("preset"), f"{field}.preset"),
            _filters(cfg.get("filters"), f"{field}.filters"),
        )

    @classmethod
    def from_v2(cls, config: dict[str, Any], field: str) -> LzmaCodec:
        """Build from a v2 ``{"id": "lzma", ...}`` compressor."""
        return cls.from_config(config, field)

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object, as numcodecs writes it."""
        return {"id": "lzma", **self.configuration()}

    def configuration(self) -> dict[str, Any]:
        return {"check": self.check, "filters": self.filters, "format": self.format, "preset": self.preset}

    def encode(self, data: Buffer) -> Buffer:
        check = self.check if self.format == _lzma.FORMAT_XZ else -1
        return _lzma.compress(bytes(data), format=self.format, check=check, preset=self.preset, filters=self.filters)

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        limit = bound if size is None else size
        try:
            if self.format == _lzma.FORMAT_RAW:
                d = _lzma.LZMADecompressor(format=self.format, filters=self.filters)
            else:
                d = _lzma.LZMADecompressor(format=self.format, memlimit=LZMA_MEMLIMIT)
            out = d.decompress(bytes(data), max_length=limit + 1)
        except _lzma.LZMAError as e:
            raise CorruptionError(f"lzma decompression failed: {e}") from e
        if len(out) > limit:
            raise CorruptionError(f"lzma data decompresses to more than {limit} bytes")
        if self.format != _lzma.FORMAT_RAW and not d.eof:
            raise CorruptionError("lzma stream is truncated")
        if size is not None and len(out) != size:
            raise CorruptionError(f"lzma data decompressed to {len(out)} bytes, expected {size}")
        return out

    def max_encoded_size(self, decoded_size: int) -> int:
        return decoded_size + decoded_size // 64 + 1024
