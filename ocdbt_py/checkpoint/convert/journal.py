"""The resume journal of a copy: which arrays are completely written, and where.

It lives in ``.ocdbt-cp/`` at the top of what is being written (the temporary directory, or
the destination itself on object stores), one small JSON file per flush, and is deleted just
before the commit, so a finished copy holds nothing of it.  A record is only written once the
array's values are durable where the reader will look: files closed, OCDBT data files closed
(the record then holds each key's data file, offset and length, or its inline bytes).
``options.json`` records the copy's options; resuming with other options is refused.
``source.json`` records the source's identity (:func:`source_identity`: the generation of
each file that commits a save); resuming after the source changed is refused, so a copy never
mixes arrays of two saves.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ocdbt_py.errors import OcdbtError, UnsupportedError
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.kvstore.base import KvStore

__all__ = ["Journal", "JOURNAL_DIR", "SourceChangedError", "encode_entries", "decode_entries", "source_identity"]

JOURNAL_DIR = ".ocdbt-cp"
_MAX_FILE = 256 << 20


#: Files a save writes (or rewrites) whenever it commits: a step's metadata and marker, an
#: item's tree metadata, marker and sharding file, an OCDBT manifest (also per process).
_COMMIT_FILES = ("_CHECKPOINT_METADATA", "commit_success.txt", "_METADATA", "_sharding", "manifest.ocdbt")
_MAX_IDENTITY_FILE = 64 << 20


class SourceChangedError(OcdbtError):
    """The source of a copy is not the one an interrupted copy started from (or it changed
    while being copied)."""


def _generation(kv: KvStore, key: str) -> str | None:
    """An opaque token that changes whenever ``key`` is rewritten (``None``: absent)."""
    try:
        value, gen = kv.get_with_generation(key)
    except UnsupportedError:  # a backend without generations: the content and its size
        value, gen = kv.get(key), None
    if value is None:
        return None
    digest = hashlib.blake2b(value[:_MAX_IDENTITY_FILE], digest_size=12).hexdigest()
    return f"{len(value)}:{digest}:{gen or '-'}"


def source_identity(kv: KvStore) -> dict[str, str]:
    """What identifies the saved checkpoint (item or step) at ``kv``: for each file that commits
    a save (:data:`_COMMIT_FILES`, at the top, in each item and in each item's
    ``ocdbt.process_*`` directory) its generation (local disks: device, inode, modification
    time, size and a digest), so that any re-save changes it.  A few small reads."""
    dirs, files = kv.list_dir("")
    keys = [f for f in files if f in _COMMIT_FILES]
    for d in dirs:
        if d == JOURNAL_DIR:
            continue
        sub_dirs, sub_files = kv.list_dir(d + "/")
        keys += [f"{d}/{f}" for f in sub_files if f in _COMMIT_FILES]
        for p in sub_dirs:
            if p.startswith("ocdbt.process_"):
                keys += [f"{d}/{p}/{f}" for f in kv.list_dir(f"{d}/{p}/")[1] if f in _COMMIT_FILES]
    out: dict[str, str] = {}
    for k in sorted(keys):
        g = _generation(kv, k)
        if g is not None:
            out[k] = g
    return out


def changed(before: dict[str, str], after: dict[str, str]) -> str | None:
    """The first file whose identity differs between two :func:`source_identity` results."""
    for k in sorted(set(before) | set(after)):
        if before.get(k) != after.get(k):
            return k
    return None


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

    def load(self, options: Mapping[str, Any], source: Mapping[str, str] | None = None) -> None:
        """Read what an interrupted copy recorded (after checking its options and, given
        ``source``, that the source is the one it copied: else :class:`SourceChangedError`)."""
        raw = self.kv.get(f"{JOURNAL_DIR}/options.json")
        if raw is None:
            return
        if json.loads(raw) != json.loads(json.dumps(dict(options))):
            raise OcdbtError("the interrupted copy used other options; rerun it with the same options to resume "
                             "(or without --resume to start over)")
        if source is not None:
            raw = self.kv.get(f"{JOURNAL_DIR}/source.json")
            try:
                before = json.loads(raw) if raw is not None and len(raw) <= _MAX_FILE else None
            except ValueError:
                before = None
            if not isinstance(before, dict):
                raise SourceChangedError("the interrupted copy did not record which source it copied, so resuming "
                                         "could mix two saves; rerun without --resume to start over")
            what = changed(before, dict(source))
            if what is not None:
                raise SourceChangedError(f"the source changed since the interrupted copy ({what} differs), so "
                                         f"resuming would mix two saves; rerun without --resume to start over")
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

    def start(self, options: Mapping[str, Any], source: Mapping[str, str] | None = None) -> None:
        """Record the options of a new copy (and the identity of its source)."""
        if source is not None:
            self.kv.set(f"{JOURNAL_DIR}/source.json", json.dumps(dict(source)).encode())
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
