"""Property tests: random shapes, chunkings, shardings, codecs and selections against NumPy."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zarr3
from ocdbt_py.kvstore import MemoryStore

DTYPES = ["uint8", "int16", "float32", "float64", "bfloat16", "float8_e4m3fn", "complex64", "bool", "int4"]
CODECS = [None, "zstd", "gzip", "crc32c"]


@st.composite
def arrays(draw: Any) -> dict[str, Any]:
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    fmt = draw(st.sampled_from([2, 3]))
    shards = None
    if fmt == 3 and rank and draw(st.booleans()):
        shards = tuple(c * draw(st.integers(1, 3)) for c in chunks)
    return {
        "shape": shape,
        "chunks": chunks,
        "shards": shards,
        "zarr_format": fmt,
        "dtype": draw(st.sampled_from(DTYPES)),
        "codec": draw(st.sampled_from(CODECS)),
        "fill": draw(st.sampled_from([None, 0, 1])),
        "index_location": draw(st.sampled_from(["start", "end"])),
        "order": draw(st.sampled_from(["C", "F"])),
    }


def _index(draw: Any, n: int) -> Any:
    kind = draw(st.sampled_from(["int", "slice", "full"]))
    if kind == "int" and n > 0:
        return draw(st.integers(-n, n - 1))
    if kind == "full":
        return slice(None)
    start = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    stop = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    step = draw(st.one_of(st.none(), st.integers(-4, 4).filter(lambda s: s != 0)))
    return slice(start, stop, step)


@st.composite
def selections(draw: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    sel = tuple(_index(draw, n) for n in shape)
    if draw(st.booleans()) and sel:
        k = draw(st.integers(0, len(sel)))
        sel = (*sel[:k], Ellipsis) if draw(st.booleans()) else (*sel[:k], None, *sel[k:])
    return sel


def _random(shape: tuple[int, ...], dtype: np.dtype[Any], rng: np.random.Generator) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype == np.dtype(ml_dtypes.int4):
        return rng.integers(-8, 8, shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.integers(-5, 5, shape) + 1j * rng.integers(-5, 5, shape)).astype(dtype)
    return rng.integers(-8, 8, shape).astype(np.float32).astype(dtype)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=arrays(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_random_writes_and_reads_match_numpy(spec: dict[str, Any], data: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    store = MemoryStore()
    kwargs: dict[str, Any] = {
        "shape": spec["shape"],
        "dtype": spec["dtype"],
        "chunks": spec["chunks"],
        "zarr_format": spec["zarr_format"],
        "fill_value": spec["fill"],
    }
    if spec["zarr_format"] == 3:
        kwargs["shards"] = spec["shards"]
        kwargs["index_location"] = spec["index_location"]
        if spec["codec"]:
            kwargs["compressor"] = spec["codec"]
    else:
        kwargs["order"] = spec["order"]
        if spec["codec"] in ("zstd", "gzip"):
            kwargs["compressor"] = {"id": spec["codec"]}
    if spec["dtype"] == "bool" and spec["fill"] is not None:
        kwargs["fill_value"] = bool(spec["fill"])
    a = zarr3.create(store, "arr", **kwargs)
    dtype = a.dtype
    fill = a.fill_value
    model = np.zeros(spec["shape"], dtype) if fill is None else np.full(spec["shape"], fill, dtype)
    for _ in range(data.draw(st.integers(1, 4))):
        sel = data.draw(selections(spec["shape"]))
        target = model[sel]
        value = _random(target.shape, dtype, rng)
        if data.draw(st.booleans()) and target.size:
            value = value.reshape(-1)[:1].reshape(())  # scalar broadcast
        a[sel] = value
        model[sel] = value
    b = zarr3.open(store, "arr")
    assert _same(b[...], model)
    for _ in range(3):
        sel = data.draw(selections(spec["shape"]))
        assert _same(b[sel], model[sel]), sel


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    chunk=st.integers(1, 7),
    step=st.integers(1, 9),
    start=st.integers(0, 10),
)
def test_strided_reads_fetch_only_needed_chunks(shape: list[int], chunk: int, step: int, start: int) -> None:
    from zarr3.indexing import dim_chunks, normalize_selection

    sel = normalize_selection(tuple(slice(start, None, step) for _ in shape), shape)
    for ds, n in zip(sel.dims, shape):
        pieces = dim_chunks(ds, chunk, n)
        wanted = {i // chunk for i in range(ds.start, ds.start + ds.step * ds.count, ds.step)}
        assert [p.chunk for p in pieces] == sorted(wanted)
        assert sum(p.out.stop - p.out.start for p in pieces) == ds.count
