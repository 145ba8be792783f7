"""Fetching and decoding referenced blobs (B+tree nodes, version nodes, values) from a KvStore.

Every data-file path taken from a (possibly hostile) database is validated as a relative key
before it reaches the backend, node sizes are bounded, and decoded nodes are cached.
"""

from __future__ import annotations

from collections.abc import Sequence

from ocdbt_py.cache import LruCache
from ocdbt_py.errors import CorruptionError, InvalidKeyError
from ocdbt_py.format.btree import BtreeNode, decode_btree_node
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.format.version_tree import VersionTreeNode, decode_version_tree_node
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.keys import validate_key

__all__ = ["NodeReader", "node_body_limit"]

_HARD_NODE_LIMIT = 1 << 30
_VERSION_NODE_LIMIT = 64 << 20


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
        """Read several references concurrently."""
        reqs: list[tuple[str, tuple[int, int] | None]] = []
        idx: list[int] = []
        out: list[bytes] = [b""] * len(refs)
        for i, ref in enumerate(refs):
            if ref.length == 0:
                continue
            reqs.append((self.file_key(ref.file), (ref.offset, ref.offset + ref.length)))
            idx.append(i)
        if reqs:
            results = self.kv.get_many(reqs)
            for i, (key, _), data in zip(idx, reqs, results):
                out[i] = self._check(refs[i], data, key)
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
        self.cache.put(("b", ref), node, ref.length + 64 * len(node.keys))
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
        hit = self.cache.get(("v", ref))
        if hit is not None:
            return hit  # type: ignore[return-value]
        key = self.file_key(ref.file)
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
        self.cache.put(("v", ref), node, ref.length + 256)
        return node
