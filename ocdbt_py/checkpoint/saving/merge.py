"""The merged root database of an item, built by reference to the per-process databases.

Orbax's finalize copies every ``ocdbt.process_<i>`` tree into a new database at the item
root in one transaction.  The result (what TensorStore's ``copy_range_to`` produces) has one
generation whose leaf entries keep small values inline and point at the children's data
files through the base path ``ocdbt.process_<i>/``: no value bytes are copied.  This module
builds exactly that from the children's entries, then checks that every array has its
metadata and all of its chunks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from ocdbt_py.checkpoint.saving.arrays import ArraySpec
from ocdbt_py.checkpoint.saving.layout_writer import orbax_config
from ocdbt_py.checkpoint.saving.process_writer import process_dir
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore
from ocdbt_py.write.bulk import (
    MANIFEST_KEY,
    BuiltDatabase,
    StoredValue,
    iter_entries,
    write_database,
)

__all__ = ["rebase", "collect_children", "write_root", "check_complete", "IncompleteSaveError"]


class IncompleteSaveError(CorruptionError):
    """After all processes wrote, an array lacks its metadata or some chunks."""


def rebase(entries: Mapping[bytes, StoredValue], process_index: int | str) -> dict[bytes, StoredValue]:
    """A child's entries as the root sees them: references gain ``ocdbt.process_<i>/``."""
    base = (process_dir(process_index) + "/").encode()
    out: dict[bytes, StoredValue] = {}
    for k, v in entries.items():
        if isinstance(v, IndirectDataReference):
            if v.length == 0 and not v.file.relative_path:
                out[k] = v
            else:
                out[k] = IndirectDataReference(
                    DataFileId(base + v.file.base_path, v.file.relative_path), v.offset, v.length
                )
        else:
            out[k] = v
    return out


def collect_children(
    item_kv: KvStore,
    process_count: int | Sequence[int],
    known: Mapping[int, Mapping[bytes, StoredValue]] | None = None,
) -> dict[bytes, StoredValue]:
    """The union of every process's entries, rebased (``known``: entries already in memory);
    ``process_count`` is the number of processes or the indices of those that wrote."""
    merged: dict[bytes, StoredValue] = {}
    owner: dict[bytes, int] = {}
    for i in (range(process_count) if isinstance(process_count, int) else process_count):
        if known is not None and i in known:
            child: Iterable[tuple[bytes, StoredValue]] = known[i].items()
        else:
            ckv = PrefixStore(item_kv, process_dir(i))
            if not ckv.exists(MANIFEST_KEY):
                continue  # that process had nothing to write
            child = iter_entries(ckv)
        for k, v in rebase(dict(child), i).items():
            if k in merged:
                raise CorruptionError(
                    f"key {k.decode('utf-8', 'replace')!r} was written by processes {owner[k]} and {i}",
                    path=item_kv.url,
                )
            merged[k] = v
            owner[k] = i
    return merged


def check_complete(entries: Mapping[bytes, StoredValue], specs: Iterable[ArraySpec]) -> None:
    """Every array has its Zarr metadata and every chunk of its grid (Orbax reads a missing
    chunk as an error)."""
    for spec in specs:
        if spec.metadata_key.encode() not in entries:
            raise IncompleteSaveError(f"array {spec.param!r} has no Zarr metadata after the save")
        grid = [range(-(-s // c)) for s, c in zip(spec.shape, spec.chunk_shape)]
        missing = 0
        first: str | None = None
        for coords in itertools.product(*grid):
            key = spec.chunk_key(coords)
            if key.encode() not in entries:
                missing += 1
                first = first or key
        if missing:
            raise IncompleteSaveError(f"array {spec.param!r} lacks {missing} chunk(s) after the save, e.g. {first!r}")


def write_root(item_kv: KvStore, entries: Mapping[bytes, StoredValue], *, target_data_file_size: int) -> BuiltDatabase:
    """Write the merged root database of the item (new uuid, one generation)."""
    return write_database(item_kv, entries, orbax_config(), target_data_file_size=target_data_file_size)
