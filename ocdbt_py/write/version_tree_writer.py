"""Adding a generation to the manifest, growing the version tree as TensorStore does.

The tree's shape depends only on the latest generation number and the arity: new
generations go inline into the manifest until the inline bucket of ``2**arity_log2``
generations is full; at a rollover the inline versions become a height-0 node and the
manifest's node references are rebuilt height by height (§6.5 of the format notes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ocdbt_py.errors import UnsupportedError
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import IndirectDataReference
from ocdbt_py.format.manifest import Manifest
from ocdbt_py.format.version_tree import (
    BtreeGenerationReference,
    VersionNodeReference,
    VersionTreeNode,
    encode_version_tree_node,
    manifest_version_node_ranges,
)

__all__ = ["add_generation", "initial_manifest", "next_commit_time"]

_MAX_GENERATION = (1 << 64) - 2

#: ``read_node(reference) -> decoded node`` for an existing version node.
ReadNode = Callable[[VersionNodeReference], VersionTreeNode]
#: ``write(encoded) -> where it is stored``.
WriteFn = Callable[[bytes], IndirectDataReference]


def next_commit_time(previous: Manifest | None, now_ns: int | None = None) -> int:
    """``max(now, previous commit time + 1 ns)``: commit times strictly increase."""
    now = time.time_ns() if now_ns is None else now_ns
    if previous is not None and previous.versions:
        now = max(now, previous.latest.commit_time + 1)
    return now


def initial_manifest(config: Config, root: BtreeGenerationReference) -> Manifest:
    """A manifest whose only version is ``root`` (generation 1)."""
    return Manifest(config, (dataclasses.replace(root, generation_number=1),), ())


def add_generation(
    old: Manifest,
    root: BtreeGenerationReference,
    *,
    read_node: ReadNode,
    write: WriteFn,
) -> Manifest:
    """The manifest after appending ``root`` as generation ``latest + 1``.

    ``root.generation_number`` is ignored; its ``commit_time`` must already be final.
    Version-tree nodes needed by a rollover are encoded and passed to ``write`` in
    TensorStore's order: the new leaf node, then new single-child nodes from the highest
    height down, then extended existing nodes from the highest height down.
    """
    config = old.config
    a = config.version_tree_arity_log2
    prev = old.latest.generation_number
    if prev >= _MAX_GENERATION:
        raise UnsupportedError("generation number is at its maximum")
    g = prev + 1
    new_gen = dataclasses.replace(root, generation_number=g)
    if prev % (1 << a):
        # still room in the inline bucket
        return Manifest(config, old.versions + (new_gen,), old.version_nodes)

    level = _zstd(config)
    leaf = VersionTreeNode(a, 0, versions=old.versions)
    leaf_ref = VersionNodeReference(
        old.versions[-1].generation_number,
        write(encode_version_tree_node(leaf, level)),
        len(old.versions),
        old.versions[0].commit_time,
        0,
    )
    # (existing ref of this height, new child) per height, lowest height first
    plan: list[tuple[VersionNodeReference | None, VersionNodeReference | None]] = []
    idx = len(old.version_nodes)
    prev_child: VersionNodeReference | None = leaf_ref
    for h, lo, hi in manifest_version_node_ranges(g, a):
        old_ref = None
        if idx > 0 and old.version_nodes[idx - 1].height == h:
            idx -= 1
            old_ref = old.version_nodes[idx]
        has_old = old_ref is not None and lo <= old_ref.generation_number <= hi
        has_new = prev_child is not None and lo <= prev_child.generation_number <= hi
        if has_old or has_new:
            plan.append((old_ref if has_old else None, prev_child if has_new else None))
        prev_child = old_ref
    plan.reverse()

    refs: list[VersionNodeReference | None] = [None] * len(plan)
    deferred: list[int] = []
    for i, (old_ref, child) in enumerate(plan):
        if old_ref is None:
            assert child is not None
            node = VersionTreeNode(a, child.height + 1, children=(child,))
            loc = write(encode_version_tree_node(node, level))
            refs[i] = VersionNodeReference(
                child.generation_number, loc, child.num_generations, child.commit_time, child.height + 1
            )
        elif child is None:
            refs[i] = old_ref
        else:
            deferred.append(i)
    for i in deferred:
        old_ref, child = plan[i]
        assert old_ref is not None and child is not None
        existing = read_node(old_ref)
        children = existing.children + (child,)
        node = VersionTreeNode(a, old_ref.height, children=children)
        loc = write(encode_version_tree_node(node, level))
        refs[i] = VersionNodeReference(
            child.generation_number,
            loc,
            old_ref.num_generations + child.num_generations,
            children[0].commit_time,
            old_ref.height,
        )
    return Manifest(config, (new_gen,), tuple(r for r in refs if r is not None))


def _zstd(config: Config) -> int | None:
    return config.compression_level
