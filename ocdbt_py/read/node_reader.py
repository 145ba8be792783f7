"""Fetching and decoding referenced blobs (B+tree nodes, version nodes, values) from a KvStore.

Every data-file path taken from a (possibly hostile) database is validated as a relative key
before it reaches the backend, node sizes are bounded, and decoded nodes are cached.
"""

from __future__ import annotations

from collections.abc import Sequence

from ocdbt_py.errors import CorruptionError, InvalidKeyError
from ocdbt_py.format.btree import BtreeNode, decode_btree_node, node_nbytes
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.format.version_tree import VersionTreeNode, decode_version_tree_node
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.coalesce import merge_ranges
from ocdbt_py.kvstore.keys import validate_key
from ocdbt_py.read.cache import LruCache

__all__ = ["NodeReader", "node_body_limit", "version_node_nbytes"]

_HARD_NODE_LIMIT = 1 << 30
_VERSION_NODE_LIMIT = 64 << 20
#: read_many merges values of at most _COALESCE_VALUE bytes that are at most _COALESCE_GAP
#: apart in one data file into range reads of at most _COALESCE_MAX bytes.
_COALESCE_VALUE = 1 << 20
_COALESCE_GAP = 64 << 10
_COALESCE_MAX = 16 << 20
#: Memory of a decoded version-tree node (CPython, 64-bit): the node, and per entry a frozen
#: dataclass (generation or node reference) with its root reference, statistics, ints and
#: data file id (each generation's root usually lies in a file of its own).
_VERSION_NODE_BYTES = 512
_VERSION_ENTRY_BYTES = 640


def node_body_limit(config: Config) -> int:
    """Largest decoded B+tree node body accepted for ``config``.

    TensorStore splits nodes by an estimate and lets a single huge entry overflow, so allow
    the configured size plus the largest single entry (a 1 MiB inline value and a 64 KiB key).
    ``max_decoded_node_bytes == 0`` (unlimited) gets a hard 1 GiB cap.
    """
    if config.max_decoded_node_bytes == 0:
        return _HARD_NODE_LIMIT
    return min(_HARD_NODE_LIMIT, config.max_decoded_node_bytes + (2 << 20))


class NodeReader:
    """Reads references relative to a database root held in ``kv``."""

    def __init__(self, kv: KvStore, config: Config, cache: LruCache[object] | None = None):
        self.kv = kv
        self.config = config
        self.node_limit = node_body_limit(config)
        self.cache: LruCache[object] = cache if cache is not None else LruCache(64 << 20)
        self._keys: dict[DataFileId, str] = {}

    def file_key(self, file: DataFileId) -> str:
        """The store key of a data file, validated (``..``, absolute paths, schemes rejected)."""
        k = self._keys.get(file)
        if k is not None:
            return k
        raw = file.path
        try:
            k = raw.decode("utf-8")
            validate_key(k)
        except (UnicodeDecodeError, InvalidKeyError) as e:
            raise CorruptionError(f"unsafe or invalid data file path {raw!r}: {e}", path=self.kv.url) from e
        if len(self._keys) < 1 << 16:
            self._keys[file] = k
        return k

    def _check(self, ref: IndirectDataReference, data: bytes | None, key: str) -> bytes:
        if data is None:
            raise CorruptionError(f"data file {key!r} referenced by the database is missing", path=self.kv.url)
        if len(data) != ref.length:
            raise CorruptionError(
                f"data file is truncated: wanted {ref.length} bytes at offset {ref.offset}, got {len(data)}",
                path=key,
                offset=ref.offset,
            )
        return data

    def read(self, ref: IndirectDataReference) -> bytes:
        """The bytes a reference points at (exactly ``ref.length`` of them)."""
        if ref.length == 0:
            return b""
        key = self.file_key(ref.file)
        return self._check(ref, self.kv.get(key, (ref.offset, ref.offset + ref.length)), key)

    def read_range(self, ref: IndirectDataReference, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the referenced blob (already clipped to it)."""
        if stop <= start:
            return b""
        key = self.file_key(ref.file)
        data = self.kv.get(key, (ref.offset + start, ref.offset + stop))
        if data is None or len(data) != stop - start:
            raise CorruptionError("data file is missing or truncated", path=key, offset=ref.offset + start)
        return data

    def read_many(self, refs: Sequence[IndirectDataReference]) -> list[bytes]:
        """Read several references concurrently.

        Small values lying close together in one data file (thousands of small arrays of a
        checkpoint are written back to back) are fetched with one coalesced range read each
        group, as TensorStore does, instead of one request per value.
        """
        out: list[bytes] = [b""] * len(refs)
        by_file: dict[str, list[int]] = {}
        plan: list[tuple[str, int, int, list[int]]] = []  # (key, start, stop, ref indices)
        for i, ref in enumerate(refs):
            if ref.length == 0:
                continue
            key = self.file_key(ref.file)
            if ref.length <= _COALESCE_VALUE:
                by_file.setdefault(key, []).append(i)
            else:
                plan.append((key, ref.offset, ref.offset + ref.length, [i]))
        for key, idxs in by_file.items():
            idxs.sort(key=lambda j: refs[j].offset)
            spans = ((refs[j].offset, refs[j].offset + refs[j].length, j) for j in idxs)
            for lo, hi, group in merge_ranges(spans, gap=_COALESCE_GAP, max_span=_COALESCE_MAX):
                assert hi is not None  # every range here is bounded
                plan.append((key, lo, hi, group))
        if plan:
            results = self.kv.get_many([(key, (lo, hi)) for key, lo, hi, _ in plan])
            for (key, lo, _, idxs), data in zip(plan, results):
                if len(idxs) == 1 and refs[idxs[0]].offset == lo:
                    out[idxs[0]] = self._check(refs[idxs[0]], data, key)
                    continue
                for j in idxs:
                    a = refs[j].offset - lo
                    piece = None if data is None else data[a: a + refs[j].length]
                    out[j] = self._check(refs[j], piece, key)
        return out

    # -- B+tree nodes ---------------------------------------------------------------------
    def _decode_btree(self, ref: IndirectDataReference, data: bytes, height: int) -> BtreeNode:
        key = self.file_key(ref.file)
        node = decode_btree_node(
            data, transitive=ref.file.base_path, max_body=self.node_limit, path=key, base=ref.offset
        )
        if node.height != height:
            raise CorruptionError(
                f"b+tree node has height {node.height}, its parent expects {height}", path=key, offset=ref.offset
            )
        # Weighed by the memory the decoded node holds (not its stored, often zstd-compressed
        # length), so the cache's capacity bounds what it keeps alive.  A leaf that has only
        # been listed still holds its decoded body and builds its value objects on first use;
        # it is weighed by the larger of the two states up front (O(1) at decode time), which
        # stays a bound whatever is read later and needs no re-weighing on materialisation
        # (a listed-only leaf of out-of-line values is over-counted up to about 2x).
        self.cache.put(("b", ref), node, node_nbytes(node))
        return node

    def _check_length(self, ref: IndirectDataReference) -> None:
        # The encoded node is at most its decoded size plus zstd overhead.
        if ref.length > self.node_limit + (self.node_limit >> 3) + 4096:
            raise CorruptionError(
                f"b+tree node reference of {ref.length} bytes exceeds the node size limit",
                path=self.file_key(ref.file),
                offset=ref.offset,
            )

    def btree_node(self, ref: IndirectDataReference, height: int) -> BtreeNode:
        """Decode (or fetch from cache) the B+tree node at ``ref``; it must have ``height``."""
        hit = self.cache.get(("b", ref))
        if hit is not None:
            node: BtreeNode = hit  # type: ignore[assignment]
            if node.height != height:
                raise CorruptionError(f"b+tree node has height {node.height}, expected {height}")
            return node
        self._check_length(ref)
        return self._decode_btree(ref, self.read(ref), height)

    def btree_nodes(self, refs: Sequence[IndirectDataReference], height: int) -> list[BtreeNode]:
        """Decode several nodes of the same height, fetching the uncached ones concurrently."""
        out: list[BtreeNode | None] = []
        missing: list[int] = []
        for i, ref in enumerate(refs):
            hit = self.cache.get(("b", ref))
            out.append(hit)  # type: ignore[arg-type]
            if hit is None:
                self._check_length(ref)
                missing.append(i)
        if missing:
            datas = self.read_many([refs[i] for i in missing])
            for i, data in zip(missing, datas):
                out[i] = self._decode_btree(refs[i], data, height)
        for node in out:
            assert node is not None
            if node.height != height:
                raise CorruptionError(f"b+tree node has height {node.height}, expected {height}")
        return out  # type: ignore[return-value]

    # -- version nodes -----------------------------------------------------------------------
    def version_node(self, ref: IndirectDataReference, height: int, last_generation: int) -> VersionTreeNode:
        """Decode the version-tree node at ``ref`` and check its height and last generation."""
        key = self.file_key(ref.file)
        hit = self.cache.get(("v", ref))
        if hit is not None:
            node: VersionTreeNode = hit  # type: ignore[assignment]
        else:
            if ref.length > _VERSION_NODE_LIMIT:
                raise CorruptionError("version node reference is too large", path=key, offset=ref.offset)
            node = decode_version_tree_node(
                self.read(ref),
                arity_log2=self.config.version_tree_arity_log2,
                transitive=ref.file.base_path,
                max_body=_VERSION_NODE_LIMIT,
                path=key,
                base=ref.offset,
            )
        # checked on cache hits too: another reference may point at the same node
        if node.height != height:
            raise CorruptionError(
                f"version node has height {node.height}, expected {height}", path=key, offset=ref.offset
            )
        last = node.versions[-1].generation_number if node.height == 0 else node.children[-1].generation_number
        if last != last_generation:
            raise CorruptionError(
                f"version node's last generation is {last}, its reference says {last_generation}",
                path=key,
                offset=ref.offset,
            )
        if hit is None:
            self.cache.put(("v", ref), node, version_node_nbytes(node))
        return node


def version_node_nbytes(node: VersionTreeNode) -> int:
    """Estimated bytes of memory a decoded version-tree node holds (its cache weight)."""
    return _VERSION_NODE_BYTES + _VERSION_ENTRY_BYTES * (len(node.versions) + len(node.children))
