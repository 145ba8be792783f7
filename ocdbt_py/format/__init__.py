"""Pure codecs for OCDBT's on-disk structures: bytes <-> dataclasses, no I/O.

One module per structure: :mod:`.envelope`, :mod:`.data_file_table`, :mod:`.config`,
:mod:`.manifest`, :mod:`.version_tree`, :mod:`.btree`; :mod:`.zstd_frame` bounds zstd output.
"""

from ocdbt_py.format.btree import (
    BtreeChild,
    BtreeNode,
    InteriorNode,
    LeafNode,
    decode_btree_node,
    encode_interior_node,
    encode_leaf_node,
)
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest, decode_manifest, encode_manifest
from ocdbt_py.format.version_tree import (
    BtreeGenerationReference,
    VersionNodeReference,
    VersionTreeNode,
    decode_version_tree_node,
    encode_version_tree_node,
)

__all__ = [
    "BtreeChild",
    "BtreeNode",
    "InteriorNode",
    "LeafNode",
    "decode_btree_node",
    "encode_interior_node",
    "encode_leaf_node",
    "Config",
    "DataFileId",
    "IndirectDataReference",
    "Statistics",
    "Manifest",
    "decode_manifest",
    "encode_manifest",
    "BtreeGenerationReference",
    "VersionNodeReference",
    "VersionTreeNode",
    "decode_version_tree_node",
    "encode_version_tree_node",
]
