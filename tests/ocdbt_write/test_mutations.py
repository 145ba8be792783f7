"""MutationSet keeps TensorStore's normal form and means what a dict model means."""

from __future__ import annotations

import io
import random

import pytest

from ocdbt_py.errors import InvalidKeyError
from ocdbt_py.write.mutations import (
    DELETE_RANGE,
    WRITE,
    ChunkedValue,
    MutationSet,
    as_key,
    as_value,
    value_length,
)


def _apply(base: dict[bytes, bytes], muts: MutationSet) -> dict[bytes, bytes]:
    out = dict(base)
    for m in muts.sorted():
        if m.kind == DELETE_RANGE:
            for k in [k for k in out if k >= m.key and (m.stop is None or k < m.stop)]:
                del out[k]
        elif m.value is None:
            out.pop(m.key, None)
        else:
            out[m.key] = bytes(m.value)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("seed", range(30))
def test_random_ops_match_dict_model(seed: int) -> None:
    rnd = random.Random(seed)
    keys = [bytes([a, b]) for a in b"abc" for b in b"xyz"] + [b"", b"a", b"b\xff"]
    base = {k: b"base" for k in keys if rnd.random() < 0.5}
    model = dict(base)
    muts = MutationSet()
    for _ in range(rnd.randrange(1, 30)):
        r = rnd.random()
        k = rnd.choice(keys)
        if r < 0.4:
            v = rnd.randbytes(3)
            muts.set(k, v)
            model[k] = v
        elif r < 0.6:
            muts.set(k, None)
            model.pop(k, None)
        else:
            lo = rnd.choice(keys)
            hi = None if rnd.random() < 0.2 else rnd.choice(keys)
            muts.delete_range(lo, hi)
            for kk in [kk for kk in model if kk >= lo and (hi is None or kk < hi)]:
                del model[kk]
    assert _apply(base, muts) == model
    # normal form: ranges disjoint, sorted, and contain no written key
    ranges = muts.ranges
    for (_a, b), (c, _) in zip(ranges, ranges[1:]):
        assert b is not None and b < c
    for k in muts.writes:
        assert not any(k >= lo and (hi is None or k < hi) for lo, hi in ranges)
    ordered = muts.sorted()
    assert [m.key for m in ordered] == sorted(m.key for m in ordered)
    assert all(m.kind in (WRITE, DELETE_RANGE) for m in ordered)


def test_write_splits_a_range() -> None:
    m = MutationSet()
    m.delete_range(b"a", b"z")
    m.set(b"m", b"1")
    assert m.ranges == [(b"a", b"m"), (b"m\x00", b"z")]
    m.set(b"a", None)
    assert m.ranges == [(b"a\x00", b"m"), (b"m\x00", b"z")]
    assert m.in_deleted_range(b"c") and not m.in_deleted_range(b"m") and not m.in_deleted_range(b"zz")
    m.delete_range(b"", None)
    assert m.ranges == [(b"", None)] and not m.writes
    m.delete_range(b"b", b"a")  # empty range: no-op
    assert len(m) == 1


def test_keys_and_values_are_validated() -> None:
    assert as_key("é") == "é".encode()
    assert as_key(bytearray(b"k")) == b"k"
    with pytest.raises(InvalidKeyError):
        as_key(b"x" * 65536)
    with pytest.raises(InvalidKeyError):
        as_key(5)
    assert as_key(b"x" * 65535) == b"x" * 65535
    with pytest.raises(TypeError):
        as_value("text")
    with pytest.raises(TypeError):
        as_value(3.5)
    mv = as_value(bytearray(b"abc"))
    assert isinstance(mv, memoryview) and bytes(mv) == b"abc"
    import array

    arr = array.array("i", [1, 2])
    assert value_length(as_value(arr)) == arr.itemsize * 2
    assert as_value(io.BytesIO(b"")) == b""
    assert as_value(io.BytesIO(b"abc")) == b"abc"
    big = io.BytesIO(b"\x01" * ((16 << 20) + 3))
    chunked = as_value(big)
    assert isinstance(chunked, ChunkedValue) and len(chunked) == (16 << 20) + 3
    with pytest.raises(TypeError):
        as_value(io.StringIO("text"))
