"""Deterministic NumPy trees the save tests write, and a strict comparison (no JAX needed).

The pytest process saves these with ``ocdbt_py.checkpoint.save``; the Orbax worker rebuilds
the same trees and compares Orbax's restore against them.
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

Point = collections.namedtuple("Point", ["x", "y"])


class Empty(NamedTuple):
    pass


#: ml_dtypes types TensorStore reads.
ML_DTYPES = ("bfloat16", "float8_e3m4", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2",
             "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn", "int2", "int4")
NUMPY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                "float32", "float64", "complex64", "complex128")


def dtype_arrays() -> dict[str, np.ndarray]:
    """One small 2-D array per supported dtype, with distinct values."""
    out: dict[str, np.ndarray] = {}
    base = np.arange(24).reshape(4, 6)
    for name in NUMPY_DTYPES:
        dt = np.dtype(name)
        if dt.kind == "b":
            out[name] = (base % 3 == 0)
        elif dt.kind == "c":
            out[name] = (base + 1j * (base - 5)).astype(dt)
        elif dt.kind == "f":
            out[name] = ((base - 7) / 4).astype(dt)
        elif dt.kind == "i":
            out[name] = (base * 5 - 40).astype(dt)
        else:
            out[name] = (base * 7).astype(dt)
    for name in ML_DTYPES:
        dt = np.dtype(getattr(ml_dtypes, name))
        if name in ("int2",):
            vals = (base % 4) - 2
        elif name == "int4":
            vals = (base % 16) - 8
        elif name == "float8_e8m0fnu":
            vals = 2.0 ** ((base % 8) - 3)
        elif name == "float4_e2m1fn":
            vals = ((base % 8) - 4) / 2
        else:
            vals = (base - 12) / 4
        out[name] = np.asarray(vals).astype(dt)
    return out


def rich_tree() -> dict[str, Any]:
    """Every leaf kind and container Orbax handles (NumPy only)."""
    arrs = dtype_arrays()
    return {
        "dtypes": arrs,
        "scalars": {
            "py_int": 7,
            "py_neg": -3,
            "py_float": 2.5,
            "py_bool": True,
            "np_f32": np.float32(1.25),
            "np_i8": np.int8(-5),
            "np_u64": np.uint64(2**63 + 5),
            "np_bool": np.bool_(False),
            "np_c64": np.complex64(1 - 2j),
            "np_bf16": ml_dtypes.bfloat16(0.5),
            "zero_d": np.array(3.5, dtype=np.float64),
        },
        "strings": {"plain": "hello", "unicode": "h\u00e9llo \u2603", "empty": "", "quote": 'say "hi"\n'},
        "empties": {"none": None, "dict": {}, "list": [], "tuple": (), "namedtuple": Empty()},
        "seq": [np.arange(3, dtype=np.int32), {"inner": np.ones((2, 2), np.float32)}, (1, 2.0)],
        "point": Point(np.arange(2.0), np.zeros(1, np.int64)),
        "odd keys": {"sp ace": np.arange(2), "\u00fcn\u00ef": np.arange(3), "x/y": np.arange(4)},
        "int_keys": {3: np.arange(5), 10: np.arange(6)},
        "layouts": {
            "fortran": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
            "transposed": np.arange(12, dtype=np.int64).reshape(3, 4).T,
            "strided": np.arange(40, dtype=np.int16)[::3],
            "big_endian": np.arange(6, dtype=">i4"),
            "readonly": _readonly(np.arange(5, dtype=np.uint8)),
        },
        "big": np.random.default_rng(0).standard_normal((300, 500)).astype(np.float32),
        "zeros_big": np.zeros((512, 1024), np.float32),
    }


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def chunked_tree() -> dict[str, Any]:
    """Arrays for the chunk_byte_size / target-file-size options."""
    return {
        "a": np.arange(256 * 512, dtype=np.float32).reshape(256, 512),
        "b": np.arange(1000, dtype=np.int64),
        "c": np.arange(7 * 9 * 11, dtype=np.float64).reshape(7, 9, 11),
    }


def expected_restore(tree: Any) -> Any:
    """What Orbax (and our restore) returns without a target for ``tree``.

    Tuples become lists and NamedTuples dicts, dict keys strings, Python/NumPy scalars Python
    scalars, empty NamedTuples ``None``; arrays keep their dtype in native byte order.
    """
    if tree is None:
        return None
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        if not tree:
            return None
        return {f: expected_restore(v) for f, v in zip(tree._fields, tree)}
    if isinstance(tree, dict):
        return {str(k): expected_restore(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and not tree:
        return ()  # the "Tuple" empty marker restores as a tuple
    if isinstance(tree, (list, tuple)):
        return [expected_restore(v) for v in tree]
    if isinstance(tree, np.ndarray):
        a = np.array(tree, order="C", copy=True)
        return a.astype(a.dtype.newbyteorder("=")) if a.dtype.byteorder == ">" else a
    if isinstance(tree, (np.generic, int, float, bool, complex)):
        return np.asarray(tree).item()
    return tree


def compare(got: Any, want: Any, path: str = "") -> list[str]:
    """Differences between a restored tree and the expected one (types, dtypes, bits)."""
    errs: list[str] = []
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{path}: expected dict, got {type(got).__name__}"]
        if set(map(str, got)) != set(want):
            errs.append(f"{path}: keys {sorted(map(str, got))} != {sorted(want)}")
        for k in want:
            if k in got:
                errs += compare(got[k], want[k], f"{path}/{k}")
        return errs
    if isinstance(want, tuple):
        return [] if got == () and isinstance(got, tuple) else [f"{path}: expected (), got {got!r:.80}"]
    if isinstance(want, list):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return [f"{path}: expected list of {len(want)}, got {got!r:.80}"]
        for i, (g, w) in enumerate(zip(got, want)):
            errs += compare(g, w, f"{path}/{i}")
        return errs
    if isinstance(want, np.ndarray):
        g = np.asarray(got)
        if g.dtype != want.dtype or g.shape != want.shape:
            return [f"{path}: {g.dtype}{g.shape} != {want.dtype}{want.shape}"]
        if want.dtype.kind == "b" or want.dtype.itemsize == 0:
            ok = np.array_equal(g, want)
        else:
            ok = np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(want).tobytes()
        return [] if ok else [f"{path}: values differ"]
    if want is None:
        return [] if got is None else [f"{path}: expected None, got {got!r:.80}"]
    if type(got) is not type(want) or got != want:
        return [f"{path}: {got!r} ({type(got).__name__}) != {want!r} ({type(want).__name__})"]
    return []


#: Sharded test arrays for an 8-device (4, 2) ("data", "model") mesh:
#: name -> (PartitionSpec entries, or "single" for a single-device array).
SHARDED_SPECS: dict[str, Any] = {
    "kernel": ("data", "model"),
    "bias": (),
    "embed": ("data",),
    "cols": (None, "model"),
    "wide": (("data", "model"),),
    "i8": ("data",),
    "flag": (),
    "zero_d": (),
    "single": "single",
}


def sharded_values() -> dict[str, np.ndarray]:
    """Global values of the sharded test arrays (placed on devices by the JAX worker)."""
    return {
        "kernel": np.arange(128, dtype=np.float32).reshape(8, 16),
        "bias": np.linspace(-1, 1, 16).astype(np.float32),
        "embed": ((np.arange(128) % 97) - 40).reshape(32, 4).astype(ml_dtypes.bfloat16),
        "cols": np.arange(32, dtype=np.float32).reshape(8, 4) * 3,
        "wide": np.arange(32, dtype=np.float32).reshape(8, 4) - 9,
        "i8": (np.arange(8) - 4).astype(np.int8),
        "flag": np.array([True, False, True, True]),
        "zero_d": np.array(2.5, dtype=np.float32),
        "single": np.arange(4, dtype=np.float32) * 1.5,
    }


def numeric_tree() -> dict[str, Any]:
    """Arrays and scalars only (what ``StandardSave`` accepts)."""
    return {
        "dtypes": dtype_arrays(),
        "step": 12,
        "lr": 0.125,
        "ema": np.float32(0.5),
        "layers": [{"w": np.full((3, 4), i, np.float32), "b": np.arange(4, dtype=np.float64) + i} for i in range(3)],
    }


def crash_old() -> dict[str, Any]:
    """The checkpoint an interrupted save must leave intact (atomicity tests)."""
    return {"w": np.arange(3000, dtype=np.float32), "b": np.ones(7), "s": "old", "n": 1}


def crash_new() -> dict[str, Any]:
    """The checkpoint an interrupted save was writing (atomicity tests)."""
    return {"w": np.arange(3000, dtype=np.float32) * 2, "c": np.zeros((40, 50), np.int16), "s": "new", "n": 2}


def crash_new_big() -> dict[str, Any]:
    """``crash_new`` plus 12 MB, so that a save takes long enough to be killed midway."""
    return dict(crash_new(), big=np.random.default_rng(0).standard_normal(3_000_000).astype(np.float32))


def orbax_savable_tree() -> dict[str, Any]:
    """``rich_tree`` without the leaves Orbax itself cannot save (NumPy bool and ml_dtypes
    scalars are not ``np.number``)."""
    t = rich_tree()
    del t["scalars"]["np_bool"], t["scalars"]["np_bf16"]
    return t
