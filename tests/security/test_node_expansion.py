"""Hole 4: B+tree node key expansion under ``max_decoded_node_bytes = 0``.

"No limit" is capped at 1 GiB per node body, but a 193 KB leaf whose keys share 65,533-byte
prefixes with their predecessors (and nothing with all keys) would expand to ~1 GiB of keys.
The expanded key bytes of a node are bounded by a ratio of its size whatever the config says.
"""

from __future__ import annotations

import tracemalloc

import pytest

import ocdbt_py
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.btree import KEY_EXPANSION_RATIO, decode_btree_node, encode_leaf_node
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import Statistics
from ocdbt_py.format.envelope import BTREE_NODE_MAGIC, encode_envelope
from ocdbt_py.kvstore import MemoryStore
from ocdbt_py.read.node_reader import node_body_limit
from tests.ocdbt.ocdbt_craft import RAW, DbFiles, Tree, generation, single_manifest

pytestmark = pytest.mark.timeout(120)

UNLIMITED = Config(uuid=bytes(range(16)), compression_level=None, max_decoded_node_bytes=0)


def _varints(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def expansion_leaf(n: int = 16_000, shared: int = 65_533) -> bytes:
    """Key 0 is empty (so no prefix is common to all keys); key i >= 1 is ``a * shared`` plus two
    bytes, sharing ``shared`` or ``shared + 1`` bytes with its predecessor."""
    prefixes = [0]
    suffixes = [0, shared + 2]
    key_bytes = bytearray(b"a" * shared + b"\x01\x01")
    for i in range(1, n - 1):
        hi, lo = i // 255 + 1, i % 255 + 1
        if hi == (i - 1) // 255 + 1:
            prefixes.append(shared + 1)
            suffixes.append(1)
            key_bytes.append(lo)
        else:
            prefixes.append(shared)
            suffixes.append(2)
            key_bytes += bytes([hi, lo])
    body = b"\x00\x00" + _varints([n]) + _varints(prefixes) + _varints(suffixes) + bytes(key_bytes)
    body += b"\x00" * n + b"\x00" * n  # empty inline values
    return encode_envelope(BTREE_NODE_MAGIC, body, None)


def test_leaf_is_small_but_describes_a_gigabyte() -> None:
    blob = expansion_leaf()
    assert len(blob) < 200_000
    assert 16_000 * 65_533 > 1 << 30 - 1


def test_unlimited_config_still_bounds_key_expansion() -> None:
    blob = expansion_leaf()
    limit = node_body_limit(UNLIMITED)
    assert limit == 1 << 30
    tracemalloc.start()
    try:
        with pytest.raises(CorruptionError, match="expand"):
            decode_btree_node(blob, max_body=limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak


def test_listing_such_a_database_fails_cleanly() -> None:
    db = DbFiles()
    blob = expansion_leaf()
    ref = db.append(blob, "d/nodes")
    gen = generation(1, Tree(ref, 0, Statistics(16_000, len(blob), 0)))
    db.put("manifest.ocdbt", single_manifest(UNLIMITED, [gen]))
    s = ocdbt_py.open(MemoryStore(db.as_dict()))
    with pytest.raises(CorruptionError, match="expand"):
        list(s.list())


def test_legitimate_long_shared_keys_still_decode() -> None:
    """Keys that all share one long prefix are held once (compact form), and keys with a few
    hundred shared bytes each stay well under the ratio."""
    keys = [b"p" * 60_000 + b"%05d" % i for i in range(40)]
    node = decode_btree_node(encode_leaf_node(keys, [b""] * len(keys), None), max_body=1 << 30)
    assert list(node.keys) == keys
    paths = [b"params/layer_%03d/attention/query/kernel/c/%d.%d" % (i // 20, i % 20, 0) for i in range(4_000)]
    paths.sort()
    node = decode_btree_node(encode_leaf_node(paths, [b"v"] * len(paths), 3), max_body=1 << 30)
    assert list(node.keys) == paths
    assert KEY_EXPANSION_RATIO >= 64
    assert RAW.max_decoded_node_bytes > 0
