"""The batched small-chunk encoder writes exactly what the one-by-one encoder writes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import zstandard

from ocdbt_py.checkpoint.saving.arrays import (
    ArraySpec,
    Compressors,
    chunk_regions,
    encode_small,
    encode_small_batch,
)


def _spec(name: str, shape: tuple[int, ...], dtype: str = "float32", **kw: object) -> ArraySpec:
    return ArraySpec(name, shape, np.dtype(dtype), shape, shape, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", [{}, {"zarr_format": 3}, {"zarr_format": 3, "checksum": True}, {"checksum": True},
                                {"compression": False}, {"level": 5}])
def test_batch_equals_one_by_one(kw: dict[str, object]) -> None:
    rng = np.random.default_rng(1)
    items = [(_spec(f"p{i}", (n,), **kw), rng.standard_normal(n).astype(np.float32)) for i, n in
             enumerate([1, 7, 4096, 100, 16384, 3])]
    items.append((_spec("z", (5, 3), "int64", **kw), np.zeros((5, 3), np.int64)))  # highly compressible
    c = Compressors()
    assert encode_small_batch(items, c) == [encode_small(s, v, c) for s, v in items]


def test_mixed_settings_in_one_batch() -> None:
    a = np.arange(1000, dtype=np.float32)
    items = [(_spec("a", (1000,)), a), (_spec("b", (1000,), zarr_format=3), a), (_spec("c", (1000,), level=9), a)]
    c = Compressors()
    assert encode_small_batch(items, c) == [encode_small(s, v, c) for s, v in items]


def test_batch_frames_decode_to_the_chunks() -> None:
    rng = np.random.default_rng(2)
    arrs = [rng.standard_normal(4096).astype(np.float32) for _ in range(50)]
    out = encode_small_batch([(_spec(f"p{i}", (4096,)), a) for i, a in enumerate(arrs)], Compressors())
    d = zstandard.ZstdDecompressor()
    for a, v in zip(arrs, out):
        assert zstandard.get_frame_parameters(v).content_size == a.nbytes
        assert d.decompress(v) == a.tobytes()


@pytest.mark.parametrize("shape,chunk,origin", [((10, 4), (10, 4), (0, 0)), ((10, 4), (4, 4), (0, 0)),
                                                ((3, 2), (4, 4), (4, 8)), ((), (), ()), ((0, 3), (4, 4), (0, 0))])
def test_chunk_regions_one_chunk_fast_path(shape: tuple[int, ...], chunk: tuple[int, ...],
                                           origin: tuple[int, ...]) -> None:
    spec = ArraySpec("x", (64, 64)[:len(shape)], np.dtype("float32"), chunk, chunk)
    got = list(chunk_regions(spec, origin, shape))
    expect = []  # the general rule, written out

    axes = [[((o + s) // c, slice(s, min(s + c, n))) for s in range(0, n, c)] for o, n, c in zip(origin, shape, chunk)]
    for combo in itertools.product(*axes):
        expect.append((tuple(c for c, _ in combo), tuple(s for _, s in combo)))
    assert got == expect
