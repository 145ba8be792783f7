"""Golden-value encoding shared by the corpus generators and the checkpoint tests.

The generators run Orbax (any release, in its own venv) and record what Orbax's own restore
returned, so the tests can compare ``ocdbt_py.checkpoint.restore`` with it without importing
Orbax or JAX.  The record is JSON plus one raw ``.bin`` file per array, never a pickle:

* dict   -> ``{"__dict__": [[key, value], ...]}`` (order kept, keys as Orbax returned them)
* list   -> ``{"__list__": [...]}``; tuple -> ``{"__tuple__": [...]}``
* None   -> ``null``; Ellipsis -> ``{"__ellipsis__": true}``
* Python scalar -> ``{"__py__": "int" | "float" | "bool" | "str", "v": value}``
  (floats as ``repr`` strings so NaN and infinities survive)
* array  -> ``{"__array__": "jax" | "numpy", "dtype": name, "shape": [...], "file": name,
  "sharding": {...} | null, "prng": impl | null}``

This module must import with numpy alone (old venvs have numpy 1.x and no ml_dtypes).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

__all__ = ["Encoder", "load_expected", "compare", "ExpectedArray", "FLOAT_TAG"]

FLOAT_TAG = "__py__"


def _dtype_name(dtype: Any) -> str:
    return str(np.dtype(dtype)) if not hasattr(dtype, "name") else str(dtype.name)


class Encoder:
    """Writes a restored tree into ``<out_dir>/<name>.json`` plus ``<out_dir>/<name>/*.bin``."""

    def __init__(self, out_dir: str, name: str):
        self.out_dir = out_dir
        self.name = name
        self.count = 0
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)

    def _array(self, x: Any, kind: str, sharding: Any = None, prng: str | None = None) -> dict:
        a = np.asarray(x)
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d arrays 1-d)
            a = a.copy(order="C")
        fname = f"{self.name}/{self.count}.bin"
        self.count += 1
        with open(os.path.join(self.out_dir, fname), "wb") as f:
            f.write(a.tobytes())
        return {
            "__array__": kind,
            "dtype": _dtype_name(a.dtype),
            "shape": list(a.shape),
            "file": fname,
            "sharding": sharding,
            "prng": prng,
        }

    def encode(self, x: Any) -> Any:
        """Encode one restored value (recursively)."""
        if x is None:
            return None
        if x is Ellipsis:
            return {"__ellipsis__": True}
        if isinstance(x, dict):
            return {"__dict__": [[k, self.encode(v)] for k, v in x.items()]}
        if isinstance(x, list):
            return {"__list__": [self.encode(v) for v in x]}
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return {"__tuple__": [self.encode(v) for v in x]}
        if isinstance(x, tuple):  # a NamedTuple: keep field names
            return {"__namedtuple__": [[k, self.encode(v)] for k, v in zip(x._fields, x)]}
        if isinstance(x, bool):
            return {FLOAT_TAG: "bool", "v": x}
        if isinstance(x, int):
            return {FLOAT_TAG: "int", "v": x}
        if isinstance(x, float):
            return {FLOAT_TAG: "float", "v": repr(x)}
        if isinstance(x, str):
            return {FLOAT_TAG: "str", "v": x}
        if isinstance(x, complex):
            return {FLOAT_TAG: "complex", "v": [repr(x.real), repr(x.imag)]}
        if isinstance(x, np.ndarray):
            return self._array(x, "numpy")
        if isinstance(x, np.generic):
            return {"__npscalar__": _dtype_name(x.dtype), "v": self.encode(x.item())}
        mod = type(x).__module__
        if mod.startswith("jax") or hasattr(x, "sharding"):
            return self._jax_array(x)
        raise TypeError(f"cannot encode {type(x)!r}")

    def _jax_array(self, x: Any) -> dict:
        import jax

        prng = None
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            prng = str(jax.random.key_impl(x))
            x = jax.random.key_data(x)
        return self._array(x, "jax", sharding=describe_sharding(x.sharding), prng=prng)

    def write(self, tree: Any, **extra: Any) -> None:
        """Encode ``tree`` and write the JSON record (``extra`` members are stored as given)."""
        rec = {"tree": self.encode(tree), **extra}
        with open(os.path.join(self.out_dir, self.name + ".json"), "w") as f:
            json.dump(rec, f, indent=1, ensure_ascii=False)


def describe_sharding(s: Any) -> dict | None:
    """A JSON description of a JAX sharding (NamedSharding mesh axes and spec)."""
    try:
        mesh = s.mesh
        spec = [list(p) if isinstance(p, tuple) else p for p in s.spec]
        return {
            "type": "NamedSharding",
            "mesh_shape": [int(n) for n in mesh.devices.shape],
            "axis_names": list(mesh.axis_names),
            "spec": spec,
        }
    except AttributeError:
        return {"type": type(s).__name__}


# -- decoding (tests) --------------------------------------------------------------------------


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _decode(node: Any, base: str) -> Any:
    if node is None:
        return None
    if isinstance(node, dict):
        if "__dict__" in node:
            return {k: _decode(v, base) for k, v in node["__dict__"]}
        if "__list__" in node:
            return [_decode(v, base) for v in node["__list__"]]
        if "__tuple__" in node:
            return tuple(_decode(v, base) for v in node["__tuple__"])
        if "__namedtuple__" in node:
            return {k: _decode(v, base) for k, v in node["__namedtuple__"]}
        if "__ellipsis__" in node:
            return Ellipsis
        if FLOAT_TAG in node:
            t, v = node[FLOAT_TAG], node["v"]
            if t == "float":
                return float(v)
            if t == "complex":
                return complex(float(v[0]), float(v[1]))
            return {"int": int, "bool": bool, "str": str}[t](v)
        if "__npscalar__" in node:
            return _dtype(node["__npscalar__"]).type(_decode(node["v"], base))
        if "__array__" in node:
            dt = _dtype(node["dtype"])
            with open(os.path.join(base, node["file"]), "rb") as f:
                raw = f.read()
            arr = np.frombuffer(raw, dtype=dt).reshape(node["shape"]).copy()
            return ExpectedArray(arr, node["__array__"], node.get("sharding"), node.get("prng"))
    raise ValueError(f"bad expected record node: {node!r}")


class ExpectedArray:
    """An array Orbax returned, with how it returned it (``kind`` is ``"jax"`` or ``"numpy"``)."""

    def __init__(self, value: np.ndarray, kind: str, sharding: dict | None, prng: str | None):
        self.value = value
        self.kind = kind
        self.sharding = sharding
        self.prng = prng

    def __repr__(self) -> str:
        return f"ExpectedArray({self.kind}, {self.value.dtype}, {self.value.shape})"


def load_expected(path: str) -> dict:
    """Read a record written by :class:`Encoder`; ``tree`` is decoded, other members raw."""
    with open(path, encoding="utf-8") as f:
        rec = json.load(f)
    rec["tree"] = _decode(rec["tree"], os.path.dirname(path))
    return rec


def same_float(a: float, b: float) -> bool:
    """Float equality that treats NaN as equal to NaN."""
    return (math.isnan(a) and math.isnan(b)) or a == b


def compare(expected: Any, got: Any, path: str = "$") -> list[str]:
    """Differences between an expected record tree and a restored tree (empty: identical).

    Arrays must match in dtype, shape and every byte (so NaN payloads and -0.0 count);
    Python scalars in type and value; containers in type, keys and length.
    """
    errs: list[str] = []
    if isinstance(expected, ExpectedArray):
        if not isinstance(got, np.ndarray):
            return [f"{path}: expected an ndarray, got {type(got).__name__}"]
        e = expected.value
        if got.dtype != e.dtype:
            return [f"{path}: dtype {got.dtype} != expected {e.dtype}"]
        if got.shape != e.shape:
            return [f"{path}: shape {got.shape} != expected {e.shape}"]
        if np.ascontiguousarray(got).tobytes() != e.tobytes():
            return [f"{path}: values differ"]
        return []
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return [f"{path}: expected a dict, got {type(got).__name__}"]
        if set(expected) != set(got):
            return [f"{path}: keys {sorted(map(str, got))} != expected {sorted(map(str, expected))}"]
        for k in expected:
            errs += compare(expected[k], got[k], f"{path}.{k}")
        return errs
    if isinstance(expected, (list, tuple)):
        if type(got) is not type(expected):
            return [f"{path}: expected a {type(expected).__name__}, got {type(got).__name__}"]
        if len(expected) != len(got):
            return [f"{path}: length {len(got)} != expected {len(expected)}"]
        for i, (a, b) in enumerate(zip(expected, got)):
            errs += compare(a, b, f"{path}[{i}]")
        return errs
    if type(expected) is not type(got):
        return [f"{path}: expected {type(expected).__name__} {expected!r}, got {type(got).__name__} {got!r}"]
    if isinstance(expected, float) and same_float(expected, got):
        return []
    if expected != got:
        return [f"{path}: {got!r} != expected {expected!r}"]
    return []
