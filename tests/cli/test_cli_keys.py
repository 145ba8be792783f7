"""Key escaping used by the command-line tool."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ocdbt_py.keys import escape_key, parse_hex_key, unescape_key


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        (b"params/w", "params/w"),
        (b"a b", "a b"),
        ("caf\u00e9".encode(), "caf\u00e9"),
        (b"\xff\xfe", "\\xff\\xfe"),
        (b"back\\slash", "back\\\\slash"),
        (b"nl\n", "nl\\x0a"),
        (b"\x00", "\\x00"),
        ("\u00a0".encode(), "\\xc2\\xa0"),  # a non-printable (non-ASCII space) character
        (b"\xed\xa0\x80", "\\xed\\xa0\\x80"),  # an encoded surrogate is not valid UTF-8
        (b"", ""),
    ],
)
def test_escape_examples(key: bytes, shown: str) -> None:
    assert escape_key(key) == shown
    assert unescape_key(shown) == key


@given(st.binary(max_size=64))
def test_escape_round_trips(key: bytes) -> None:
    shown = escape_key(key)
    assert shown.isprintable()
    assert unescape_key(shown) == key


@pytest.mark.parametrize("bad", ["a\\", "\\q", "\\x4", "\\xzz"])
def test_unescape_rejects_bad_escapes(bad: str) -> None:
    with pytest.raises(ValueError):
        unescape_key(bad)


def test_parse_hex_key() -> None:
    assert parse_hex_key("61ff00") == b"a\xff\x00"
    assert parse_hex_key("0x61:62 63") == b"abc"
    assert parse_hex_key("") == b""
    with pytest.raises(ValueError):
        parse_hex_key("6")
    with pytest.raises(ValueError):
        parse_hex_key("zz")


@given(st.binary(max_size=64))
def test_ascii_only_escape_round_trips(key: bytes) -> None:
    shown = escape_key(key, ascii_only=True)
    assert shown.isascii() and shown.isprintable()
    assert unescape_key(shown) == key


def test_ascii_only_escapes_utf8_bytewise() -> None:
    assert escape_key("caf\u00e9".encode(), ascii_only=True) == "caf\\xc3\\xa9"
