"""Compact JSON output byte-identical to TensorStore's (nlohmann::json) ``dump()``.

Keys are sorted (by code point, which equals UTF-8 byte order), there is no whitespace,
non-ASCII text is written as raw UTF-8, and doubles use nlohmann's format: the shortest
round-trip digits, in exponent notation below 1e-4 and from 1e15 up (Python switches at 1e16).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["dumps", "format_float", "loads"]

_str = json.JSONEncoder(ensure_ascii=False).encode


def format_float(x: float) -> str:
    """Format a finite double the way nlohmann::json does."""
    if not math.isfinite(x):
        raise ValueError(f"{x!r} is not JSON-compliant")
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    r = repr(abs(x))
    sign = "-" if x < 0 else ""
    mant, _, exp_s = r.partition("e")
    exp = int(exp_s) if exp_s else 0
    int_part, _, frac = mant.partition(".")
    digits = (int_part + frac).lstrip("0")
    # position of the decimal point relative to the start of `digits`
    lead_zeros = len(int_part + frac) - len((int_part + frac).lstrip("0"))
    n = len(int_part) + exp - lead_zeros
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 15:
        body = digits + "0" * (n - k) + ".0"
    elif 0 < n <= 15:
        body = digits[:n] + "." + digits[n:]
    elif -4 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        m = digits[0] + ("." + digits[1:] if k > 1 else "")
        body = f"{m}e{'+' if e >= 0 else '-'}{abs(e):02d}"
    return sign + body


def _dump(obj: Any, out: list[str]) -> None:
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, str):
        out.append(_str(obj))
    elif isinstance(obj, int):
        out.append(str(int(obj)))
    elif isinstance(obj, float):
        out.append(format_float(obj))
    elif isinstance(obj, Mapping):
        out.append("{")
        first = True
        for key in sorted(obj):
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be str, not {type(key).__name__}")
            if not first:
                out.append(",")
            first = False
            out.append(_str(key))
            out.append(":")
            _dump(obj[key], out)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, item in enumerate(obj):
            if i:
                out.append(",")
            _dump(item, out)
        out.append("]")
    else:
        # numpy scalars and the like
        item = getattr(obj, "item", None)
        if item is not None:
            _dump(item(), out)
        else:
            raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps(obj: Any) -> str:
    """Serialize ``obj`` as compact, key-sorted JSON (TensorStore's byte layout)."""
    out: list[str] = []
    _dump(obj, out)
    return "".join(out)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


#: Deepest nesting of arrays/objects accepted in a metadata document.
MAX_DEPTH = 128
#: Longest integer literal accepted (uint64 needs 20 digits): longer ones are refused before
#: Python converts them (whose own limit raises a bare ``ValueError`` at 4300 digits).
MAX_INT_DIGITS = 64


def bounded_int(text: str) -> int:
    """``int(text)`` for a JSON integer literal of at most :data:`MAX_INT_DIGITS` digits."""
    if len(text) > MAX_INT_DIGITS + 1:
        raise ValueError(f"integer literal of {len(text)} characters (limit {MAX_INT_DIGITS} digits)")
    return int(text)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def nesting_exceeds(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON ``text`` nests arrays/objects deeper than ``limit``, judged on the text
    before it is parsed (vectorised: a running count of brackets outside strings)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    if '\\"' in text:  # rare: strings holding escaped quotes; drop every string first
        text = _STRING.sub('""', text)
    b = np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8)
    inside = np.bitwise_xor.accumulate((b == 34).view(np.uint8))  # '"' toggles: 1 inside a string
    opens = (b == 91) | (b == 123)  # '[' '{'
    brackets = (opens | (b == 93) | (b == 125)) & (inside == 0)  # ... and ']' '}', outside strings
    steps = opens[brackets].astype(np.int8) * 2 - 1  # +1 opens, -1 closes
    return bool(np.cumsum(steps, dtype=np.int32).max(initial=0) > limit)


def parse(text: str, *, allow_nan: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` with bounded nesting and integer literals; ``ValueError`` on bad input
    (a document too deep for the parser's stack included)."""
    kw: dict[str, Any] = {} if allow_nan else {"parse_constant": _reject_constant}
    if nesting_exceeds(text, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_int=bounded_int, **kw)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply") from e


def loads(data: bytes | str, *, allow_constants: bool = False) -> Any:
    """Parse strict JSON (no NaN/Infinity literals); raises ``ValueError`` on bad input,
    including nesting deeper than :data:`MAX_DEPTH` and integers longer than
    :data:`MAX_INT_DIGITS` digits.

    ``allow_constants`` accepts the ``NaN``/``Infinity``/``-Infinity`` literals Python's
    ``json`` writes by default (zarr-python's attributes), read as floats.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8")
    return parse(data, allow_nan=allow_constants)
