"""Writing command output: JSON documents, aligned text tables, sizes and locations."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from ocdbt_py.cli.errors import CliError
from ocdbt_py.keys import escape_key
from ocdbt_py.units import human_bytes

if TYPE_CHECKING:
    from ocdbt_py.format.data_file_table import IndirectDataReference

__all__ = [
    "out",
    "print_json",
    "print_table",
    "human_bytes",
    "ref_json",
    "ref_text",
    "key_json",
    "check_overwrite",
]


def out() -> IO[str]:
    """The current ``sys.stdout`` (looked up each time so redirection and capture work)."""
    return sys.stdout


def print_json(obj: Any) -> None:
    """One indented JSON document (ASCII only, so any terminal encoding copes)."""
    stream = out()
    json.dump(obj, stream, indent=2, ensure_ascii=True)
    stream.write("\n")


def print_table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[bool]) -> None:
    """Columns aligned (numbers ``right``-aligned), the last column left free."""
    rows = [list(r) for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    stream = out()
    for r in [list(headers), *rows]:
        cells = []
        for i, cell in enumerate(r):
            last = i == len(r) - 1
            if right[i]:
                cells.append(cell.rjust(widths[i]))
            else:
                cells.append(cell if last else cell.ljust(widths[i]))
        stream.write("  ".join(cells).rstrip() + "\n")


def ref_text(ref: IndirectDataReference) -> str:
    """``file:offset`` of an out-of-line value or node (the file path escaped like keys)."""
    return f"{escape_key(ref.file.path)}:{ref.offset}"


def ref_json(ref: IndirectDataReference | None) -> dict[str, Any] | None:
    """``{"file", "offset", "length"}`` or ``None``."""
    if ref is None:
        return None
    return {"file": escape_key(ref.file.path, ascii_only=False), "offset": ref.offset, "length": ref.length}


def key_json(key: bytes) -> dict[str, str]:
    """``{"key": escaped text, "key_hex": hex}`` for a key."""
    return {"key": escape_key(key, ascii_only=False), "key_hex": key.hex()}


def check_overwrite(path: str, force: bool) -> None:
    """The one overwrite rule of every command that writes a file: an existing ``path`` is an
    error unless ``--force`` was given."""
    if not force and os.path.lexists(path):
        raise CliError(f"{path} already exists: pass --force to replace it")
