"""The resume journal of a copy: which arrays are completely written, and where.

It lives in ``.ocdbt-cp/`` at the top of what is being written (the temporary directory, or
the destination itself on object stores), one small JSON file per flush, and is deleted just
before the commit, so a finished copy holds nothing of it.  A record is only written once the
array's values are durable where the reader will look: files closed, OCDBT data files closed
(the record then holds each key's data file, offset and length, or its inline bytes).
``options.json`` records the copy's options; resuming with other options is refused.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ocdbt_py.errors import OcdbtError
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.kvstore.base import KvStore

__all__ = ["Journal", "JOURNAL_DIR", "encode_entries", "decode_entries"]

JOURNAL_DIR = ".ocdbt-cp"
_MAX_FILE = 256 << 20


def encode_entries(entries: Mapping[bytes, Any]) -> dict[str, Any]:
    """OCDBT entries (inline bytes or references into ``d/`` files) as JSON."""
    out: dict[str, Any] = {}
    for k, v in entries.items():
        key = k.decode("utf-8", "surrogateescape")
        if isinstance(v, IndirectDataReference):
            out[key] = [v.file.base_path.decode(), v.file.relative_path.decode(), v.offset, v.length]
        else:
            out[key] = base64.b64encode(bytes(v)).decode("ascii")
    return out


def decode_entries(doc: Mapping[str, Any]) -> dict[bytes, Any]:
    """The inverse of :func:`encode_entries`."""
    out: dict[bytes, Any] = {}
    for key, v in doc.items():
        k = key.encode("utf-8", "surrogateescape")
        if isinstance(v, list):
            base, rel, off, n = v
            out[k] = IndirectDataReference(DataFileId(base.encode(), rel.encode()), int(off), int(n))
        else:
            out[k] = base64.b64decode(v)
    return out


class Journal:
    """Records of finished arrays, by item (``""`` for an item copied alone)."""

    def __init__(self, kv: KvStore):
        self.kv = kv
        self.done: dict[str, dict[str, Any]] = {}
        self._next = 0

    def load(self, options: Mapping[str, Any]) -> None:
        """Read what an interrupted copy recorded (after checking its options)."""
        raw = self.kv.get(f"{JOURNAL_DIR}/options.json")
        if raw is None:
            return
        if json.loads(raw) != json.loads(json.dumps(dict(options))):
            raise OcdbtError("the interrupted copy used other options; rerun it with the same options to resume "
                             "(or without --resume to start over)")
        names = sorted((k for k in self.kv.list(f"{JOURNAL_DIR}/") if k.endswith(".rec.json")),
                       key=lambda k: int(k.rsplit("/", 1)[-1].split(".")[0]))
        for name in names:
            raw = self.kv.get(name)
            if raw is None or len(raw) > _MAX_FILE:
                continue
            try:
                doc = json.loads(raw)
            except ValueError:
                continue  # a record cut short by the interruption: its arrays are copied again
            for item, params in doc.items():
                self.done.setdefault(item, {}).update(params)
            self._next = max(self._next, int(name.rsplit("/", 1)[-1].split(".")[0]) + 1)

    def start(self, options: Mapping[str, Any]) -> None:
        """Record the options of a new copy."""
        self.kv.set(f"{JOURNAL_DIR}/options.json", json.dumps(dict(options)).encode())

    def record(self, item: str, params: Mapping[str, Any]) -> None:
        """Append records of finished arrays (``{param: record}``)."""
        if not params:
            return
        self.kv.set(f"{JOURNAL_DIR}/{self._next}.rec.json", json.dumps({item: dict(params)}).encode())
        self._next += 1
        self.done.setdefault(item, {}).update(params)

    def remove(self) -> None:
        """Delete the journal (just before the commit)."""
        for k in list(self.kv.list(f"{JOURNAL_DIR}/")):
            self.kv.delete(k)
        path = self.kv.local_path(JOURNAL_DIR)
        if path is not None:
            with contextlib.suppress(OSError):
                os.rmdir(path)
