"""Zarr data types and their NumPy / ml_dtypes equivalents.

:class:`DataType` describes one element type: its Zarr v3 ``data_type`` name, the native-order
NumPy dtype used in memory, its v2 ``dtype`` spelling and how its fill value is encoded.
Sub-byte types (``int4``, ``uint4``, ``int2``, ``float4_e2m1fn``, ...) take one byte per
element, exactly as TensorStore stores them and as ml_dtypes holds them in memory.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from zarr3.errors import MetadataError

__all__ = [
    "DataType",
    "DATA_TYPES",
    "parse_data_type_v3",
    "parse_dtype_v2",
    "data_type_from_numpy",
    "v2_dtype_string",
    "VARIABLE_KINDS",
    "ML_FLOAT_NAMES",
    "ML_INT_NAMES",
    "STRING",
    "VLEN_BYTES",
    "OBJECT",
    "fixed_bytes_type",
    "fixed_unicode_type",
]

_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True)
class DataType:
    """One Zarr element type.

    ``kind`` is one of ``"bool"``, ``"int"``, ``"uint"``, ``"float"``, ``"complex"``,
    ``"raw"`` (``r<N>`` / ``raw_bytes`` / ``V<n>`` opaque bytes), ``"struct"`` (zarr v2
    structured dtypes), ``"bytes"`` (fixed-size ``S<n>``, zarr-python's
    ``null_terminated_bytes``), ``"unicode"`` (fixed-size ``U<n>``, ``fixed_length_utf32``),
    or one of the variable-length kinds in :data:`VARIABLE_KINDS`: ``"string"`` (NumPy
    ``StringDType``), ``"vbytes"`` (object array of ``bytes``) and ``"object"`` (v2 ``|O``
    arrays of JSON values).  ``dtype`` is the in-memory NumPy dtype, always in native byte
    order.  ``length_bytes`` is the ``configuration.length_bytes`` of zarr-python's configured
    v3 data types (written back as ``{"name": ..., "configuration": {...}}``).
    """

    name: str
    dtype: np.dtype[Any]
    kind: str
    v2_name: str | None = None  # bare v2 name for types without a byte-order letter
    length_bytes: int | None = None
    time_unit: str | None = None  # numpy.datetime64 / numpy.timedelta64: unit and scale factor
    time_scale: int = 1

    @property
    def variable(self) -> bool:
        """Whether elements have no fixed size (strings, bytes and objects)."""
        return self.kind in VARIABLE_KINDS

    @property
    def v3_json(self) -> Any:
        """The v3 ``data_type`` member for this type."""
        if self.kind == "struct":
            assert self.dtype.names is not None and self.dtype.fields is not None
            fields = [[n, data_type_from_numpy(self.dtype.fields[n][0]).v3_json] for n in self.dtype.names]
            return {"configuration": {"fields": fields}, "name": "structured"}
        if self.time_unit is not None:
            return {"configuration": {"scale_factor": self.time_scale, "unit": self.time_unit}, "name": self.name}
        if self.length_bytes is None:
            return self.name
        return {"configuration": {"length_bytes": self.length_bytes}, "name": self.name}

    @property
    def itemsize(self) -> int:
        """Bytes per element (sub-byte types take a whole byte)."""
        return int(self.dtype.itemsize)

    @property
    def bits_dtype(self) -> np.dtype[Any]:
        """Unsigned integer dtype of the same size, for bit-exact views (itemsize <= 8)."""
        return np.dtype(f"u{self.itemsize}")

    @property
    def component(self) -> DataType:
        """For complex types, the float type of each component; otherwise ``self``."""
        if self.kind != "complex":
            return self
        return DATA_TYPES["float32" if self.itemsize == 8 else "float64"]

    @property
    def has_nan(self) -> bool:
        """Whether the type can hold NaN."""
        if self.kind not in ("float", "complex"):
            return False
        comp = self.component
        try:
            return bool(np.isnan(np.array(np.nan).astype(comp.dtype)))
        except (TypeError, ValueError):  # pragma: no cover - exotic types
            return False

    def __repr__(self) -> str:
        return f"DataType({self.name!r})"


def _ml(name: str) -> np.dtype[Any] | None:
    t = getattr(ml_dtypes, name, None)
    return None if t is None else np.dtype(t)


#: The ml_dtypes floating-point types (TensorStore extensions, what JAX checkpoints hold): the
#: one list of them (``ocdbt_py.checkpoint.dtypes`` builds on it).
ML_FLOAT_NAMES = (
    "bfloat16",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
)
#: The ml_dtypes sub-byte integer types.
ML_INT_NAMES = ("int2", "int4", "uint2", "uint4")


def _build_registry() -> dict[str, DataType]:
    reg: dict[str, DataType] = {}

    def add(dt: DataType) -> None:
        reg[dt.name] = dt

    add(DataType("bool", np.dtype(np.bool_), "bool"))
    for bits in (8, 16, 32, 64):
        add(DataType(f"int{bits}", np.dtype(f"i{bits // 8}"), "int"))
        add(DataType(f"uint{bits}", np.dtype(f"u{bits // 8}"), "uint"))
    add(DataType("float16", np.dtype(np.float16), "float"))
    add(DataType("float32", np.dtype(np.float32), "float"))
    add(DataType("float64", np.dtype(np.float64), "float"))
    add(DataType("complex64", np.dtype(np.complex64), "complex"))
    add(DataType("complex128", np.dtype(np.complex128), "complex"))
    # ml_dtypes types (TensorStore extensions, also what JAX checkpoints hold).
    for name in ML_FLOAT_NAMES:
        dt = _ml(name)
        if dt is not None:
            add(DataType(name, dt, "float", v2_name=name))
    for name in ML_INT_NAMES:
        kind = "uint" if name.startswith("u") else "int"
        dt = _ml(name)
        if dt is not None:
            add(DataType(name, dt, kind, v2_name=name))
    return reg


#: Kinds whose elements have no fixed size (decoded by ``vlen-*`` / ``json2`` codecs).
VARIABLE_KINDS = frozenset({"string", "vbytes", "object"})

#: Every named data type, keyed by its Zarr v3 ``data_type`` name.
DATA_TYPES: Mapping[str, DataType] = _build_registry()

#: NumPy's variable-width UTF-8 string dtype (what zarr-python returns for ``string``).
STRING_DTYPE: np.dtype[Any] = np.dtype(np.dtypes.StringDType())
STRING = DataType("string", STRING_DTYPE, "string")
VLEN_BYTES = DataType("variable_length_bytes", np.dtype(object), "vbytes")
OBJECT = DataType("object", np.dtype(object), "object")
_VARIABLE_V3 = {"string": STRING, "variable_length_bytes": VLEN_BYTES, "bytes": VLEN_BYTES}
#: Longest fixed-size string/bytes element accepted (bytes).
MAX_FIXED_ITEMSIZE = 1 << 20


def fixed_bytes_type(nbytes: int) -> DataType:
    """``S<n>``: zarr-python's ``null_terminated_bytes`` (v2 ``|S<n>``)."""
    return DataType("null_terminated_bytes", np.dtype(f"S{nbytes}"), "bytes", length_bytes=nbytes)


def fixed_unicode_type(nchars: int) -> DataType:
    """``U<n>``: zarr-python's ``fixed_length_utf32`` (v2 ``<U<n>``), UTF-32 code units."""
    return DataType("fixed_length_utf32", np.dtype(f"U{nchars}"), "unicode", length_bytes=4 * nchars)


_TIME_UNITS = ("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as", "generic")
_TIME_V2 = re.compile(r"^([<>|=]?)([mM])8(?:\[([0-9]*)([A-Za-z]+)\])?$")


def time_type(letter: str, unit: str, scale: int = 1) -> DataType:
    """``numpy.datetime64`` (``letter`` ``M``) or ``numpy.timedelta64`` (``m``) of ``scale`` units."""
    code = unit if unit == "generic" else f"{scale if scale != 1 else ''}{unit}"
    dtype = np.dtype(f"{letter}8" if unit == "generic" else f"{letter}8[{code}]")
    name = "numpy.datetime64" if letter == "M" else "numpy.timedelta64"
    return DataType(name, dtype, "datetime", time_unit=unit, time_scale=scale)


def _time_v3(name: str, config: Any, field: str) -> DataType:
    if not isinstance(config, Mapping) or not set(config) <= {"unit", "scale_factor"}:
        raise MetadataError(f"{field}.configuration", config, 'expected {"unit": ..., "scale_factor": n}')
    unit = config.get("unit", "generic")
    scale = config.get("scale_factor", 1)
    if unit not in _TIME_UNITS:
        raise MetadataError(f"{field}.configuration.unit", unit, f"expected one of {list(_TIME_UNITS)}")
    if not isinstance(scale, int) or isinstance(scale, bool) or not 1 <= scale < 1 << 31:
        raise MetadataError(f"{field}.configuration.scale_factor", scale, "expected a positive integer")
    return time_type("M" if name == "numpy.datetime64" else "m", unit, scale)


def _struct_v3(config: Any, field: str) -> DataType:
    """zarr-python 3's ``{"name": "structured", "configuration": {"fields": [[name, type], ...]}}``."""
    fields = config.get("fields") if isinstance(config, Mapping) else None
    if not isinstance(fields, list) or not 1 <= len(fields) <= MAX_STRUCT_FIELDS:
        raise MetadataError(f"{field}.configuration.fields", fields, "expected a list of [name, data_type]")
    out: list[tuple[str, np.dtype[Any]]] = []
    for i, f in enumerate(fields):
        where = f"{field}.configuration.fields[{i}]"
        if not isinstance(f, list) or len(f) != 2 or not isinstance(f[0], str) or not f[0]:
            raise MetadataError(where, f, "expected [name, data_type]")
        sub = parse_data_type_v3(f[1], f"{where}[1]")
        if sub.variable or sub.kind == "struct":
            raise MetadataError(where, f, "fields must have fixed-size, non-structured types")
        out.append((f[0], sub.dtype))
    try:
        dtype = np.dtype(out)
    except (TypeError, ValueError) as e:
        raise MetadataError(f"{field}.configuration.fields", fields, f"invalid structure: {e}") from e
    if dtype.itemsize > MAX_FIXED_ITEMSIZE:
        raise MetadataError(f"{field}.configuration.fields", fields, "structured element larger than 1 MiB")
    return DataType("structured", dtype, "struct")


def _configured_v3(name: str, config: Any, field: str, value: Any) -> DataType:
    """zarr-python's configured data types: ``{"name": ..., "configuration": {"length_bytes": n}}``."""
    if not isinstance(config, Mapping) or set(config) != {"length_bytes"}:
        raise MetadataError(f"{field}.configuration", config, "expected {\"length_bytes\": n}")
    n = config["length_bytes"]
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_FIXED_ITEMSIZE:
        raise MetadataError(
            f"{field}.configuration.length_bytes", n, f"expected an integer in [1, {MAX_FIXED_ITEMSIZE}]"
        )
    if name == "null_terminated_bytes":
        return fixed_bytes_type(n)
    if name == "raw_bytes":
        return DataType("raw_bytes", np.dtype(f"V{n}"), "raw", length_bytes=n)
    if n % 4:
        raise MetadataError(f"{field}.configuration.length_bytes", n, "fixed_length_utf32 needs a multiple of 4")
    return fixed_unicode_type(n // 4)

_RAW = re.compile(r"^r([1-9][0-9]*)$")


def _raw_type(nbytes: int, name: str) -> DataType:
    return DataType(name, np.dtype(f"V{nbytes}"), "raw")


def parse_data_type_v3(value: Any, field: str = "data_type") -> DataType:
    """Resolve a v3 ``data_type`` member (a name, or ``{"name": ...}``) to a :class:`DataType`."""
    name = value
    if isinstance(value, Mapping):
        name = value.get("name")
        config = value.get("configuration")
        if name in ("null_terminated_bytes", "raw_bytes", "fixed_length_utf32"):
            return _configured_v3(name, config, field, value)
        if name in ("numpy.datetime64", "numpy.timedelta64"):
            return _time_v3(name, config, field)
        if name == "structured":
            return _struct_v3(config, field)
        if config not in (None, {}):
            raise MetadataError(field, value, "data type configuration is not supported")
    if not isinstance(name, str):
        raise MetadataError(field, value, "expected a data type name string")
    dt = DATA_TYPES.get(name) or _VARIABLE_V3.get(name)
    if dt is not None:
        return dt
    m = _RAW.match(name)
    if m:
        bits = int(m.group(1))
        if bits % 8 or bits > 8 * 1024:
            raise MetadataError(field, value, "raw data types must be a whole number of bytes")
        return _raw_type(bits // 8, name)
    raise MetadataError(field, value, "unsupported data type")


_V2 = re.compile(r"^([<>|=]?)([biufcVSU])([0-9]+)$")


def parse_dtype_v2(value: Any, field: str = "dtype") -> tuple[DataType, np.dtype[Any]]:
    """Resolve a v2 ``dtype`` string to ``(DataType, stored dtype)``.

    The stored dtype carries the byte order the chunks use (``>i2`` stays big-endian); the
    :class:`DataType` is the native-order type arrays are returned in.
    """
    if isinstance(value, list):
        return _parse_struct_v2(value, field)
    if not isinstance(value, str):
        raise MetadataError(field, value, "expected a dtype string")
    if value in ("|O", "O", "object"):
        # refined by the object codec in ``filters`` (vlen-utf8 -> string, ...)
        return OBJECT, OBJECT.dtype
    tm = _TIME_V2.match(value)
    if tm:
        order, letter, scale_s, unit = tm.groups()
        if (unit or "generic") not in _TIME_UNITS:
            raise MetadataError(field, value, "unsupported datetime unit")
        t = time_type(letter, unit or "generic", int(scale_s) if scale_s else 1)
        return t, t.dtype.newbyteorder(">" if order == ">" else "<")
    bare = value[1:] if value[:1] in "<>|=" and len(value) > 1 else value
    dt = DATA_TYPES.get(bare)
    if dt is not None and dt.v2_name is not None:
        return dt, dt.dtype
    m = _V2.match(value)
    if not m:
        raise MetadataError(field, value, "unsupported data type")
    order, kind, size_s = m.groups()
    size = int(size_s)
    if kind in "VSU":
        if size <= 0 or size * (4 if kind == "U" else 1) > MAX_FIXED_ITEMSIZE:
            raise MetadataError(field, value, "unsupported raw byte size")
        if kind == "S":
            return fixed_bytes_type(size), np.dtype(f"S{size}")
        if kind == "U":
            return fixed_unicode_type(size), np.dtype(f"{'>' if order == '>' else '<'}U{size}")
        return _raw_type(size, value), np.dtype(f"V{size}")
    try:
        stored = np.dtype(value)
    except TypeError as e:
        raise MetadataError(field, value, "unsupported data type") from e
    if kind == "b":
        if size != 1:
            raise MetadataError(field, value, "bool must be 1 byte")
        return DATA_TYPES["bool"], stored
    names = {"i": "int", "u": "uint", "f": "float", "c": "complex"}
    name = f"{names[kind]}{size * 8}"
    dt = DATA_TYPES.get(name)
    if dt is None:
        raise MetadataError(field, value, "unsupported data type")
    if stored.itemsize > 1 and order == "|":
        raise MetadataError(field, value, "multi-byte types need '<' or '>' byte order")
    return dt, stored


MAX_STRUCT_FIELDS = 1024


def _parse_struct_v2(value: list[Any], field: str) -> tuple[DataType, np.dtype[Any]]:
    """A v2 structured dtype: ``[[name, dtype], [name, dtype, shape], ...]``."""
    if not value or len(value) > MAX_STRUCT_FIELDS:
        raise MetadataError(field, value, "a structured dtype needs 1 to 1024 fields")
    stored_fields: list[tuple[Any, ...]] = []
    native_fields: list[tuple[Any, ...]] = []
    names: set[str] = set()
    for i, f in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(f, list) or len(f) not in (2, 3) or not isinstance(f[0], str) or not f[0]:
            raise MetadataError(where, f, "expected [name, dtype] or [name, dtype, shape]")
        if f[0] in names:
            raise MetadataError(where, f, "duplicate field name")
        names.add(f[0])
        if isinstance(f[1], list):
            raise MetadataError(where, f, "nested structured dtypes are not supported")
        sub, sub_stored = parse_dtype_v2(f[1], f"{where}[1]")
        shape: tuple[int, ...] = ()
        if len(f) == 3:
            if not isinstance(f[2], list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1 << 20 for n in f[2]
            ):
                raise MetadataError(f"{where}[2]", f[2], "expected a list of positive integers")
            shape = tuple(f[2])
        stored_fields.append((f[0], sub_stored, shape) if shape else (f[0], sub_stored))
        native_fields.append((f[0], sub.dtype, shape) if shape else (f[0], sub.dtype))
    stored = np.dtype(stored_fields)
    native = np.dtype(native_fields)
    if stored.itemsize > 1 << 20:
        raise MetadataError(field, value, "structured element larger than 1 MiB")
    return DataType("structured", native, "struct"), stored


def struct_v2_json(stored: np.dtype[Any]) -> list[Any]:
    """The v2 ``dtype`` list for a structured NumPy dtype."""
    assert stored.names is not None and stored.fields is not None
    out: list[Any] = []
    for name in stored.names:
        sub = stored.fields[name][0]
        base, shape = sub.subdtype if sub.subdtype is not None else (sub, ())
        sub_dt = data_type_from_numpy(base)
        order = ">" if base.byteorder == ">" else "<"
        entry: list[Any] = [name, v2_dtype_string(sub_dt, order)]
        if shape:
            entry.append(list(shape))
        out.append(entry)
    return out


def data_type_from_numpy(dtype: Any) -> DataType:
    """Find the :class:`DataType` for a NumPy dtype (or a Zarr v3 data type name)."""
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, str):
        if dtype in DATA_TYPES:
            return DATA_TYPES[dtype]
        if dtype in _VARIABLE_V3:
            return _VARIABLE_V3[dtype]
        m = _RAW.match(dtype)
        if m:
            return parse_data_type_v3(dtype)
    try:
        nd = np.dtype(dtype)
    except TypeError as e:
        raise MetadataError("dtype", dtype, "not a NumPy dtype") from e
    if nd.names is not None:
        struct, _stored = _parse_struct_v2(struct_v2_json(nd), "dtype")
        return struct
    if nd.kind == "S" and nd.itemsize:
        return fixed_bytes_type(nd.itemsize)
    if nd.kind == "U" and nd.itemsize:
        return fixed_unicode_type(nd.itemsize // 4)
    if nd.kind == "T":
        return STRING
    if nd.kind in "mM":
        unit, scale = np.datetime_data(nd)
        return time_type(nd.kind, unit, scale)
    if nd.kind == "O" or dtype is str:
        return STRING if dtype is str else VLEN_BYTES
    if nd.kind == "V" and nd.fields is None and nd.names is None:
        for dt in DATA_TYPES.values():
            if dt.dtype == nd:
                return dt
        return _raw_type(nd.itemsize, f"r{nd.itemsize * 8}")
    nat = nd.newbyteorder("=") if nd.byteorder not in ("=", "|") else nd
    for dt in DATA_TYPES.values():
        if dt.dtype == nat:
            return dt
    raise MetadataError("dtype", str(dtype), "unsupported data type")


def v2_dtype_string(dt: DataType, byteorder: str = "<") -> str:
    """The v2 ``dtype`` string TensorStore writes for ``dt`` (``<f4``, ``|b1``, ``bfloat16``)."""
    if dt.v2_name is not None:
        return dt.v2_name
    nd = dt.dtype
    if dt.kind == "raw":
        return f"|V{nd.itemsize}"
    if dt.kind == "bytes":
        return f"|S{nd.itemsize}"
    if dt.kind == "datetime":
        return byteorder + nd.str[1:]
    if dt.kind == "unicode":
        return f"{byteorder}U{nd.itemsize // 4}"
    if dt.variable:
        return "|O"
    letter = {"bool": "b", "int": "i", "uint": "u", "float": "f", "complex": "c"}[dt.kind]
    order = "|" if nd.itemsize == 1 else byteorder
    return f"{order}{letter}{nd.itemsize}"


def native_order(stored: np.dtype[Any]) -> bool:
    """Whether ``stored`` already has the machine byte order (or is byte-order free)."""
    if stored.itemsize == 1 or stored.byteorder in ("=", "|"):
        return True
    return (stored.byteorder == "<") == _LITTLE
