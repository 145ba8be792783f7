"""Conversions between commit times (integer nanoseconds since the epoch) and user input."""

from __future__ import annotations

import datetime as _dt
import re

__all__ = ["to_nanoseconds", "format_nanoseconds"]

_ISO = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(Z|z|[+-]\d{2}:?\d{2})?$"
)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def to_nanoseconds(when: str | _dt.datetime) -> int:
    """Nanoseconds since the Unix epoch for an ISO-8601 string or a ``datetime``.

    Strings keep full nanosecond precision; a time without a zone, string or ``datetime``,
    is taken as UTC.
    """
    if isinstance(when, _dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.timezone.utc)
        delta = when - _EPOCH
        return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
    if not isinstance(when, str):
        raise TypeError(f"expected an ISO-8601 string or datetime, got {type(when).__name__}")
    m = _ISO.match(when.strip())
    if not m:
        raise ValueError(f"not an ISO-8601 time: {when!r}")
    y, mo, d, h, mi, s, frac, tz = m.groups()
    base = _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=_dt.timezone.utc)
    ns = to_nanoseconds(base)
    if frac:
        ns += int(frac.ljust(9, "0"))
    if tz and tz not in ("Z", "z"):
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        ns -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60) * 1_000_000_000
    return ns


def format_nanoseconds(ns: int) -> str:
    """ISO-8601 UTC rendering with nanoseconds, e.g. ``2026-11-22T05:18:46.457543081Z``."""
    secs, frac = divmod(ns, 1_000_000_000)
    t = _EPOCH + _dt.timedelta(seconds=secs)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"
