"""Hole 5: the legacy msgpack ``checkpoint`` file.

250 nested ndarray extensions used to raise ``RecursionError``; 250 nested ext32 wrappers
around one bin copied the payload at every level (~2 GiB peak for an 8 MiB file).  Depth is
limited with our error, and extension payloads are decoded from memoryview slices.
"""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest

from ocdbt_py.checkpoint.restore import msgpack_legacy
from ocdbt_py.errors import CorruptionError, OcdbtError

pytestmark = pytest.mark.timeout(60)


def ext32(code: int, payload: bytes) -> bytes:
    return b"\xc9" + struct.pack(">I", len(payload)) + struct.pack(">b", code) + payload


def bin32(data: bytes) -> bytes:
    return b"\xc6" + struct.pack(">I", len(data)) + data


def ndarray_payload(inner: bytes) -> bytes:
    """``[shape, dtype, data]`` whose shape element is ``inner`` (an ndarray nested in the shape)."""
    return b"\x93" + b"\x91" + inner + b"\xa3<f4" + bin32(b"")


def nested_ndarrays(depth: int) -> bytes:
    doc = b"\x00"
    for _ in range(depth):
        doc = ext32(1, ndarray_payload(doc))
    return doc


def nested_wrappers(depth: int, size: int) -> bytes:
    """``depth`` tuple extensions (code 4), each wrapping a one-element array, around one bin."""
    doc = bin32(b"x" * size)
    for _ in range(depth):
        doc = ext32(4, b"\x91" + doc)
    return doc


@pytest.mark.parametrize("depth", [150, 250, 1000])
def test_nested_ndarray_extensions(depth: int) -> None:
    with pytest.raises(CorruptionError, match="nesting"):
        msgpack_legacy.unpack(nested_ndarrays(depth))


def test_deep_stack_at_the_call_site_is_still_our_error() -> None:
    """Even when the caller has used most of the stack, only our error comes out."""
    import sys

    data = nested_ndarrays(msgpack_legacy.MAX_DEPTH - 1)

    def dive(n: int) -> None:
        if n:
            dive(n - 1)
        else:
            try:
                msgpack_legacy.unpack(data)
            except OcdbtError:
                pass

    dive(sys.getrecursionlimit() - 150)


def test_nested_wrappers_do_not_copy_per_level() -> None:
    size = 8 << 20
    data = nested_wrappers(45, size)
    tracemalloc.start()
    try:
        out = msgpack_legacy.unpack(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for _ in range(45):
        assert isinstance(out, tuple) and len(out) == 1
        out = out[0]
    assert out == b"x" * size
    assert peak < 3 * size, peak  # the one bytes value (and slack), not 45 copies


def test_250_wrappers_are_refused_cheaply() -> None:
    data = nested_wrappers(250, 8 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptionError, match="nesting"):
            msgpack_legacy.unpack(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, peak


def test_ndarray_payload_is_copied_once() -> None:
    arr = np.arange(1 << 20, dtype=np.float32)
    doc = ext32(1, b"\x93" + b"\x91\xce" + struct.pack(">I", arr.size) + b"\xa7float32" + bin32(arr.tobytes()))
    tracemalloc.start()
    try:
        out = msgpack_legacy.unpack(doc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable
    assert peak < 1.5 * arr.nbytes, peak
