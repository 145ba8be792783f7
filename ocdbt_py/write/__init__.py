"""The OCDBT writer: data-file packing, copy-on-write B+tree commits, version-tree growth,
the manifest update protocol and transactions.

Users reach it through :func:`ocdbt_py.open` with ``mode="a"``::

    db = ocdbt_py.open("/tmp/db", mode="a", config={"max_inline_value_bytes": 64})
    db.put(b"key", b"value")                 # one commit, returns the generation
    with db.transaction() as t:              # one atomic commit
        t.put(b"a", b"1")
        t.delete_range(b"tmp/", b"tmp0")

Modules: :mod:`.options` (config constraints, writer options), :mod:`.data_writer`,
:mod:`.node_encoder`, :mod:`.btree_writer`, :mod:`.version_tree_writer`,
:mod:`.manifest_io`, :mod:`.commit`, :mod:`.transaction`, and :mod:`.bulk` (a single-generation
database written in one pass, for checkpoint writers).  Garbage collection is in
:mod:`ocdbt_py.maintenance.gc`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ocdbt_py.read.cache import LruCache
from ocdbt_py.write.commit import Writer
from ocdbt_py.write.options import parse_options

if TYPE_CHECKING:
    from ocdbt_py.kvstore.base import KvStore
    from ocdbt_py.write.commit import Writer

__all__ = ["open_writer"]


def open_writer(
    kv: KvStore, config: Mapping[str, Any] | None = None, *, cache_bytes: int = 64 << 20
) -> Writer:
    """A :class:`~ocdbt_py.write.commit.Writer` for the database in ``kv``.

    ``config`` holds TensorStore's config names (constraints on an existing database,
    choices for a new one) and the writer options; see :func:`.options.parse_options`.
    """

    constraints, options = parse_options(config)
    return Writer(kv, constraints, options, LruCache(cache_bytes))
