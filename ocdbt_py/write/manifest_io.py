"""Reading the manifest with the token a conditional write needs, and replacing it atomically.

*Single* kind: ``manifest.ocdbt`` is replaced by one compare-and-swap on its storage
generation.  *Numbered* kind: the config-only ``manifest.ocdbt`` is written once ("only if
absent"), each commit creates ``manifest.<16 hex>`` only if absent, numbered files more than
128 generations older are deleted (errors ignored), and the new file is confirmed by reading
the latest manifest again, as TensorStore does.
"""

from __future__ import annotations

import contextlib
import dataclasses

from ocdbt_py.errors import ConditionFailedError, CorruptionError, NotFoundError, OcdbtError
from ocdbt_py.format.config import MANIFEST_KIND_NUMBERED, Config
from ocdbt_py.format.manifest import Manifest, decode_manifest, encode_manifest
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.read.version_read import (
    MANIFEST_KEY,
    find_generation,
    list_numbered_manifests,
    numbered_manifest_key,
)

__all__ = ["ManifestState", "ManifestIO", "NUMBERED_MANIFESTS_TO_KEEP"]

#: A commit of generation ``G`` deletes numbered manifests ``n`` with ``G - n > 128``.
NUMBERED_MANIFESTS_TO_KEEP = 128
_MAX_MANIFEST_FILE = 256 << 20


@dataclasses.dataclass(frozen=True)
class ManifestState:
    """What a writer knows about the stored manifest.

    ``manifest`` is ``None`` when no generation has been committed yet; ``config`` is the
    stored config when one exists (a numbered database may have one without generations).
    ``token`` is what the next conditional write is conditioned on: the storage generation
    of ``manifest.ocdbt`` (single kind) or the latest numbered generation (numbered kind).
    """

    manifest: Manifest | None
    config: Config | None
    token: str | int | None
    numbered_present: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """The key the latest manifest was read from."""
        if self.config is not None and self.config.manifest_kind == MANIFEST_KIND_NUMBERED and self.manifest:
            return numbered_manifest_key(self.manifest.latest.generation_number)
        return MANIFEST_KEY


def _decode(kv: KvStore, key: str, data: bytes) -> Manifest:
    if len(data) > _MAX_MANIFEST_FILE:
        raise CorruptionError(f"manifest of {len(data)} bytes is implausibly large", path=f"{kv.url}/{key}")
    return decode_manifest(data, path=f"{kv.url}/{key}")


class ManifestIO:
    """Manifest reads and conditional writes on one :class:`KvStore`."""

    def __init__(self, kv: KvStore):
        self.kv = kv

    # -- reading -----------------------------------------------------------------------------
    def read(self) -> ManifestState:
        """The current manifest and its token."""
        kv = self.kv
        data, gen = kv.get_with_generation(MANIFEST_KEY)
        if data is None:
            return ManifestState(None, None, None)
        top = _decode(kv, MANIFEST_KEY, data)
        if top.config.manifest_kind != MANIFEST_KIND_NUMBERED:
            return ManifestState(top, top.config, gen)
        for _ in range(16):
            present = tuple(list_numbered_manifests(kv))
            if not present:
                return ManifestState(None, top.config, 0, ())
            g = present[-1]
            key = numbered_manifest_key(g)
            raw = kv.get(key)
            if raw is None:  # pruned or replaced meanwhile: list again
                continue
            m = _decode(kv, key, raw)
            if not m.versions or m.latest.generation_number != g:
                raise CorruptionError("numbered manifest's latest generation does not match its name",
                                      path=f"{kv.url}/{key}")
            mc, tc = m.config, top.config
            if mc.uuid != tc.uuid or mc.version_tree_arity_log2 != tc.version_tree_arity_log2:
                raise CorruptionError("numbered manifest's config differs from manifest.ocdbt",
                                      path=f"{kv.url}/{key}")
            return ManifestState(Manifest(top.config, m.versions, m.version_nodes), top.config, g, present)
        raise CorruptionError(f"numbered manifests of {kv.url} kept vanishing while being read")

    # -- writing -----------------------------------------------------------------------------
    def try_write(self, old: ManifestState, new: Manifest, reader: NodeReader | None = None) -> ManifestState | None:
        """Replace the manifest ``old`` describes by ``new``; ``None`` if another writer won.

        Other failures (I/O errors) propagate.  ``reader`` resolves old generations when a
        numbered manifest is confirmed.
        """
        if new.config.manifest_kind == MANIFEST_KIND_NUMBERED:
            return self._write_numbered(old, new, reader)
        try:
            token = self.kv.set_if(MANIFEST_KEY, encode_manifest(new), if_generation=old.token)  # type: ignore[arg-type]
        except ConditionFailedError:
            return None
        return ManifestState(new, new.config, token)

    def _write_numbered(self, old: ManifestState, new: Manifest, reader: NodeReader | None) -> ManifestState | None:
        kv = self.kv
        if old.config is None:
            try:
                kv.set_if(MANIFEST_KEY, encode_manifest(Manifest(new.config)), if_generation=None)
            except ConditionFailedError:
                return None
        prev = old.manifest.latest.generation_number if old.manifest is not None else 0
        g = new.latest.generation_number
        if g != prev + 1:
            raise ValueError(f"numbered manifest {g} does not follow {prev}")
        try:
            kv.set_if(numbered_manifest_key(g), encode_manifest(new), if_generation=None)
        except ConditionFailedError:
            return None
        doomed = [n for n in old.numbered_present if g - n > NUMBERED_MANIFESTS_TO_KEEP]
        for n in doomed:
            with contextlib.suppress(OcdbtError, OSError):
                kv.delete(numbered_manifest_key(n))
        # Confirm: the latest manifest must hold exactly our generation g (a writer that was
        # more than 128 generations behind could have re-created a pruned file).
        state = self.read()
        if state.manifest is None:
            return None
        if state.manifest.latest.generation_number == g:
            ok = state.manifest.latest == new.latest
        else:
            rd = reader if reader is not None else NodeReader(kv, new.config)
            try:
                ok = find_generation(rd, state.manifest, g) == new.latest
            except NotFoundError:
                ok = False
        if not ok:
            return None
        present = tuple(sorted(set(old.numbered_present) - set(doomed) | {g}))
        return ManifestState(new, new.config, g, present)


def is_numbered(config: Config) -> bool:
    """Whether ``config`` uses numbered manifests."""
    return config.manifest_kind == MANIFEST_KIND_NUMBERED
