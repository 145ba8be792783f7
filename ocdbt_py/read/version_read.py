"""Reading manifests and finding generations in the version tree."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

from ocdbt_py.errors import CorruptionError, NotFoundError
from ocdbt_py.format.config import MANIFEST_KIND_NUMBERED
from ocdbt_py.format.manifest import Manifest, decode_manifest
from ocdbt_py.format.version_tree import BtreeGenerationReference, VersionNodeReference
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.timeutil import format_nanoseconds

__all__ = [
    "MANIFEST_KEY",
    "read_manifest",
    "numbered_manifest_key",
    "find_generation",
    "find_time",
    "all_versions",
]

MANIFEST_KEY = "manifest.ocdbt"
_NUMBERED = re.compile(r"^manifest\.([0-9a-f]{16})$")
_MAX_MANIFEST_FILE = 256 << 20


def manifest_read_limit() -> int:
    """The byte range end a manifest file is read with (one byte past the size limit)."""
    return _MAX_MANIFEST_FILE + 1


def numbered_manifest_key(generation: int) -> str:
    """``manifest.<16 hex digits>`` for a numbered manifest."""
    return f"manifest.{generation:016x}"


def list_numbered_manifests(kv: KvStore) -> list[int]:
    """Generations of the numbered manifest files present, ascending."""
    gens = []
    for key in kv.list("manifest.", start="manifest.0", stop="manifest.:"):
        m = _NUMBERED.match(key)
        if m:
            g = int(m.group(1), 16)
            if g:
                gens.append(g)
    return sorted(gens)


def read_manifest(kv: KvStore) -> tuple[Manifest, str]:
    """Read the current manifest; returns it and the key it came from.

    Raises :class:`NotFoundError` when there is no database at ``kv``.
    """
    data = _read_manifest_file(kv, MANIFEST_KEY)
    if data is None:
        raise NotFoundError(f"no OCDBT database at {kv.url} (no {MANIFEST_KEY})")
    manifest = decode_manifest(data, path=f"{kv.url}/{MANIFEST_KEY}")
    if manifest.config.manifest_kind != MANIFEST_KIND_NUMBERED:
        return manifest, MANIFEST_KEY
    for _attempt in range(8):
        gens = list_numbered_manifests(kv)
        if not gens:
            # config written, no commit yet: an empty database
            return manifest, MANIFEST_KEY
        g = gens[-1]
        key = numbered_manifest_key(g)
        data = _read_manifest_file(kv, key)
        if data is None:  # pruned or replaced meanwhile: list again
            continue
        numbered = decode_manifest(data, path=f"{kv.url}/{key}")
        if not numbered.versions:
            raise CorruptionError("numbered manifest file holds no versions", path=f"{kv.url}/{key}")
        if numbered.latest.generation_number != g:
            raise CorruptionError(
                f"numbered manifest's latest generation {numbered.latest.generation_number} does not "
                f"match its file name",
                path=f"{kv.url}/{key}",
            )
        cfg = numbered.config
        if (cfg.uuid, cfg.version_tree_arity_log2) != (
            manifest.config.uuid,
            manifest.config.version_tree_arity_log2,
        ):
            raise CorruptionError("numbered manifest's config differs from manifest.ocdbt", path=f"{kv.url}/{key}")
        return Manifest(manifest.config, numbered.versions, numbered.version_nodes), key
    raise CorruptionError(f"numbered manifests of {kv.url} kept vanishing while being read")


def _read_manifest_file(kv: KvStore, key: str) -> bytes | None:
    """A manifest file (``None`` if absent), read never more than one byte past the size
    limit and refused past it."""
    data = kv.get(key, (0, manifest_read_limit()))
    if data is not None and len(data) > _MAX_MANIFEST_FILE:
        raise CorruptionError(f"manifest of {len(data)} bytes is implausibly large", path=f"{kv.url}/{key}")
    return data


def _no_generation(manifest: Manifest, generation: int) -> NotFoundError:
    """Generation ``generation`` is not kept: say which ones are (cheaply, from the manifest)."""
    versions = manifest.versions
    if not versions:
        return NotFoundError(f"no version {generation}: the database has no versions yet")
    latest = versions[-1].generation_number
    if manifest.version_nodes:  # older ones live in version-tree nodes: the oldest is not at hand
        kept = f"versions up to {latest} are kept (some older ones may have been collected)"
    else:
        first = versions[0].generation_number
        kept = f"version {first} is the only one kept" if first == latest else \
            f"versions {first} to {latest} are kept"
    return NotFoundError(f"no version {generation}: {kept} (listed by 'ocdbt versions' or OcdbtStore.versions())")


def _no_version_at(ns: int) -> NotFoundError:
    when = format_nanoseconds(ns).replace(".000000000Z", "Z")
    return NotFoundError(f"no version committed at or before {when}")


def find_generation(reader: NodeReader, manifest: Manifest, generation: int) -> BtreeGenerationReference:
    """The generation numbered ``generation``; :class:`NotFoundError` if absent."""
    versions = manifest.versions
    if not versions or generation < 1 or generation > versions[-1].generation_number:
        raise _no_generation(manifest, generation)
    if generation >= versions[0].generation_number:
        gens = [v.generation_number for v in versions]
        i = bisect.bisect_left(gens, generation)
        if i < len(gens) and gens[i] == generation:
            return versions[i]
        raise _no_generation(manifest, generation)
    a = manifest.config.version_tree_arity_log2
    refs: tuple[VersionNodeReference, ...] = manifest.version_nodes
    for _ in range(64):
        ref = next((r for r in refs if r.generation_number >= generation), None)
        if ref is None:
            raise _no_generation(manifest, generation)
        span = 1 << (a * (ref.height + 1))
        first = ref.generation_number - ((ref.generation_number - 1) % span)
        if generation < first:
            raise _no_generation(manifest, generation)
        node = reader.version_node(ref.location, ref.height, ref.generation_number)
        if node.height == 0:
            gens = [v.generation_number for v in node.versions]
            i = bisect.bisect_left(gens, generation)
            if i < len(gens) and gens[i] == generation:
                return node.versions[i]
            raise _no_generation(manifest, generation)
        refs = node.children
    raise CorruptionError("version tree too deep")


def find_time(reader: NodeReader, manifest: Manifest, ns: int) -> BtreeGenerationReference:
    """The latest generation whose commit time is at or before ``ns``."""
    versions = manifest.versions
    if not versions:
        raise _no_version_at(ns)
    if ns >= versions[0].commit_time:
        times = [v.commit_time for v in versions]
        return versions[bisect.bisect_right(times, ns) - 1]
    refs: tuple[VersionNodeReference, ...] = manifest.version_nodes
    for _ in range(64):
        cand = [r for r in refs if r.commit_time <= ns]
        if not cand:
            raise _no_version_at(ns)
        ref = cand[-1]
        node = reader.version_node(ref.location, ref.height, ref.generation_number)
        if node.height == 0:
            times = [v.commit_time for v in node.versions]
            i = bisect.bisect_right(times, ns) - 1
            if i < 0:
                raise _no_version_at(ns)
            return node.versions[i]
        refs = node.children
    raise CorruptionError("version tree too deep")


def all_versions(reader: NodeReader, manifest: Manifest) -> Iterator[BtreeGenerationReference]:
    """Every generation reachable from the manifest, oldest first."""
    for ref in manifest.version_nodes:
        # iterative DFS, children in order
        stack: list[VersionNodeReference] = [ref]
        while stack:
            r = stack.pop()
            node = reader.version_node(r.location, r.height, r.generation_number)
            if node.height == 0:
                yield from node.versions
            else:
                stack.extend(reversed(node.children))
    yield from manifest.versions
