"""``StepMetadata`` and ``RootMetadata`` as Orbax's checkpointers and manager return them."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import step_metadata as read_doc
from ocdbt_py.checkpoint.meta import metadata
from ocdbt_py.checkpoint.restore.api import resolve
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.orbax.args import Composite

__all__ = ["StepMetadata", "RootMetadata", "step_metadata", "read_root_metadata", "write_root_metadata"]


@dataclasses.dataclass
class StepMetadata:
    """A step's (or item's) ``_CHECKPOINT_METADATA`` plus its items' tree metadata."""

    item_handlers: Any = None
    item_metadata: Any = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    performance_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    init_timestamp_nsecs: int | None = None
    commit_timestamp_nsecs: int | None = None
    custom_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RootMetadata:
    """Manager-level metadata, stored in ``<root>/metadata/_ROOT_METADATA`` as Orbax does."""

    internal_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    custom_metadata: dict[str, Any] | None = None


ROOT_METADATA_FILE = "metadata/_ROOT_METADATA"
_LEGACY_ROOT_METADATA_FILE = "metadata/metadata"


def read_root_metadata(kv: KvStore) -> RootMetadata:
    """The root metadata of a manager root (empty when none was saved)."""
    for key in (ROOT_METADATA_FILE, _LEGACY_ROOT_METADATA_FILE):
        doc = read_json(kv, key)
        if isinstance(doc, dict):
            custom = doc.get("custom_metadata")
            internal = doc.get("internal_metadata")
            return RootMetadata(internal if isinstance(internal, dict) else {},
                                dict(custom) if isinstance(custom, dict) else {})
    return RootMetadata(custom_metadata={})


def write_root_metadata(kv: KvStore, custom_metadata: dict[str, Any]) -> None:
    """Write the root metadata unless a previous run did (Orbax keeps the first)."""
    if not kv.exists(ROOT_METADATA_FILE):
        doc = {"internal_metadata": {}, "custom_metadata": dict(custom_metadata)}
        kv.set(ROOT_METADATA_FILE, json.dumps(doc).encode())


def step_metadata(location: str | os.PathLike[str] | KvStore, *, composite: bool) -> StepMetadata:
    """Read :class:`StepMetadata` of a directory (``composite``: item metadata per item name)."""
    r = resolve(location)
    doc = read_doc(r.kv) or {}
    if composite:
        names = [n for n in r.items() if n != "metrics"]
        items: Any = Composite(**{n: metadata(r.kv, item=n) for n in names})
    else:
        items = metadata(r.kv)
    return StepMetadata(
        item_handlers=doc.get("item_handlers"),
        item_metadata=items,
        metrics=doc.get("metrics") or {},
        performance_metrics=doc.get("performance_metrics") or {},
        init_timestamp_nsecs=doc.get("init_timestamp_nsecs"),
        commit_timestamp_nsecs=doc.get("commit_timestamp_nsecs"),
        custom_metadata=doc.get("custom_metadata") or {},
    )
