"""How the command-line tool shows keys and reads them back.

OCDBT keys are arbitrary bytes.  They are shown as text: every printable character of valid
UTF-8 stands for itself, a backslash is doubled (``\\\\``), and every other byte (bytes that
are not valid UTF-8, control characters, other non-printable characters) is written ``\\xNN``
with two lowercase hex digits, one escape per byte.  :func:`unescape_key` inverts
:func:`escape_key` exactly, and ``ls --json`` also gives each key as hex (``key_hex``), which
``get --hex`` accepts.  When stdout cannot show UTF-8, non-ASCII characters are escaped
byte by byte as well (:func:`set_ascii_only`), which reads back the same way.
"""

from __future__ import annotations

__all__ = ["escape_key", "unescape_key", "parse_hex_key", "set_ascii_only"]

_ascii_only = False


def set_ascii_only(flag: bool) -> None:
    """Make :func:`escape_key` escape every non-ASCII byte too (for terminals that are not
    UTF-8; still round-trippable: ``\\xNN`` always means one byte)."""
    global _ascii_only
    _ascii_only = flag


def escape_key(key: bytes, *, ascii_only: bool | None = None) -> str:
    """Printable, round-trippable text for ``key`` (see the module docstring)."""
    if ascii_only is None:
        ascii_only = _ascii_only
    try:
        s = key.decode("ascii" if ascii_only else "utf-8")
    except UnicodeDecodeError:
        pass
    else:
        if s.isprintable() and "\\" not in s:
            return s
    out: list[str] = []
    for c in key.decode("utf-8", "surrogateescape"):
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:  # an undecodable byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif c == "\\":
            out.append("\\\\")
        elif c.isprintable() and not (ascii_only and o > 0x7F):
            out.append(c)
        else:
            out.extend(f"\\x{b:02x}" for b in c.encode("utf-8"))
    return "".join(out)


def unescape_key(text: str) -> bytes:
    """The key that :func:`escape_key` shows as ``text``.

    Raises ``ValueError`` for a lone backslash or a bad ``\\x`` escape.
    """
    if "\\" not in text:
        return text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    n = len(text)
    while i < n:
        j = text.find("\\", i)
        if j < 0:
            out += text[i:].encode("utf-8", "surrogateescape")
            break
        out += text[i:j].encode("utf-8", "surrogateescape")
        nxt = text[j + 1 : j + 2]
        if nxt == "\\":
            out.append(0x5C)
            i = j + 2
        elif nxt == "x":
            digits = text[j + 2 : j + 4]
            if len(digits) != 2 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError(f"bad escape {text[j:j + 4]!r} at position {j}: expected \\xNN")
            out.append(int(digits, 16))
            i = j + 4
        else:
            raise ValueError(f"bad escape {text[j:j + 2]!r} at position {j}: use \\\\ or \\xNN")
    return bytes(out)


def parse_hex_key(text: str) -> bytes:
    """Bytes from hex digits (spaces, ``:`` and a leading ``0x`` allowed); ``ValueError`` if bad."""
    t = text.strip()
    if t[:2].lower() == "0x":
        t = t[2:]
    t = t.replace(" ", "").replace(":", "")
    try:
        return bytes.fromhex(t)
    except ValueError:
        raise ValueError(f"not a hex string: {text!r}") from None
