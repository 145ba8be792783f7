"""``StepMetadata`` and ``RootMetadata`` as Orbax's checkpointers and manager return them."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ocdbt_py.kvstore.base import KvStore

__all__ = ["StepMetadata", "RootMetadata", "step_metadata"]


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
    """Manager-level metadata (``custom_metadata``)."""

    custom_metadata: dict[str, Any] | None = None


def step_metadata(location: str | os.PathLike[str] | KvStore, *, composite: bool) -> StepMetadata:
    """Read :class:`StepMetadata` of a directory (``composite``: item metadata per item name)."""
    from ocdbt_py.checkpoint.layout import step_metadata as read_doc
    from ocdbt_py.checkpoint.meta import metadata
    from ocdbt_py.checkpoint.restore.api import resolve
    from ocdbt_py.orbax.args import Composite

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
