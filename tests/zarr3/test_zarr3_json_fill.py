"""JSON output format, data types and fill values (no TensorStore needed).

Expected strings come from TensorStore 0.1.86 output recorded in
/work/shared/reference/orbax-layout.md and from probes of that version.
"""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from zarr3.dtypes import DATA_TYPES, data_type_from_numpy, parse_data_type_v3, parse_dtype_v2, v2_dtype_string
from zarr3.engine import json_text
from zarr3.errors import MetadataError
from zarr3.fill_value import (
    encode_fill_value_v2,
    encode_fill_value_v3,
    normalize_fill_value,
    parse_fill_value_v2,
    parse_fill_value_v3,
)


# -- JSON --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, text",
    [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (1.0, "1.0"),
        (100.0, "100.0"),
        (2.5, "2.5"),
        (0.1, "0.1"),
        (1e15, "1e+15"),  # nlohmann switches to exponent notation one decade before Python
        (1e16, "1e+16"),
        (999999999999999.9, "999999999999999.9"),
        (123456792.0, "123456792.0"),
        (1.2345678901234568e17, "1.2345678901234568e+17"),
        (0.0001, "0.0001"),
        (1e-05, "1e-05"),
        (1.2345e-05, "1.2345e-05"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (1e100, "1e+100"),
        (float(np.float32(0.1)), "0.10000000149011612"),
        (-3.5e-7, "-3.5e-07"),
    ],
)
def test_format_float_matches_nlohmann(value: float, text: str) -> None:
    assert json_text.format_float(value) == text
    assert float(text) == value


def test_format_float_round_trips_random_doubles() -> None:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**63, size=2000, dtype=np.uint64)
    for x in bits.view(np.float64):
        x = float(x)
        if math.isfinite(x):
            assert float(json_text.format_float(x)) == x


def test_format_float_rejects_non_finite() -> None:
    for x in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            json_text.format_float(x)


def test_dumps_sorted_compact_utf8() -> None:
    obj = {"z": 1, "a": [1, 2.0, None, True], "ü": "ö\x1f/", "m": {"b": 1, "a": 2}}
    assert json_text.dumps(obj) == '{"a":[1,2.0,null,true],"m":{"a":2,"b":1},"z":1,"ü":"ö\\u001f/"}'
    assert json.loads(json_text.dumps(obj)) == obj


def test_dumps_big_ints_and_numpy_scalars() -> None:
    assert json_text.dumps([2**64 - 1, -(2**63), np.int64(3), np.float32(0.5)]) == (
        "[18446744073709551615,-9223372036854775808,3,0.5]"
    )


def test_loads_rejects_nan_literal() -> None:
    with pytest.raises(ValueError):
        json_text.loads(b'{"a": NaN}')


# -- data types ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
        "float8_e3m4",
        "float8_e8m0fnu",
        "float4_e2m1fn",
        "int4",
        "int2",
        "uint4",
    ],
)
def test_v3_data_type_names(name: str) -> None:
    dt = parse_data_type_v3(name)
    assert dt.name == name
    assert data_type_from_numpy(dt.dtype) is dt
    assert parse_data_type_v3({"name": name}) is dt


def test_sub_byte_types_take_one_byte_each() -> None:
    for name in ("int4", "uint4", "int2", "float4_e2m1fn"):
        assert DATA_TYPES[name].itemsize == 1
    # TensorStore stores int4 [1, -2, 3, -4] as 01 0e 03 0c (orbax-layout.md §3)
    assert np.array([1, -2, 3, -4], dtype=ml_dtypes.int4).tobytes() == bytes.fromhex("010e030c")


def test_raw_data_type() -> None:
    dt = parse_data_type_v3("r16")
    assert dt.kind == "raw" and dt.itemsize == 2
    with pytest.raises(MetadataError):
        parse_data_type_v3("r12")


@pytest.mark.parametrize("bad", ["float128", "strings", 3, None, {"name": "int8", "configuration": {"x": 1}}])
def test_unknown_data_type_names_field(bad: object) -> None:
    with pytest.raises(MetadataError) as ei:
        parse_data_type_v3(bad)
    assert ei.value.field == "data_type"
    assert ei.value.value == bad


@pytest.mark.parametrize(
    "text, name, byteorder",
    [
        ("<f4", "float32", "<"),
        (">i2", "int16", ">"),
        ("|b1", "bool", "|"),
        ("|u1", "uint8", "|"),
        ("<c8", "complex64", "<"),
        (">c16", "complex128", ">"),
        ("bfloat16", "bfloat16", None),
        ("float8_e4m3fn", "float8_e4m3fn", None),
        ("int4", "int4", None),
    ],
)
def test_v2_dtype_strings(text: str, name: str, byteorder: str | None) -> None:
    dt, stored = parse_dtype_v2(text)
    assert dt.name == name
    if byteorder == ">":
        assert stored.byteorder == ">"
    else:
        assert stored.itemsize == 1 or stored.isnative


def test_v2_dtype_string_output() -> None:
    assert v2_dtype_string(DATA_TYPES["float32"]) == "<f4"
    assert v2_dtype_string(DATA_TYPES["int8"]) == "|i1"
    assert v2_dtype_string(DATA_TYPES["bool"]) == "|b1"
    assert v2_dtype_string(DATA_TYPES["bfloat16"]) == "bfloat16"
    assert v2_dtype_string(DATA_TYPES["int16"], ">") == ">i2"
    assert v2_dtype_string(DATA_TYPES["complex64"]) == "<c8"


@pytest.mark.parametrize(
    "bad", ["<U0", "<M8[xs]", "|S0", [["a", "<f4"], ["a", "<i4"]], [["a", [["b", "<i4"]]]], "<f3", 7]
)
def test_v2_unsupported_dtypes(bad: object) -> None:
    with pytest.raises(MetadataError) as ei:
        parse_dtype_v2(bad)
    assert ei.value.field.startswith("dtype")


# -- fill values v3 -------------------------------------------------------------------------
def _bits(arr: np.ndarray) -> int:
    return int(arr.reshape(1).view(f"u{arr.dtype.itemsize}")[0])


@pytest.mark.parametrize(
    "name, json_in, bits",
    [
        ("float32", "NaN", 0x7FC00000),
        ("float32", "0x7fc00001", 0x7FC00001),
        ("float32", "0xffc00000", 0xFFC00000),
        ("float32", "Infinity", 0x7F800000),
        ("float32", "-Infinity", 0xFF800000),
        ("float32", -0.0, 0x80000000),
        ("float32", 2, 0x40000000),
        ("bfloat16", "NaN", 0x7FC0),
        ("bfloat16", "0x7fe0", 0x7FE0),
        ("bfloat16", 1.5, 0x3FC0),
        ("float16", "0x7fe0", 0x7FE0),
        ("float64", "NaN", 0x7FF8000000000000),
        ("float8_e4m3fn", "NaN", 0x7F),
        ("float8_e5m2", "Infinity", 0x7C),
        # TensorStore 0.1.86 maps e8m0fnu fill JSON with an exponent bias of 63 (probed)
        ("float8_e8m0fnu", 0.0, 0x00),
        ("float8_e8m0fnu", 1.0, 0x3F),
        ("float8_e8m0fnu", 1.45, 0x3F),
        ("float8_e8m0fnu", 1.5, 0x40),
        ("float8_e8m0fnu", 3.0, 0x41),
        ("float8_e8m0fnu", -1.0, 0x3F),
        ("float8_e8m0fnu", -(2.0**65), 0x80),
        ("float8_e8m0fnu", "Infinity", 0xFF),
    ],
)
def test_parse_float_fill_values(name: str, json_in: object, bits: int) -> None:
    dt = DATA_TYPES[name]
    assert _bits(parse_fill_value_v3(json_in, dt)) == bits


@pytest.mark.parametrize(
    "name, bits, json_out",
    [
        ("float32", 0x7FC00000, "NaN"),
        ("float32", 0x7FC00001, "0x7fc00001"),  # non-canonical NaN keeps its payload
        ("float32", 0xFFC00000, "0xffc00000"),
        ("float32", 0x7F800000, "Infinity"),
        ("float32", 0xFF800000, "-Infinity"),
        ("float32", 0x3DCCCCCD, 0.10000000149011612),  # f32 widened to double, as TensorStore
        ("float32", 0x80000000, -0.0),
        ("bfloat16", 0x7FC0, "NaN"),
        ("bfloat16", 0x7FE0, "0x7fe0"),
        ("float16", 0x7E00, "NaN"),
        ("float8_e4m3fn", 0x7F, "NaN"),
        ("float8_e8m0fnu", 0x00, 0.0),
        ("float8_e8m0fnu", 0x3F, 1.0),
        ("float8_e8m0fnu", 0x01, 2.168404344971009e-19),
        ("float8_e8m0fnu", 0x81, -7.378697629483821e19),
        ("float8_e8m0fnu", 0xFF, "NaN"),
    ],
)
def test_encode_float_fill_values(name: str, bits: int, json_out: object) -> None:
    dt = DATA_TYPES[name]
    value = np.array(bits, dtype=dt.bits_dtype).view(dt.dtype).reshape(())
    assert encode_fill_value_v3(value, dt) == json_out
    back = parse_fill_value_v3(json_out, dt)
    assert _bits(back) == bits


def test_complex_and_int_fill_values() -> None:
    c64 = DATA_TYPES["complex64"]
    v = parse_fill_value_v3(["NaN", 1.0], c64)
    assert np.isnan(v.real) and v.imag == 1.0
    assert encode_fill_value_v3(v, c64) == ["NaN", 1.0]
    assert encode_fill_value_v3(np.zeros((), np.complex64), c64) == [0.0, 0.0]
    u64 = DATA_TYPES["uint64"]
    assert encode_fill_value_v3(parse_fill_value_v3(2**64 - 1, u64), u64) == 2**64 - 1
    i4 = DATA_TYPES["int4"]
    assert int(parse_fill_value_v3(-8, i4).astype(np.int8)) == -8
    assert encode_fill_value_v3(parse_fill_value_v3(True, DATA_TYPES["bool"]), DATA_TYPES["bool"]) is True


@pytest.mark.parametrize(
    "name, bad",
    [
        ("int8", 128),
        ("int8", "NaN"),
        ("int8", True),
        ("uint8", -1),
        ("int4", 8),
        ("bool", 2),
        ("bool", "NaN"),
        ("float32", "nan"),
        ("float32", "0x1ffffffff"),
        ("float32", [1.0]),
        ("float8_e4m3fn", "0x7fe0"),
        ("complex64", "0x00000000"),
        ("complex64", [1.0]),
        ("r16", [1, 2, 3]),
        ("float32", None),
    ],
)
def test_bad_fill_values_name_field(name: str, bad: object) -> None:
    dt = parse_data_type_v3(name)
    with pytest.raises(MetadataError) as ei:
        parse_fill_value_v3(bad, dt)
    assert ei.value.field.startswith("fill_value")


def test_raw_fill_value() -> None:
    dt = parse_data_type_v3("r16")
    v = parse_fill_value_v3([1, 255], dt)
    assert v.tobytes() == b"\x01\xff"
    assert encode_fill_value_v3(v, dt) == [1, 255]


# -- fill values v2 -------------------------------------------------------------------------
def test_v2_fill_values() -> None:
    f4, st = parse_dtype_v2("<f4")
    assert parse_fill_value_v2(None, f4, st) is None
    assert np.isnan(parse_fill_value_v2("NaN", f4, st))
    assert parse_fill_value_v2("-Infinity", f4, st) == -np.inf
    assert encode_fill_value_v2(np.array(np.nan, np.float32), f4, st) == "NaN"
    assert encode_fill_value_v2(np.array(1.5, np.float32), f4, st) == 1.5
    assert encode_fill_value_v2(None, f4, st) is None
    c8, st = parse_dtype_v2("<c8")
    assert parse_fill_value_v2([1.0, 2.0], c8, st) == 1 + 2j
    assert parse_fill_value_v2("AACAPwAAAEA=", c8, st) == 1 + 2j  # base64 of the bytes
    b1, st = parse_dtype_v2("|b1")
    assert parse_fill_value_v2(True, b1, st) is not None
    f4e2, st = parse_dtype_v2("float4_e2m1fn")
    # TensorStore writes float4 v2 fill values as base64 ("CA==" is -0.0)
    assert parse_fill_value_v2("CA==", f4e2, st).view(np.uint8) == 8
    assert encode_fill_value_v2(np.array(8, np.uint8).view(f4e2.dtype), f4e2, st) == "CA=="
    i2, st = parse_dtype_v2(">i2")
    with pytest.raises(MetadataError):
        parse_fill_value_v2("NaN", i2, st)
    with pytest.raises(MetadataError):
        parse_fill_value_v2("AAAA!", c8, parse_dtype_v2("<c8")[1])


def test_normalize_user_fill_values() -> None:
    f4 = DATA_TYPES["float32"]
    assert np.isnan(normalize_fill_value(float("nan"), f4))
    assert normalize_fill_value(np.float64(2.5), f4) == 2.5
    assert normalize_fill_value("Infinity", f4) == np.inf
    assert normalize_fill_value(1 + 2j, DATA_TYPES["complex128"]) == 1 + 2j
    assert normalize_fill_value(1, DATA_TYPES["bool"]) == np.True_
    # user values keep their meaning even where TensorStore's JSON mapping is odd
    assert normalize_fill_value(1.0, DATA_TYPES["float8_e8m0fnu"]).view(np.uint8) == 0x7F
    with pytest.raises(MetadataError):
        normalize_fill_value("abc", f4)
