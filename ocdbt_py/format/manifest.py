"""The manifest: config, recent generations inline, and references to older version nodes."""

from __future__ import annotations

import dataclasses

from ocdbt_py.format.config import MANIFEST_KIND_NUMBERED, Config, decode_config, encode_config
from ocdbt_py.format.data_file_table import decode_data_file_table, encode_data_file_table
from ocdbt_py.format.envelope import MANIFEST_MAGIC, decode_envelope, encode_envelope
from ocdbt_py.format.reader import Reader
from ocdbt_py.format.version_tree import (
    BtreeGenerationReference,
    VersionNodeReference,
    _collect_files,
    decode_version_interior_entries,
    decode_version_leaf_entries,
    encode_version_interior_entries,
    encode_version_leaf_entries,
    gen_ref_location,
    manifest_version_node_ranges,
    max_version_tree_height,
)

__all__ = ["Manifest", "decode_manifest", "encode_manifest", "MAX_MANIFEST_BODY"]

#: Largest decoded manifest body accepted (65536 inline versions plus their table fit easily).
MAX_MANIFEST_BODY = 64 << 20


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A decoded manifest.

    ``versions`` is empty only for the config-only ``manifest.ocdbt`` of the numbered kind.
    """

    config: Config
    versions: tuple[BtreeGenerationReference, ...] = ()
    version_nodes: tuple[VersionNodeReference, ...] = ()

    @property
    def latest(self) -> BtreeGenerationReference:
        """The newest generation."""
        return self.versions[-1]


def decode_manifest(data: bytes | memoryview, *, path: str | None = None) -> Manifest:
    """Decode a manifest file (envelope included)."""
    body = decode_envelope(data, MANIFEST_MAGIC, max_body=MAX_MANIFEST_BODY, path=path)
    r = Reader(body, path=path)
    config = decode_config(r)
    if config.manifest_kind == MANIFEST_KIND_NUMBERED:
        r.expect_end("config-only manifest")
        return Manifest(config)
    files = decode_data_file_table(r)
    versions = decode_version_leaf_entries(r, files, config.version_tree_arity_log2)
    a = config.version_tree_arity_log2
    nodes = decode_version_interior_entries(r, files, a, None, max_version_tree_height(a))
    r.expect_end("manifest")
    _check_node_ranges(r, versions, nodes, a)
    return Manifest(config, versions, nodes)


def _check_node_ranges(
    r: Reader, versions: tuple[BtreeGenerationReference, ...], nodes: tuple[VersionNodeReference, ...], a: int
) -> None:
    allowed = {h: (lo, hi) for h, lo, hi in manifest_version_node_ranges(versions[-1].generation_number, a)}
    for ref in nodes:
        rng = allowed.get(ref.height)
        if rng is None or not rng[0] <= ref.generation_number <= rng[1]:
            raise r.error(
                f"version node reference (height {ref.height}, generation {ref.generation_number}) "
                f"is outside the range its height may cover"
            )
        most = ref.generation_number - rng[0] + 1  # generations from the range's start up to it
        if ref.num_generations > most:
            raise r.error(f"version node reference of generation {ref.generation_number} claims "
                          f"{ref.num_generations} generations, at most {most} fit")
    if nodes and nodes[-1].generation_number >= versions[0].generation_number:
        raise r.error("version node generations overlap the inline versions")
    if nodes and nodes[-1].commit_time >= versions[0].commit_time:
        raise r.error("version node commit time is not before the inline versions'")


def encode_manifest(manifest: Manifest) -> bytes:
    """Encode a manifest (envelope included), compressed per its config."""
    body = bytearray()
    config = manifest.config
    if not manifest.versions:
        if config.manifest_kind != MANIFEST_KIND_NUMBERED:
            raise ValueError("a single-kind manifest needs at least one version")
        encode_config(body, config)
    else:
        # numbered manifest files are stored with kind 0
        encode_config(body, dataclasses.replace(config, manifest_kind=0))
        locs = [gen_ref_location(v) for v in manifest.versions] + [n.location for n in manifest.version_nodes]
        files, index = _collect_files(locs)
        encode_data_file_table(body, files)
        encode_version_leaf_entries(body, manifest.versions, index)
        encode_version_interior_entries(body, manifest.version_nodes, index, with_height=True)
    return encode_envelope(MANIFEST_MAGIC, body, config.compression_level)
