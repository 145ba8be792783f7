"""Fill values: JSON <-> NumPy, for Zarr v3 and v2, matching TensorStore.

A fill value is held as a 0-d NumPy array of the array's native dtype, so NaN payloads and
signed zeros survive exactly.  v3 JSON forms: numbers, ``true``/``false``, ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, ``"0x..."`` bit patterns, ``[re, im]`` for complex and byte
lists for ``r<N>``.  TensorStore writes ``"NaN"`` only for the type's canonical NaN and the hex
bit pattern for any other NaN (bfloat16 NaN from a double comes out as ``"0x7fe0"``).
v2 adds ``null`` (no fill value; missing chunks read as zeros) and base64 for raw types.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import ml_dtypes
import numpy as np

from zarr3.dtypes import DataType
from zarr3.errors import MetadataError

__all__ = [
    "parse_fill_value_v3",
    "encode_fill_value_v3",
    "parse_fill_value_v2",
    "encode_fill_value_v2",
    "default_fill_value",
    "normalize_fill_value",
    "fill_bytes",
]

_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def default_fill_value(dt: DataType) -> np.ndarray:
    """The zero value of ``dt`` (TensorStore's default fill value); zarr-python's defaults for the
    types TensorStore lacks: ``""`` / ``b""`` / ``None`` for strings and objects, NaT for times."""
    if dt.kind in ("vbytes", "object"):
        out = np.empty((), dtype=object)
        out[()] = b"" if dt.kind == "vbytes" else None
        return out
    if dt.kind == "datetime":  # zarr-python's default: NaT
        return np.array("NaT", dtype=dt.dtype)
    return np.zeros((), dtype=dt.dtype)


def _bits_to_value(bits: int, dt: DataType) -> np.ndarray:
    return np.array(bits, dtype=dt.bits_dtype).view(dt.dtype).reshape(())


def _float_from_json(value: Any, dt: DataType, field: str) -> np.ndarray:
    """Parse one float (or complex component) JSON value for float type ``dt``."""
    if isinstance(value, bool):
        raise MetadataError(field, value, f"expected a number for {dt.name}")
    if isinstance(value, (int, float)):
        if dt.name == "float8_e8m0fnu":
            return _bits_to_value(_e8m0_bits_from_json(float(value)), dt)
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                return np.array(float(value)).astype(dt.dtype)
        except OverflowError as e:
            raise MetadataError(field, value, f"out of range for {dt.name}") from e
    if isinstance(value, str):
        if value in _SPECIAL:
            with np.errstate(over="ignore", invalid="ignore"):
                return np.array(_SPECIAL[value]).astype(dt.dtype)
        if value[:2] in ("0x", "0X") and len(value) > 2:
            try:
                bits = int(value[2:], 16)
            except ValueError as e:
                raise MetadataError(field, value, "invalid hex fill value") from e
            if bits >= 1 << (8 * dt.itemsize):
                raise MetadataError(field, value, f"hex fill value too wide for {dt.name}")
            return _bits_to_value(bits, dt)
    raise MetadataError(field, value, f'expected a number, "NaN", "Infinity", "-Infinity" or "0x..." for {dt.name}')


# TensorStore 0.1.86 converts float8_e8m0fnu fill values to and from JSON numbers with an
# exponent bias of 63 (bits b <-> 2**(b - 63), negative from b = 0x80 on, 0 <-> 0x00), unlike
# the data itself (bias 127).  Metadata is interpreted the way TensorStore does, so missing
# chunks read back with the same bits in both.
def _e8m0_bits_from_json(x: float) -> int:
    if math.isnan(x) or math.isinf(x):
        return 0xFF
    x = abs(x)
    if x == 0.0:
        return 0
    m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
    exp = e if 2 * m >= 1.5 else e - 1
    return min(max(exp + 63, 0), 0xFF)


def _e8m0_bits_to_json(bits: int) -> Any:
    if bits == 0xFF:
        return "NaN"
    if bits == 0:
        return 0.0
    value = math.ldexp(1.0, bits - 63)
    return -value if bits >= 0x80 else value


def _int_from_json(value: Any, dt: DataType, field: str, *, allow_bool: bool = False) -> np.ndarray:
    if isinstance(value, bool) and not allow_bool:
        raise MetadataError(field, value, f"expected an integer for {dt.name}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise MetadataError(field, value, f"expected an integer for {dt.name}")
    info_min, info_max = _int_range(dt)
    if not info_min <= int(value) <= info_max:
        raise MetadataError(field, value, f"out of range for {dt.name} [{info_min}, {info_max}]")
    return np.array(int(value)).astype(dt.dtype)


def _int_range(dt: DataType) -> tuple[int, int]:
    try:
        info = np.iinfo(dt.dtype)
        return int(info.min), int(info.max)
    except ValueError:
        mi = ml_dtypes.iinfo(dt.dtype)
        return int(mi.min), int(mi.max)


def parse_fill_value_v3(value: Any, dt: DataType, field: str = "fill_value") -> np.ndarray:
    """Parse a v3 ``fill_value`` for data type ``dt`` into a 0-d array."""
    kind = dt.kind
    if value is None:
        raise MetadataError(field, value, "fill_value is required in zarr v3")
    if kind == "bool":
        # zarr-python writes 0/1 for bool in some versions
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
            value = bool(value)
        if not isinstance(value, bool):
            raise MetadataError(field, value, "expected true or false")
        return np.array(value, dtype=np.bool_)
    if kind in ("int", "uint"):
        return _int_from_json(value, dt, field)
    if kind == "float":
        return _float_from_json(value, dt, field)
    if kind in _TEXT_KINDS or (kind == "raw" and isinstance(value, str)):
        return _parse_text_fill(value, dt, field)
    if kind == "struct" and isinstance(value, str):  # zarr-python 3: base64 of the record
        return np.frombuffer(_b64_padded(value, dt.itemsize, field), dtype=dt.dtype).reshape(())
    if kind == "datetime":
        return _parse_time_fill(value, dt, field)
    if kind == "complex":
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise MetadataError(field, value, f"expected [real, imag] for {dt.name}")
        comp = dt.component
        re_ = _float_from_json(value[0], comp, f"{field}[0]")
        im_ = _float_from_json(value[1], comp, f"{field}[1]")
        out = np.zeros((), dtype=dt.dtype)
        parts = out.reshape(1).view(comp.dtype)
        parts[0] = re_
        parts[1] = im_
        return out
    # raw r<N>: list of byte values
    if (
        not isinstance(value, (list, tuple))
        or len(value) != dt.itemsize
        or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in value)
    ):
        raise MetadataError(field, value, f"expected {dt.itemsize} byte values for {dt.name}")
    return np.frombuffer(bytes(value), dtype=dt.dtype).reshape(())


_TEXT_KINDS = ("bytes", "unicode", "string", "vbytes", "object")


def _b64_padded(value: str, nbytes: int | None, field: str) -> bytes:
    """Decode base64 as zarr-python writes it: padding may be missing, and a fixed-size value
    shorter than the element is padded with zero bytes (``""`` is all zeros)."""
    text = value.strip()
    try:
        raw = base64.b64decode((text + "=" * (-len(text) % 4)).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise MetadataError(field, value, "invalid base64 fill value") from e
    if nbytes is not None:
        if len(raw) > nbytes:
            raise MetadataError(field, value, f"expected at most {nbytes} base64-encoded bytes")
        raw = raw.ljust(nbytes, b"\0")
    return raw


def _parse_text_fill(value: Any, dt: DataType, field: str, *, truncate: bool = False) -> np.ndarray:
    """Fill values of string, bytes and raw types (v2 and v3 forms are the same, except that
    ``truncate`` (v2) cuts a fixed-width text fill value longer than the element to its width,
    as zarr-python's ``np.array(value, dtype)`` does; v3 refuses it)."""
    kind = dt.kind
    if kind == "object":  # json2 object arrays: any JSON value
        out = np.empty((), dtype=object)
        out[()] = value
        return out
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        value = ""  # zarr-python 2 writes 0 / null for "empty"
    if not isinstance(value, str):
        raise MetadataError(field, value, f"expected a string for {dt.name}")
    if kind in ("unicode", "string"):
        if kind == "unicode" and len(value) > dt.itemsize // 4 and not truncate:
            raise MetadataError(field, value, f"longer than {dt.itemsize // 4} characters")
        return np.array(value, dtype=dt.dtype)
    nbytes = None if kind == "vbytes" else dt.itemsize
    raw = _b64_padded(value, nbytes, field)
    if kind == "vbytes":
        out = np.empty((), dtype=object)
        out[()] = raw
        return out
    return np.frombuffer(raw, dtype=dt.dtype).reshape(())


def _parse_time_fill(value: Any, dt: DataType, field: str) -> np.ndarray:
    """datetime64/timedelta64: the int64 count zarr-python writes (``-2**63`` is NaT)."""
    if value == "NaT":
        return np.array("NaT", dtype=dt.dtype)
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < 1 << 63:
        raise MetadataError(field, value, f"expected an int64 count for {dt.name}")
    return np.array(value, dtype=np.int64).view(dt.dtype).reshape(())


def _encode_text_fill(v: np.ndarray, dt: DataType) -> Any:
    if dt.kind == "object":
        return v[()]
    if dt.kind in ("unicode", "string"):
        return str(v[()])
    raw = v[()] if dt.kind == "vbytes" else v.tobytes()
    return base64.b64encode(bytes(raw)).decode("ascii")


def _canonical_nan_bits(dt: DataType) -> int | None:
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.array(math.nan).astype(dt.dtype)
    if not np.isnan(v.astype(np.float64)):
        return None
    return int(v.view(dt.bits_dtype))


def _encode_float(v: np.ndarray, dt: DataType) -> Any:
    if dt.name == "float8_e8m0fnu":
        return _e8m0_bits_to_json(int(v.reshape(()).view(dt.bits_dtype)))
    as64 = float(v.astype(np.float64))
    if math.isnan(as64):
        bits = int(v.reshape(()).view(dt.bits_dtype))
        if bits == _canonical_nan_bits(dt):
            return "NaN"
        return f"0x{bits:0{2 * dt.itemsize}x}"
    if math.isinf(as64):
        return "Infinity" if as64 > 0 else "-Infinity"
    return as64


def encode_fill_value_v3(value: np.ndarray, dt: DataType) -> Any:
    """The JSON TensorStore writes for fill value ``value`` (a 0-d array of ``dt``)."""
    v = np.asarray(value, dtype=dt.dtype).reshape(())
    if dt.kind == "bool":
        return bool(v)
    if dt.kind in ("int", "uint"):
        return int(v.astype(np.int64 if dt.kind == "int" else np.uint64))
    if dt.kind == "float":
        return _encode_float(v, dt)
    if dt.kind in _TEXT_KINDS or dt.name == "raw_bytes":
        return _encode_text_fill(v, dt)
    if dt.kind == "datetime":
        return int(v.view(np.int64))
    if dt.kind == "struct":
        return base64.b64encode(v.tobytes()).decode("ascii")
    if dt.kind == "complex":
        comp = dt.component
        parts = v.reshape(1).view(comp.dtype)
        return [_encode_float(parts[0:1].reshape(()), comp), _encode_float(parts[1:2].reshape(()), comp)]
    return list(v.tobytes())


def _from_base64(value: str, dt: DataType, stored: np.dtype[Any], field: str) -> np.ndarray:
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise MetadataError(field, value, "invalid base64 fill value") from e
    if len(raw) != stored.itemsize:
        raise MetadataError(field, value, f"expected {stored.itemsize} base64-encoded bytes")
    return np.frombuffer(raw, dtype=stored).astype(dt.dtype).reshape(())


def parse_fill_value_v2(
    value: Any, dt: DataType, stored: np.dtype[Any], field: str = "fill_value"
) -> np.ndarray | None:
    """Parse a v2 ``fill_value``; ``None`` (JSON null) means "no fill value"."""
    kind = dt.kind
    if value is None and kind not in ("string", "vbytes", "object"):
        return None
    if kind in _TEXT_KINDS:
        return _parse_text_fill(value, dt, field, truncate=True)
    if kind == "datetime":
        return _parse_time_fill(value, dt, field)
    if kind == "raw" and isinstance(value, str):
        return np.frombuffer(_b64_padded(value, stored.itemsize, field), dtype=stored).astype(dt.dtype).reshape(())
    if kind == "bool":
        if isinstance(value, bool):
            return np.array(value, dtype=np.bool_)
        if isinstance(value, int) and value in (0, 1):
            return np.array(bool(value), dtype=np.bool_)
        raise MetadataError(field, value, "expected true or false")
    if kind in ("int", "uint"):
        return _int_from_json(value, dt, field)
    if kind == "float":
        if isinstance(value, str) and value not in _SPECIAL and not value.startswith("0x"):
            return _from_base64(value, dt, stored, field)
        return _float_from_json(value, dt, field)
    if kind == "complex":
        if isinstance(value, str):
            return _from_base64(value, dt, stored, field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value, 0.0]
        return parse_fill_value_v3(value, dt, field)
    if isinstance(value, str):
        return _from_base64(value, dt, stored, field)
    if isinstance(value, int) and value == 0:
        return np.zeros((), dtype=dt.dtype)
    raise MetadataError(field, value, "expected a base64 string for a raw data type")


def encode_fill_value_v2(value: np.ndarray | None, dt: DataType, stored: np.dtype[Any]) -> Any:
    """The JSON TensorStore's ``zarr`` driver writes for a v2 fill value."""
    if value is None:
        return None
    v = np.asarray(value, dtype=dt.dtype).reshape(())
    if dt.kind in _TEXT_KINDS:
        return _encode_text_fill(v, dt)
    if dt.kind == "datetime":
        return int(v.view(np.int64))
    if dt.kind == "bool":
        return bool(v)
    if dt.kind in ("int", "uint"):
        return int(v.astype(np.int64 if dt.kind == "int" else np.uint64))
    if dt.kind == "float":
        if dt.name == "float4_e2m1fn":  # TensorStore writes this one as base64
            return base64.b64encode(v.astype(stored).tobytes()).decode("ascii")
        as64 = float(v.astype(np.float64))
        if math.isnan(as64):
            return "NaN"
        if math.isinf(as64):
            return "Infinity" if as64 > 0 else "-Infinity"
        return as64
    if dt.kind == "complex":
        out: list[Any] = []
        for part in (float(v.real), float(v.imag)):
            if math.isnan(part):
                out.append("NaN")
            elif math.isinf(part):
                out.append("Infinity" if part > 0 else "-Infinity")
            else:
                out.append(part)
        return out
    return base64.b64encode(v.astype(stored).tobytes()).decode("ascii")


def normalize_fill_value(value: Any, dt: DataType, field: str = "fill_value") -> np.ndarray:
    """Turn a user-supplied fill value (number, string, NumPy scalar) into a 0-d array."""
    if isinstance(value, np.ndarray) and value.shape == () or isinstance(value, np.generic):
        arr = np.asarray(value)
        if arr.dtype == dt.dtype:
            return arr.reshape(()).copy()
        if dt.kind == "raw":
            return parse_fill_value_v3(list(arr.tobytes()), dt, field)
        with np.errstate(over="ignore", invalid="ignore"):
            return arr.astype(dt.dtype).reshape(())
    if isinstance(value, bytes) and dt.kind == "raw":
        return parse_fill_value_v3(list(value), dt, field)
    if dt.kind == "datetime" and isinstance(value, int) and not isinstance(value, bool):
        return _parse_time_fill(value, dt, field)
    if dt.kind in _TEXT_KINDS or dt.kind == "datetime":
        out = np.empty((), dtype=dt.dtype)
        out[()] = ("" if dt.kind != "vbytes" else b"") if value is None else value
        return out
    if isinstance(value, complex) and dt.kind == "complex":
        return np.array(value, dtype=dt.dtype)
    if dt.kind == "complex" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return np.array(complex(value), dtype=dt.dtype)
    if dt.kind == "bool" and isinstance(value, (int, np.integer)) and value in (0, 1):
        value = bool(value)
    if dt.name == "float8_e8m0fnu" and isinstance(value, (int, float)) and not isinstance(value, bool):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.array(float(value)).astype(dt.dtype)
    return parse_fill_value_v3(value, dt, field)


def fill_bytes(value: np.ndarray | None, dt: DataType) -> bytes:
    """Raw bytes of one element of the fill value (zeros for "no fill value")."""
    if value is None:
        return bytes(dt.itemsize)
    return np.asarray(value, dtype=dt.dtype).tobytes()
