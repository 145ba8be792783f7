"""The bounded decoder of Orbax's legacy msgpack ``checkpoint`` file."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocdbt_py.checkpoint.restore import msgpack_legacy
from ocdbt_py.checkpoint.restore.msgpack_legacy import ExtValue, Placeholder, unpack
from ocdbt_py.errors import CorruptionError, OcdbtError, UnsupportedError

msgpack = pytest.importorskip("msgpack")


def ndarray_ext(a: np.ndarray, code: int = 1) -> msgpack.ExtType:
    """How Flax/Orbax packed arrays: ext(code, packb((shape, dtype.name, bytes)))."""
    return msgpack.ExtType(code, msgpack.packb((a.shape, a.dtype.name, a.tobytes()), use_bin_type=True))


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@given(json_like)
@settings(max_examples=200, deadline=None)
def test_matches_msgpack_for_plain_documents(doc: object) -> None:
    assert unpack(msgpack.packb(doc, use_bin_type=True)) == doc


@given(st.binary(max_size=200))
@settings(max_examples=500, deadline=None)
def test_garbage_raises_only_our_errors(data: bytes) -> None:
    try:
        unpack(data)
    except (CorruptionError, UnsupportedError):
        pass


@given(json_like)
@settings(max_examples=40, deadline=None)
def test_truncated_documents_are_rejected(doc: object) -> None:
    raw = msgpack.packb(doc, use_bin_type=True)
    for cut in range(len(raw)):
        with pytest.raises(OcdbtError):
            unpack(raw[:cut])


def test_placeholders_and_extension_types() -> None:
    doc = {
        "w": "PLACEHOLDER://params.w",
        "agg": "AGGREGATED://x",
        "arr": ndarray_ext(np.arange(6, dtype=np.int16).reshape(2, 3)),
        "bf": ndarray_ext(np.arange(3, dtype=np.float32).astype(ml_dtypes.bfloat16)),
        "scalar": ndarray_ext(np.asarray(np.float32(0.5)), 3),
        "cplx": msgpack.ExtType(2, msgpack.packb((1.5, -2.0))),
        "tup": msgpack.ExtType(4, msgpack.packb([1, "a", ndarray_ext(np.ones(2))], use_bin_type=True)),
        "unknown": msgpack.ExtType(9, b"xyz"),
        "lst": [1, 2.5, None, True],
    }
    got = unpack(msgpack.packb(doc, use_bin_type=True))
    assert isinstance(got["w"], Placeholder) and got["w"] == "params.w"
    assert isinstance(got["agg"], Placeholder) and got["agg"] == "x"
    np.testing.assert_array_equal(got["arr"], np.arange(6, dtype=np.int16).reshape(2, 3))
    assert got["bf"].dtype == ml_dtypes.bfloat16 and got["bf"].tolist() == [0.0, 1.0, 2.0]
    assert isinstance(got["scalar"], np.float32) and got["scalar"] == 0.5
    assert got["cplx"] == complex(1.5, -2.0)
    assert isinstance(got["tup"], tuple) and got["tup"][:2] == (1, "a")
    np.testing.assert_array_equal(got["tup"][2], np.ones(2))
    assert isinstance(got["unknown"], ExtValue) and got["unknown"].code == 9
    assert got["lst"] == [1, 2.5, None, True]


def test_chunked_arrays_are_reassembled() -> None:
    a = np.arange(10, dtype=np.float32)
    doc = {"big": {"__msgpack_chunked_array__": True, "shape": {"0": 2, "1": 5},
                   "chunks": {"0": ndarray_ext(a[:6]), "1": ndarray_ext(a[6:])}}}
    got = unpack(msgpack.packb(doc, use_bin_type=True))
    np.testing.assert_array_equal(got["big"], a.reshape(2, 5))
    bad = {"big": {"__msgpack_chunked_array__": True, "shape": {"0": 3}, "chunks": {"0": ndarray_ext(a)}}}
    with pytest.raises(CorruptionError, match="elements"):
        unpack(msgpack.packb(bad, use_bin_type=True))


def test_ndarray_size_must_match_shape() -> None:
    lying = msgpack.ExtType(1, msgpack.packb(((1000, 1000), "float32", b"\0" * 16), use_bin_type=True))
    with pytest.raises(CorruptionError, match="needs 4000000 bytes"):
        unpack(msgpack.packb({"x": lying}))
    with pytest.raises(UnsupportedError):
        unpack(msgpack.packb({"x": msgpack.ExtType(1, msgpack.packb(((1,), "object", b"\0" * 8)))}))
    with pytest.raises(CorruptionError, match="shape"):
        unpack(msgpack.packb({"x": msgpack.ExtType(1, msgpack.packb(((-1,), "int8", b"")))}))


def test_huge_declared_lengths_do_not_allocate() -> None:
    # a map claiming 2**32-1 entries, an array claiming 2**32-1 items, a 4 GiB string
    for raw in (b"\xdf\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff" + b"x" * 10,
                b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01"):
        with pytest.raises(CorruptionError, match="truncated"):
            unpack(raw)


def test_nesting_is_bounded() -> None:
    deep = b"\x91" * (msgpack_legacy.MAX_DEPTH + 5) + b"\xc0"
    with pytest.raises(CorruptionError, match="deeper"):
        unpack(deep)
    ok = b"\x91" * 50 + b"\xc0"
    x = unpack(ok)
    for _ in range(50):
        x = x[0]
    assert x is None


def test_trailing_bytes_and_bad_type_byte() -> None:
    with pytest.raises(CorruptionError, match="trailing"):
        unpack(msgpack.packb(1) + b"\x00")
    with pytest.raises(CorruptionError, match="0xc1"):
        unpack(b"\xc1")
    with pytest.raises(CorruptionError, match="UTF-8"):
        unpack(b"\xa2\xff\xfe")


def test_numbers() -> None:
    for v in (0, 127, 128, -1, -32, -33, 2**15, -(2**31), 2**63, -(2**63), 2**64 - 1):
        assert unpack(msgpack.packb(v)) == v
    assert unpack(b"\xca" + struct.pack(">f", 1.5)) == 1.5
    assert math.isnan(unpack(msgpack.packb(float("nan"))))
