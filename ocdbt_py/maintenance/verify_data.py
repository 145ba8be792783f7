"""Decode every stored chunk of every Zarr array in an OCDBT database: :func:`verify_data`.

:func:`~ocdbt_py.maintenance.verify.verify` checks the database's own structure (its nodes
carry CRC-32C checksums); the chunk values inside are opaque to it.  This pass finds every
Zarr array (a ``.zarray`` or ``zarr.json`` key, as Orbax checkpoints and zarr3 write them),
then fetches and decodes each stored chunk with the array's codecs.  A chunk that fails to
decode -- a bad zstd frame or frame checksum, a ``crc32c`` codec mismatch, a wrong decoded
size, a broken shard index -- is reported by array and chunk.  Chunks written with checksums
(``checkpoint.save(checksum=True)``) turn any flipped byte into such a failure; chunks
without one (Orbax's default) are only caught when the damage breaks their structure, and the
report says how many chunks carried a checksum (``values_checksummed``).

>>> from ocdbt_py.maintenance.verify_data import verify_data
>>> report = verify_data("/path/to/checkpoint/item")      # doctest: +SKIP
>>> report.ok, report.chunks, [p.key for p in report.problems]   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import zarr3
from ocdbt_py.errors import OcdbtError
from ocdbt_py.kvstore.prefixed import PrefixStore
from ocdbt_py.store import OcdbtStore
from ocdbt_py.store import open as open_db
from ocdbt_py.units import human_bytes

__all__ = ["verify_data", "DataReport", "ChunkProblem", "NO_CHECKSUM", "checksum_note", "checksum_sample"]

_METADATA_NAMES = (".zarray", "zarr.json")
_NOT_CHUNKS = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"})
#: Chunks fetched per request batch.
_BATCH = 32


@dataclasses.dataclass
class ChunkProblem:
    """A chunk (``key``, of the array at ``array``) that does not decode, and why."""

    key: str
    array: str
    message: str

    def __str__(self) -> str:
        prefix = "" if self.array == "/" else self.array + "/"
        chunk = self.key[len(prefix):] if prefix and self.key.startswith(prefix) else self.key
        return f"array {self.array}, chunk {chunk}: {self.message}"


#: What a report says when stored values carry no checksum (``verify --data``, ``stats``, ``info``).
NO_CHECKSUM = "values carry no checksum: a change that still decodes cannot be detected"


def checksum_note(checksummed: int, chunks: int) -> str:
    """One line on how many of ``chunks`` stored chunks carry a checksum (``chunks`` > 0)."""
    if checksummed == chunks:
        return "values checksummed: every chunk carries a checksum, checked on decode"
    if checksummed == 0:
        return NO_CHECKSUM
    return (f"{chunks - checksummed} of {chunks} chunks carry no checksum: a change to them that still "
            "decodes cannot be detected")


@dataclasses.dataclass
class DataReport:
    """The result of :func:`verify_data`."""

    url: str
    arrays: int = 0
    chunks: int = 0
    #: chunk keys found (the chunks this pass is about to fetch and decode)
    chunks_expected: int = 0
    chunk_bytes: int = 0
    #: chunks whose decoding checked a checksum over their stored bytes
    checksummed_chunks: int = 0
    problems: list[ChunkProblem] = dataclasses.field(default_factory=list)
    complete: bool = True

    @property
    def ok(self) -> bool:
        """True when every chunk decoded (and every array's metadata parsed)."""
        return not self.problems

    @property
    def values_checksummed(self) -> bool:
        """True when every decoded chunk carried a checksum (so any changed byte was caught)."""
        return self.chunks > 0 and self.checksummed_chunks == self.chunks

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data."""
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        out["values_checksummed"] = self.values_checksummed
        return out

    def summary(self) -> str:
        """One line saying what was decoded."""
        return (f"decoded {self.chunks} chunk{'' if self.chunks == 1 else 's'} "
                f"({human_bytes(self.chunk_bytes)} stored) of {self.arrays} array{'' if self.arrays == 1 else 's'}")

    def format(self) -> str:
        """A human-readable multi-line report (the checksum line says what decoding could catch)."""
        checked = [checksum_note(self.checksummed_chunks, self.chunks)] if self.chunks else []
        if self.ok:
            return "\n".join([f"data OK: {self.summary()}", *checked])
        n = len(self.problems)
        more = "" if self.complete else f" (stopped after the first {n})"
        lines = [f"data FAILED: {n} chunk{' does' if n == 1 else 's do'} not decode{more}"]
        lines.extend(f"  {p}" for p in self.problems)
        lines.append(self.summary())
        lines.extend(checked)
        return "\n".join(lines)


class _Stop(Exception):
    pass


def _arrays(keys: list[str]) -> list[str]:
    """Array prefixes (``""`` or ending in ``/``) that hold Zarr array metadata."""
    out = set()
    for k in keys:
        head, _, name = k.rpartition("/")
        if name in _METADATA_NAMES:
            out.add(head + "/" if head else "")
    return sorted(out)


def _owner(key: str, arrays: list[str]) -> str | None:
    """The deepest array prefix that ``key`` lies in."""
    best = None
    for a in arrays:
        if key.startswith(a) and (best is None or len(a) > len(best)):
            best = a
    return best


def _chunk_keys(keys: list[str], arrays: list[str]) -> dict[str, list[str]]:
    by_array: dict[str, list[str]] = {a: [] for a in arrays}
    for k in keys:
        a = _owner(k, arrays)
        if a is None or k[len(a):] in _NOT_CHUNKS:
            continue  # not in an array, or metadata (any other key must be a decodable chunk)
        by_array[a].append(k)
    return by_array


def _check_array(db_kv: Any, prefix: str, keys: list[str], report: DataReport, max_problems: int,
                 tick: Callable[[], None]) -> None:
    name = prefix.rstrip("/") or "/"
    try:
        arr = zarr3.open(PrefixStore(db_kv, prefix) if prefix else db_kv, mode="r")
    except (OcdbtError, ValueError) as e:
        _problem(report, ChunkProblem(prefix + "(metadata)", name, f"cannot open the array: {e}"), max_problems)
        return
    report.arrays += 1
    chain = arr.metadata.chain  # type: ignore[union-attr]
    for i in range(0, len(keys), _BATCH):
        batch = keys[i:i + _BATCH]
        for key, data in zip(batch, db_kv.get_many(batch)):
            if data is None:
                continue
            report.chunks += 1
            report.chunk_bytes += len(data)
            report.checksummed_chunks += chain.carries_checksum(data)
            try:
                chain.check_decodable(data)
                chain.decode(data)
            except (OcdbtError, ValueError) as e:
                _problem(report, ChunkProblem(key, name, f"{type(e).__name__}: {e}"), max_problems)
        tick()


def _problem(report: DataReport, p: ChunkProblem, max_problems: int) -> None:
    report.problems.append(p)
    if len(report.problems) >= max_problems:
        raise _Stop


def _open(location: OcdbtStore | str | os.PathLike[str] | Any, storage_options: dict[str, Any] | None) -> Any:
    if isinstance(location, OcdbtStore):
        return location
    return open_db(location, storage_options=storage_options)


def checksum_sample(db: OcdbtStore, *, max_arrays: int = 32) -> dict[str, Any]:
    """Whether stored values carry checksums, judged from the first stored chunk of up to
    ``max_arrays`` Zarr arrays of ``db`` (a save writes all of its chunks one way): ``{"arrays":
    Zarr arrays found, "sampled": arrays looked at, "checksummed": of those, how many}``."""
    kv = db.as_kvstore()
    keys = list(kv.list())
    arrays = _arrays(keys)
    firsts: list[tuple[str, str]] = []
    for prefix, chunk_keys in _chunk_keys(keys, arrays).items():
        if chunk_keys and len(firsts) < max_arrays:
            firsts.append((prefix, chunk_keys[0]))
    summed = 0
    for (prefix, _key), data in zip(firsts, kv.get_many([k for _, k in firsts])):
        try:
            arr = zarr3.open(PrefixStore(kv, prefix) if prefix else kv, mode="r")
        except (OcdbtError, ValueError):
            continue
        summed += data is not None and arr.metadata.chain.carries_checksum(data)  # type: ignore[union-attr]
    return {"arrays": len(arrays), "sampled": len(firsts), "checksummed": summed}


def verify_data(
    location: OcdbtStore | str | os.PathLike[str] | Any,
    *,
    max_problems: int = 100,
    progress: Callable[[DataReport], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> DataReport:
    """Decode every stored chunk of every Zarr array in the database at ``location`` (an open
    :class:`~ocdbt_py.store.OcdbtStore` -- its selected version --, a :class:`KvStore`, a path
    or URL: the latest version) and report the chunks that fail, up to ``max_problems``."""
    db = _open(location, storage_options)
    kv = db.as_kvstore()
    report = DataReport(db.kvstore.url)
    keys = list(kv.list())
    arrays = _arrays(keys)
    tick = (lambda: progress(report)) if progress is not None else (lambda: None)
    by_array = _chunk_keys(keys, arrays)
    report.chunks_expected = sum(len(v) for v in by_array.values())
    try:
        for prefix, chunk_keys in by_array.items():
            _check_array(kv, prefix, chunk_keys, report, max(1, max_problems), tick)
    except _Stop:
        report.complete = False
    return report
