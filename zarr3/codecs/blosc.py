"""The ``blosc`` bytes -> bytes codec (also the v2 ``blosc`` compressor).

Blosc is an optional extra (``pip install 'ocdbt-py[blosc]'``, which installs the ``blosc``
package).  Metadata naming blosc parses without it; encoding or decoding raises
:class:`~zarr3.errors.CodecUnavailableError`.  The blosc frame header states the decoded and
compressed sizes; both are checked before decompressing.  Two kinds of frame need no blosc
library: frames stored raw (the MEMCPYED flag: blosc found the data incompressible), copied out
whatever compressor they name; and snappy frames (which no Python blosc binding decodes),
decoded block by block by :mod:`zarr3.codecs.blosc_frames` with cramjam's snappy (the
``[snappy]`` extra; without it a :class:`~zarr3.errors.CodecUnavailableError` says
``pip install 'ocdbt-py[snappy]'``).
"""

from __future__ import annotations

import struct
import threading
from typing import Any

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import Buffer, BytesBytesCodec, ChunkSpec, check_config, clamp, encoder_int
from zarr3.codecs.blosc_frames import decode_frame, snappy_decoder
from zarr3.errors import CodecUnavailableError, MetadataError

__all__ = ["BloscCodec"]

_CNAMES = ("blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd")
_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")
_HEADER = 16
_MAX_OVERHEAD = 16
#: No blosc frame decodes to more than this many times its compressed size: the bound of its
#: most expansive inner compressor (zstd, see :data:`zarr3.codecs.zstd.MAX_RATIO`).
MAX_RATIO = 32768
_lock = threading.Lock()
_blosc_mod: Any = None


def _blosc() -> Any:
    global _blosc_mod
    if _blosc_mod is None:
        try:
            # optional codec: the [blosc] extra
            import blosc
        except ImportError as e:
            raise CodecUnavailableError("blosc", "blosc", extra="blosc") from e
        try:
            blosc.set_releasegil(True)
        except Exception:  # pragma: no cover - very old python-blosc
            pass
        _blosc_mod = blosc
    return _blosc_mod


#: flags bit 1 of a blosc header: the frame holds the input as is after the 16-byte header
_MEMCPYED = 0x02
# flags bits 5-7 of a blosc header: the compressor library of the frame
_FORMATS = {0: "blosclz", 1: "lz4", 2: "snappy", 3: "zlib", 4: "zstd"}
_SNAPPY = 2


def _check_compressor(blosc: Any, data: Buffer) -> None:
    """Raise :class:`CodecUnavailableError` when the frame's compressor is not built in."""
    flags = memoryview(data)[2]
    lib = _FORMATS.get((flags >> 5) & 7)
    if lib is None:
        raise CorruptionError(f"blosc frame names unknown compressor format {(flags >> 5) & 7}")
    try:
        available = set(blosc.compressor_list())
    except Exception:  # pragma: no cover - very old python-blosc
        return
    if lib == "lz4":
        available.discard("lz4hc")
        ok = "lz4" in available or "lz4hc" in set(blosc.compressor_list())
    else:
        ok = lib in available
    if not ok:
        raise CodecUnavailableError(
            f"blosc/{lib}", "blosc", reason=f"is not built into the installed blosc library ({sorted(available)})"
        )


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise MetadataError(field, value, f"expected an integer in [{lo}, {hi}]")
    return value


class BloscCodec(BytesBytesCodec):
    """Blosc meta-compression.

    ``shuffle`` is ``"noshuffle"``, ``"shuffle"`` or ``"bitshuffle"``; ``typesize`` defaults to
    the element size.  ``v2_shuffle`` keeps the integer a v2 ``.zarray`` used (``-1`` means
    "bit-shuffle for 1-byte types, else byte-shuffle").
    """

    name = "blosc"

    def __init__(
        self,
        cname: str = "lz4",
        clevel: int = 5,
        shuffle: str | None = None,
        typesize: int | None = None,
        blocksize: int = 0,
        *,
        v2_shuffle: int | None = None,
    ):
        if cname not in _CNAMES:
            raise MetadataError("cname", cname, f"expected one of {list(_CNAMES)}")
        if shuffle is not None and shuffle not in _SHUFFLES:
            raise MetadataError("shuffle", shuffle, f"expected one of {list(_SHUFFLES)}")
        self.cname = cname
        self.clevel = encoder_int(clevel, "clevel")
        self.shuffle = shuffle
        self.typesize = typesize
        self.blocksize = _int(blocksize, "blocksize", 0, 1 << 31)
        self.v2_shuffle = v2_shuffle

    @classmethod
    def from_config(cls, config: Any, field: str) -> BloscCodec:
        cfg = check_config(config, ("cname", "clevel", "shuffle", "typesize", "blocksize"), field)
        cname = cfg.get("cname", "lz4")
        if cname not in _CNAMES:
            raise MetadataError(f"{field}.cname", cname, f"expected one of {list(_CNAMES)}")
        shuffle = cfg.get("shuffle")
        if shuffle is not None and shuffle not in _SHUFFLES:
            raise MetadataError(f"{field}.shuffle", shuffle, f"expected one of {list(_SHUFFLES)}")
        typesize = cfg.get("typesize")
        if typesize is not None:
            typesize = _int(typesize, f"{field}.typesize", 1, 255)
        return cls(
            cname,
            encoder_int(cfg.get("clevel", 5), f"{field}.clevel"),
            shuffle,
            typesize,
            _int(cfg.get("blocksize", 0), f"{field}.blocksize", 0, 1 << 31),
        )

    @classmethod
    def from_v2(cls, config: dict[str, Any], field: str, itemsize: int) -> BloscCodec:
        """Build from a v2 ``{"id": "blosc", ...}`` compressor (numcodecs conventions)."""
        cfg = check_config(config, ("id", "cname", "clevel", "shuffle", "blocksize", "typesize"), field)
        cname = cfg.get("cname", "lz4")
        if cname not in _CNAMES:
            raise MetadataError(f"{field}.cname", cname, f"expected one of {list(_CNAMES)}")
        v2_shuffle = _int(cfg.get("shuffle", 1), f"{field}.shuffle", -1, 2)
        if v2_shuffle == -1:
            shuffle = "bitshuffle" if itemsize == 1 else "shuffle"
        else:
            shuffle = _SHUFFLES[v2_shuffle]
        return cls(
            cname,
            encoder_int(cfg.get("clevel", 5), f"{field}.clevel"),
            shuffle,
            itemsize,
            _int(cfg.get("blocksize", 0), f"{field}.blocksize", 0, 1 << 31),
            v2_shuffle=v2_shuffle,
        )

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object (key set as TensorStore writes it)."""
        shuffle = self.v2_shuffle
        if shuffle is None:
            shuffle = _SHUFFLES.index(self.shuffle or "shuffle")
        return {
            "blocksize": self.blocksize,
            "clevel": self.clevel,
            "cname": self.cname,
            "id": "blosc",
            "shuffle": shuffle,
        }

    def resolve(self, spec: ChunkSpec, field: str) -> BloscCodec:
        itemsize = spec.dtype.itemsize
        typesize = self.typesize or min(itemsize, 255)
        shuffle = self.shuffle or ("bitshuffle" if itemsize == 1 else "shuffle")
        return BloscCodec(self.cname, self.clevel, shuffle, typesize, self.blocksize, v2_shuffle=self.v2_shuffle)

    def configuration(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "blocksize": self.blocksize,
            "clevel": self.clevel,
            "cname": self.cname,
            "shuffle": self.shuffle or "shuffle",
        }
        if self.typesize is not None:
            out["typesize"] = self.typesize
        return out

    def encode(self, data: Buffer) -> Buffer:
        blosc = _blosc()
        shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[self.shuffle or "shuffle"]
        if self.blocksize:
            with _lock:  # python-blosc only has a process-wide block size
                old = blosc.get_blocksize()
                blosc.set_blocksize(self.blocksize)
                try:
                    level = clamp(self.clevel, 0, 9)
                    return bytes(blosc.compress(data, self.typesize or 1, level, shuffle, self.cname))
                finally:
                    blosc.set_blocksize(old)
        return bytes(blosc.compress(data, self.typesize or 1, clamp(self.clevel, 0, 9), shuffle, self.cname))

    def check_decodable(self, data: Buffer, size: int | None) -> None:
        n = memoryview(data).nbytes
        if n < _HEADER:
            raise CorruptionError(f"blosc frame of {n} bytes is shorter than its header")
        nbytes, _blocksize, cbytes = struct.unpack_from("<III", data, 4)
        if size is not None and nbytes != size:
            raise CorruptionError(f"blosc frame declares {nbytes} bytes, expected {size}")
        if cbytes > n or cbytes < _HEADER:
            raise CorruptionError(f"blosc frame declares {cbytes} compressed bytes, has {n}")
        if nbytes > MAX_RATIO * cbytes:
            raise CorruptionError(f"{cbytes} bytes of blosc data cannot decompress to the {nbytes} bytes declared")

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        if len(data) < _HEADER:
            raise CorruptionError(f"blosc frame of {len(data)} bytes is shorter than its header")
        nbytes, _blocksize, cbytes = struct.unpack_from("<III", data, 4)
        if size is not None and nbytes != size:
            raise CorruptionError(f"blosc frame declares {nbytes} bytes, expected {size}")
        if nbytes > bound:
            raise CorruptionError(f"blosc frame declares {nbytes} bytes, more than {bound}")
        if cbytes > len(data) or cbytes < _HEADER:
            raise CorruptionError(f"blosc frame declares {cbytes} compressed bytes, has {len(data)}")
        if cbytes < len(data):
            # bytes after the frame (z5py pads chunks); the blosc library ignores them too
            data = memoryview(data)[:cbytes]
        if memoryview(data)[2] & _MEMCPYED:
            # stored raw (blosc found it incompressible): no compressor, whatever the frame names
            if cbytes != _HEADER + nbytes:
                raise CorruptionError(f"raw blosc frame of {cbytes} bytes cannot hold the {nbytes} bytes declared")
            return bytes(memoryview(data)[_HEADER:cbytes])
        if (memoryview(data)[2] >> 5) & 7 == _SNAPPY:
            # no Python blosc binding builds snappy in: the frame's blocks are decoded here
            return decode_frame(data, bound, snappy_decoder())
        blosc = _blosc()
        _check_compressor(blosc, data)
        try:
            out = blosc.decompress(data)
        except Exception as e:
            raise CorruptionError(f"blosc decompression failed: {e}") from e
        if len(out) != nbytes:
            raise CorruptionError(f"blosc data decompressed to {len(out)} bytes, expected {nbytes}")
        return bytes(out)

    def max_encoded_size(self, decoded_size: int) -> int:
        return decoded_size + _MAX_OVERHEAD
