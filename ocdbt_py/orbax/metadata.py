"""``ocp.metadata``: what Orbax's checkpointers, handlers and manager return as metadata.

``StepMetadata`` (a step's ``_CHECKPOINT_METADATA`` plus its items' metadata) and
``RootMetadata`` (the manager root's), and the per-leaf classes of ``ocp.metadata.value``
(``ArrayMetadata``, ``ScalarMetadata``, ``StringMetadata``), the saved shardings
(``NamedShardingMetadata``, ``SingleDeviceShardingMetadata``) and the tree they sit in
(``TreeMetadata``, in ``ocp.metadata.tree``).  The native API's
:class:`~ocdbt_py.checkpoint.LeafMetadata` is not used here: it stays what
``ocdbt_py.checkpoint.metadata`` returns.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import step_metadata as read_doc
from ocdbt_py.checkpoint.restore.api import resolve
from ocdbt_py.checkpoint.restore.location import locate
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.orbax import metadata_sharding as sharding
from ocdbt_py.orbax import metadata_tree as tree
from ocdbt_py.orbax import metadata_value as value
from ocdbt_py.orbax.args import Composite
from ocdbt_py.orbax.metadata_sharding import NamedShardingMetadata, ShardingMetadata, SingleDeviceShardingMetadata
from ocdbt_py.orbax.metadata_tree import TreeMetadata, item_tree_metadata
from ocdbt_py.orbax.metadata_value import ArrayMetadata, Metadata, ScalarMetadata, StorageMetadata, StringMetadata
from ocdbt_py.orbax.step_statistics import SaveStepStatistics, from_stored

__all__ = ["StepMetadata", "RootMetadata", "Metadata", "ArrayMetadata", "ScalarMetadata", "StringMetadata",
           "StorageMetadata", "ShardingMetadata", "NamedShardingMetadata", "SingleDeviceShardingMetadata",
           "TreeMetadata", "value", "tree", "sharding", "step_metadata", "read_root_metadata",
           "write_root_metadata"]


@dataclasses.dataclass
class StepMetadata:
    """A step's (or item's) ``_CHECKPOINT_METADATA`` plus its items' metadata
    (``item_metadata``: a :class:`TreeMetadata`, or per item a ``Composite`` of them)."""

    item_handlers: Any = None
    item_metadata: Any = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    performance_metrics: Any = dataclasses.field(default_factory=SaveStepStatistics)
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
    """The root metadata of a manager root (empty when none was saved).

    As Orbax: ``metadata/_ROOT_METADATA``, else the legacy ``metadata/metadata`` (what older
    managers saved with a ``JsonCheckpointHandler``); keys other than ``internal_metadata`` and
    ``custom_metadata`` belong to ``custom_metadata`` (an error when that is set too).
    """
    for key in (ROOT_METADATA_FILE, _LEGACY_ROOT_METADATA_FILE):
        doc = read_json(kv, key)
        if isinstance(doc, dict):
            custom = doc.get("custom_metadata")
            internal = doc.get("internal_metadata")
            declared = bool(custom)
            custom = dict(custom) if isinstance(custom, dict) else {}
            for k, v in doc.items():
                if k in ("custom_metadata", "internal_metadata"):
                    continue
                if declared:
                    raise ValueError(f"Provided metadata contains unknown key {k}, and the custom_metadata field is "
                                     "already defined.")
                custom[k] = v
            return RootMetadata(internal if isinstance(internal, dict) else {}, custom)
    return RootMetadata(custom_metadata={})


def write_root_metadata(kv: KvStore, custom_metadata: dict[str, Any]) -> None:
    """Write the root metadata unless a previous run did (Orbax keeps the first)."""
    if not kv.exists(ROOT_METADATA_FILE):
        doc = {"internal_metadata": {}, "custom_metadata": dict(custom_metadata)}
        kv.set(ROOT_METADATA_FILE, json.dumps(doc).encode())


def step_metadata(location: str | os.PathLike[str] | KvStore, *, composite: bool) -> StepMetadata:
    """Read :class:`StepMetadata` of a directory (``composite``: a ``Composite`` of each
    item's :class:`TreeMetadata`, ``None`` for JSON items, as Orbax's handlers give)."""
    r = resolve(location)
    doc = read_doc(r.kv) or {}
    loc = locate(r.kv)
    if composite:
        items: Any = Composite(**{n: item_tree_metadata(il) for n, il in loc.items.items() if n != "metrics"})
    elif loc.unwrap is None:  # several items read by a single-item checkpointer: each by name
        items = {n: item_tree_metadata(il) for n, il in loc.items.items()}
    else:
        items = item_tree_metadata(loc.items[loc.unwrap])
    return StepMetadata(
        item_handlers=doc.get("item_handlers"),
        item_metadata=items,
        metrics=doc.get("metrics") or {},
        performance_metrics=from_stored(doc.get("performance_metrics")),
        init_timestamp_nsecs=doc.get("init_timestamp_nsecs"),
        commit_timestamp_nsecs=doc.get("commit_timestamp_nsecs"),
        custom_metadata=doc.get("custom_metadata") or {},
    )
