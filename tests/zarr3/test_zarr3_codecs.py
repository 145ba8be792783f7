"""Codecs: round trips, TensorStore byte layouts, bounded decoding and corruption detection."""

from __future__ import annotations

import bz2
import gzip
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest
import zstandard

from ocdbt_py.errors import CorruptionError
from zarr3.codecs import (
    BloscCodec,
    BytesCodec,
    Bz2Codec,
    CodecChain,
    Crc32cCodec,
    GzipCodec,
    Lz4Codec,
    ShardingCodec,
    TransposeCodec,
    ZlibCodec,
    ZstdCodec,
    compressor_from_v2,
    parse_codecs,
)
from zarr3.codecs.base import ChunkSpec
from zarr3.codecs.chain import equals_fill
from zarr3.dtypes import DATA_TYPES
from zarr3.errors import CodecUnavailableError, MetadataError, UnsupportedError


def spec(shape: tuple[int, ...], name: str = "float32", fill: object = 0) -> ChunkSpec:
    dt = DATA_TYPES[name]
    return ChunkSpec(shape, dt, np.array(fill).astype(dt.dtype))


BB_CODECS = [
    ZstdCodec(),
    ZstdCodec(level=1, checksum=True),
    GzipCodec(),
    GzipCodec(level=0),
    Crc32cCodec(),
    ZlibCodec(),
    Bz2Codec(),
    Lz4Codec(),
    BloscCodec(),
    BloscCodec(cname="zstd", clevel=9, shuffle="bitshuffle"),
    BloscCodec(cname="zlib", clevel=1, shuffle="noshuffle", blocksize=256),
]


@pytest.mark.parametrize("codec", BB_CODECS, ids=lambda c: repr(c))
def test_bytes_codecs_round_trip(codec) -> None:
    arr = np.random.default_rng(0).standard_normal((33, 7)).astype(np.float32)
    chain = CodecChain([BytesCodec(), codec], spec((33, 7)))
    enc = chain.encode(arr)
    assert enc is not None
    np.testing.assert_array_equal(chain.decode(enc), arr)
    out = np.empty_like(arr)
    chain.decode_into(enc, out)
    np.testing.assert_array_equal(out, arr)
    scratch = memoryview(bytearray(arr.nbytes))
    np.testing.assert_array_equal(chain.decode(enc, scratch), arr)


@pytest.mark.parametrize("codec", BB_CODECS, ids=lambda c: repr(c))
def test_bytes_codecs_reject_wrong_sizes(codec) -> None:
    """A chunk that decodes to the wrong size is corrupt, never reshaped."""
    small = np.arange(10, dtype=np.float32)
    enc = CodecChain([BytesCodec(), codec], spec((10,))).encode(small)
    big_chain = CodecChain([BytesCodec(), codec], spec((11,)))
    with pytest.raises(CorruptionError):
        big_chain.decode(enc)
    with pytest.raises(CorruptionError):
        big_chain.decode_into(enc, np.empty(11, np.float32))
    small_chain = CodecChain([BytesCodec(), codec], spec((9,)))
    with pytest.raises(CorruptionError):
        small_chain.decode(enc)


def test_crc32c_layout_and_mismatch() -> None:
    c = Crc32cCodec()
    enc = c.encode(b"hello")
    # CRC-32C("hello") = 0x9a71bb4c, appended little endian
    assert enc == b"hello" + struct.pack("<I", 0x9A71BB4C)
    assert bytes(c.decode(enc, 5, 5)) == b"hello"
    bad = bytearray(enc)
    bad[0] ^= 1
    with pytest.raises(CorruptionError, match="crc32c"):
        c.decode(bytes(bad), 5, 5)
    with pytest.raises(CorruptionError):
        c.decode(b"abc", None, 100)


def test_zstd_bomb_without_content_size_is_bounded() -> None:
    """A frame without a declared size decodes with a bounded stream, not a huge buffer."""
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    bomb = cctx.compress(bytes(64 << 20))  # 64 MiB of zeros in a few KiB
    assert zstandard.frame_content_size(bomb) == -1
    codec = ZstdCodec()
    with pytest.raises(CorruptionError, match="more than"):
        codec.decode(bomb, 1000, 1000)
    with pytest.raises(CorruptionError, match="more than"):
        codec.decode(bomb, None, 4096)
    with pytest.raises(CorruptionError):
        codec.decode_into(bomb, memoryview(bytearray(1000)))


def test_zstd_declared_size_checked_before_decoding() -> None:
    frame = zstandard.ZstdCompressor().compress(bytes(1 << 20))
    with pytest.raises(CorruptionError, match="declares"):
        ZstdCodec().decode(frame, 100, 100)


def test_zstd_without_content_size_and_multiple_frames_decode() -> None:
    a = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 1000)
    assert bytes(ZstdCodec().decode(a, 1000, 1000)) == b"x" * 1000
    two = zstandard.ZstdCompressor().compress(b"a" * 10) + zstandard.ZstdCompressor().compress(b"b" * 5)
    assert bytes(ZstdCodec().decode(two, 15, 15)) == b"a" * 10 + b"b" * 5
    with pytest.raises(CorruptionError):
        ZstdCodec().decode(b"\x28\xb5\x2f\xfd garbage", 10, 10)
    with pytest.raises(CorruptionError):
        ZstdCodec().decode(a + b"trailing", 1000, 1000)


def test_gzip_zlib_bz2_bombs_bounded() -> None:
    zeros = bytes(32 << 20)
    for codec, blob in [
        (GzipCodec(), gzip.compress(zeros)),
        (ZlibCodec(), zlib.compress(zeros)),
        (Bz2Codec(), bz2.compress(zeros)),
    ]:
        with pytest.raises(CorruptionError):
            codec.decode(blob, 1000, 1000)
        with pytest.raises(CorruptionError):
            codec.decode(blob, None, 5000)


def test_deflate_truncated_and_trailing() -> None:
    blob = gzip.compress(b"abc" * 100)
    with pytest.raises(CorruptionError, match="truncated"):
        GzipCodec().decode(blob[:-10], 300, 300)
    with pytest.raises(CorruptionError, match="trailing"):
        GzipCodec().decode(blob + b"xx", 300, 300)
    # zlib-wrapped data is accepted by the gzip codec (automatic header detection)
    assert GzipCodec().decode(zlib.compress(b"abc" * 100), 300, 300) == b"abc" * 100


def test_gzip_output_is_gzip_with_zero_mtime() -> None:
    enc = GzipCodec(level=6).encode(b"data" * 10)
    assert enc[:2] == b"\x1f\x8b" and enc[4:8] == b"\0\0\0\0"
    assert gzip.decompress(enc) == b"data" * 10


def test_blosc_and_lz4_headers_checked() -> None:
    pytest.importorskip("blosc")
    enc = bytes(BloscCodec().resolve(spec((1000,)), "c").encode(bytes(4000)))
    with pytest.raises(CorruptionError, match="declares"):
        BloscCodec().decode(enc, 3999, 3999)
    with pytest.raises(CorruptionError):
        BloscCodec().decode(enc[:-1], 4000, 4000)
    with pytest.raises(CorruptionError):
        BloscCodec().decode(b"short", 4000, 4000)
    pytest.importorskip("lz4")
    enc = bytes(Lz4Codec().encode(bytes(4000)))
    assert struct.unpack("<i", enc[:4])[0] == 4000
    with pytest.raises(CorruptionError):
        Lz4Codec().decode(enc, 100, 100)
    lie = struct.pack("<i", 10) + enc[4:]
    with pytest.raises(CorruptionError):
        Lz4Codec().decode(lie, 10, 10)


def test_blosc_missing_extra_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import zarr3.codecs.blosc as bmod

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "blosc":
            raise ImportError("no blosc")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(bmod, "_blosc_mod", None)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(CodecUnavailableError, match=r"ocdbt-py\[blosc\]"):
        BloscCodec().encode(b"x" * 10)


def test_bytes_codec_endianness() -> None:
    arr = np.array([1, 2], dtype=np.int32)
    big = CodecChain([BytesCodec("big")], spec((2,), "int32"))
    assert bytes(big.encode(arr)) == bytes.fromhex("0000000100000002")
    np.testing.assert_array_equal(big.decode(bytes.fromhex("0000000100000002")), arr)
    c = np.array([1 + 2j], dtype=np.complex64)
    bigc = CodecChain([BytesCodec("big")], spec((1,), "complex64"))
    assert bytes(bigc.encode(c)) == struct.pack(">ff", 1.0, 2.0)
    np.testing.assert_array_equal(bigc.decode(struct.pack(">ff", 1.0, 2.0)), c)
    bf = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    bigb = CodecChain([BytesCodec("big")], spec((2,), "bfloat16"))
    assert bigb.decode(bigb.encode(bf)).tobytes() == bf.tobytes()
    # 1-byte types drop the endian configuration
    u8 = CodecChain([BytesCodec("big")], spec((2,), "uint8"))
    assert u8.to_json() == [{"name": "bytes"}]


def test_transpose_codec() -> None:
    arr = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    chain = CodecChain([TransposeCodec([2, 0, 1]), BytesCodec()], spec((2, 3, 4), "int16"))
    enc = bytes(chain.encode(arr))
    assert enc == arr.transpose(2, 0, 1).tobytes()
    np.testing.assert_array_equal(chain.decode(enc), arr)
    f = CodecChain(
        parse_codecs([{"name": "transpose", "configuration": {"order": "F"}}, "bytes"]), spec((2, 3, 4), "int16")
    )
    assert f.to_json()[0] == {"configuration": {"order": [2, 1, 0]}, "name": "transpose"}
    assert bytes(f.encode(arr)) == arr.T.tobytes()


def test_codec_chain_validation() -> None:
    with pytest.raises(MetadataError):
        CodecChain([ZstdCodec()], spec((2,)))
    with pytest.raises(MetadataError):
        CodecChain([BytesCodec(), BytesCodec()], spec((2,)))
    with pytest.raises(MetadataError):
        CodecChain([BytesCodec(), TransposeCodec([0])], spec((2,)))


def test_v2_compressor_mapping() -> None:
    assert compressor_from_v2(None, 4) is None
    c = compressor_from_v2({"id": "blosc", "shuffle": -1}, 1)
    assert isinstance(c, BloscCodec) and c.shuffle == "bitshuffle"
    c = compressor_from_v2({"id": "blosc", "shuffle": -1}, 4)
    assert isinstance(c, BloscCodec) and c.shuffle == "shuffle"
    with pytest.raises(UnsupportedError) as ei:
        compressor_from_v2({"id": "zfpy"}, 4)
    assert "zfpy" in str(ei.value)


def test_v2_only_compressors_are_not_v3_codecs() -> None:
    with pytest.raises(UnsupportedError):
        parse_codecs(["bytes", "zlib"])
    assert parse_codecs(["bytes", "numcodecs.zlib"])[1].name == "numcodecs.zlib"


# -- sharding -----------------------------------------------------------------------------
def test_sharding_layout_matches_tensorstore_probe() -> None:
    """index_location start, 4x4 u8 with 2x2 inner chunks, two empty entries (orbax-layout §3)."""
    s = spec((4, 4), "uint8")
    codec = ShardingCodec((2, 2), index_location="start").resolve(s, "codecs[0]")
    arr = np.zeros((4, 4), np.uint8)
    arr[0:2, 2:4] = [[1, 2], [3, 4]]
    arr[2:4, 0:2] = [[5, 6], [7, 8]]
    enc = codec.encode(arr, s)
    assert enc is not None
    enc = bytes(enc)
    assert len(enc) == 64 + 4 + 8
    entries = np.frombuffer(enc[:64], "<u8").reshape(4, 2)
    missing = 2**64 - 1
    assert entries.tolist() == [[missing, missing], [68, 4], [72, 4], [missing, missing]]
    assert enc[68:72] == bytes([1, 2, 3, 4]) and enc[72:76] == bytes([5, 6, 7, 8])
    np.testing.assert_array_equal(codec.decode(enc, s), arr)


def test_sharding_all_fill_encodes_to_nothing() -> None:
    s = spec((4, 4), "uint8")
    codec = ShardingCodec((2, 2)).resolve(s, "c")
    assert codec.encode(np.zeros((4, 4), np.uint8), s) is None
    kept = codec.encode_shard(np.zeros((4, 4), np.uint8), s, write_empty_chunks=True)
    assert kept is not None and len(kept) == 4 * 4 + 64 + 4


def test_sharding_index_past_end_is_corruption() -> None:
    s = spec((4, 4), "uint8")
    codec = ShardingCodec((2, 2)).resolve(s, "c")
    enc = bytearray(codec.encode(np.arange(16, dtype=np.uint8).reshape(4, 4), s) or b"")
    index = np.frombuffer(bytes(enc[-68:-4]), "<u8").copy().reshape(4, 2)
    index[3, 0] = 1000
    enc[-68:-4] = index.tobytes()
    enc[-4:] = struct.pack("<I", __import__("crc32c").crc32c(bytes(enc[-68:-4])))
    with pytest.raises(CorruptionError, match="past the end"):
        codec.decode(bytes(enc), s)
    # overflowing offset + length
    index[3] = [2**63, 2**63]
    enc[-68:-4] = index.tobytes()
    enc[-4:] = struct.pack("<I", __import__("crc32c").crc32c(bytes(enc[-68:-4])))
    with pytest.raises(CorruptionError, match="overflow"):
        codec.decode(bytes(enc), s)
    with pytest.raises(CorruptionError):
        codec.decode(b"short", s)


def test_sharding_index_crc_checked() -> None:
    s = spec((4, 4), "uint8")
    codec = ShardingCodec((2, 2)).resolve(s, "c")
    enc = bytearray(codec.encode(np.arange(16, dtype=np.uint8).reshape(4, 4), s) or b"")
    enc[-10] ^= 0xFF
    with pytest.raises(CorruptionError, match="crc32c"):
        codec.decode(bytes(enc), s)


def test_nested_sharding_round_trip() -> None:
    s = spec((8, 8), "int32", fill=-1)
    inner = ShardingCodec((1, 2), codecs=[BytesCodec(), ZstdCodec()])
    outer = ShardingCodec((4, 4), codecs=[inner]).resolve(s, "c")
    arr = np.arange(64, dtype=np.int32).reshape(8, 8)
    arr[4:, 4:] = -1
    enc = outer.encode(arr, s)
    assert enc is not None
    np.testing.assert_array_equal(outer.decode(enc, s), arr)
    # the all-fill quarter is not stored
    entries, _ = outer.split_shard(enc)
    assert entries[3].tolist() == [2**64 - 1, 2**64 - 1]


def test_equals_fill_is_bitwise() -> None:
    assert equals_fill(np.zeros(4, np.float32), None)
    assert not equals_fill(np.array([0.0, -0.0], np.float32), np.array(0.0, np.float32))
    nan = np.array(np.nan, np.float32)
    assert equals_fill(np.full(3, np.nan, np.float32), nan)
    other_nan = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert not equals_fill(other_nan, nan)
    assert equals_fill(np.full((2, 2), 1 + 2j, np.complex128), np.array(1 + 2j))
    assert not equals_fill(np.array([1 + 2j, 1 + 3j]), np.array(1 + 2j))
    strided = np.zeros((4, 4), np.float32)[:, ::2]
    assert equals_fill(strided, np.array(0.0, np.float32))


@pytest.mark.parametrize(
    "cls, entry",
    [
        (ZstdCodec, {"name": "zstd", "configuration": {"checksum": True, "level": 5}}),
        (GzipCodec, {"name": "gzip", "configuration": {"level": 2}}),
        (BytesCodec, {"name": "bytes", "configuration": {"endian": "big"}}),
        (TransposeCodec, {"name": "transpose", "configuration": {"order": [1, 0]}}),
        (Crc32cCodec, {"name": "crc32c"}),
        (
            BloscCodec,
            {
                "name": "blosc",
                "configuration": {"blocksize": 0, "clevel": 1, "cname": "zstd", "shuffle": "noshuffle", "typesize": 2},
            },
        ),
        (
            ShardingCodec,
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [2],
                    "codecs": [{"configuration": {"endian": "little"}, "name": "bytes"}],
                    "index_codecs": [{"configuration": {"endian": "little"}, "name": "bytes"}, {"name": "crc32c"}],
                    "index_location": "start",
                },
            },
        ),
    ],
)
def test_from_dict_to_dict_round_trip(cls, entry) -> None:  # type: ignore[no-untyped-def]
    codec = cls.from_dict(entry)
    assert codec.to_dict() == entry
    with pytest.raises(MetadataError):
        cls.from_dict({"name": "something_else"})


@pytest.mark.parametrize("name", ["float32", "float64", "bfloat16", "uint8"])
def test_zstd_large_chunks_record_content_size(name: str) -> None:
    """Both compression paths (streaming for 4/8-byte data, one-shot otherwise) write the
    content size, so any reader can decode with a single exact allocation."""
    s = spec((256, 512), name)
    chain = CodecChain([BytesCodec(), ZstdCodec(level=1, checksum=True)], s)
    arr = (np.random.default_rng(0).standard_normal((256, 512)) * 10).astype(s.dtype.dtype)
    enc = chain.encode(arr)
    assert enc is not None
    assert zstandard.frame_content_size(enc) == arr.nbytes
    assert zstandard.get_frame_parameters(enc).has_checksum
    np.testing.assert_array_equal(chain.decode(enc), arr)
    again = chain.encode(arr[::-1].copy())  # the reused buffer does not leak between calls
    assert again is not None
    np.testing.assert_array_equal(chain.decode(again), arr[::-1])
    np.testing.assert_array_equal(chain.decode(enc), arr)
