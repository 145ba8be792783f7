"""The commit loop: stage values, rewrite the B+tree, grow the version tree, swap the manifest.

One commit (TensorStore's non-distributed protocol):

1. Take the manifest (the cached copy first).  With no database yet, first write the initial
   manifest holding an empty generation 1, unless ``assume_config`` is set.
2. Check the commit's conditions against the latest version.
3. Stage out-of-line values (first attempt only; retries reuse their references).
4. Rewrite the touched B+tree path bottom-up; build the new manifest (maybe version nodes).
5. Write every data file, then replace the manifest with one conditional write.
6. If another writer got there first, re-read the manifest and go back to 2.

Atomicity comes from the single conditional manifest write: data files are immutable, have
random names and are written before the manifest that references them, so a crash at any
point leaves the last committed version intact (plus, at worst, unreferenced data files).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Any

from ocdbt_py.errors import ConditionFailedError, ReadOnlyError, UnsupportedError
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest
from ocdbt_py.format.version_tree import BtreeGenerationReference, VersionNodeReference, VersionTreeNode
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.read.btree_read import lookup_many
from ocdbt_py.read.cache import LruCache
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.write.btree_writer import TreeWriter
from ocdbt_py.write.data_writer import DataWriters
from ocdbt_py.write.manifest_io import ManifestIO, ManifestState
from ocdbt_py.write.mutations import ChunkedValue, MutationSet, value_length
from ocdbt_py.write.options import ConfigConstraints, WriterOptions
from ocdbt_py.write.version_tree_writer import add_generation, initial_manifest, next_commit_time

__all__ = ["Writer", "supports_conditional_writes", "CommitResult", "Condition"]

#: Default number of lost manifest races before a commit gives up.
DEFAULT_MAX_RETRIES = 2000
#: A commit still retrying after this long writes its values again, so the data files it
#: references are always much younger than garbage collection's grace period (one hour).
RESTAGE_AFTER_SECONDS = 600.0
_ZERO = Statistics(0, 0, 0)


def supports_conditional_writes(kv: KvStore) -> bool:
    """Whether ``kv`` implements conditional writes (needed to commit).

    A backend that implements them but finds at run time that it cannot make them atomic
    raises :class:`UnsupportedError` from the commit instead.
    """
    return kv.supports_conditional_writes


@dataclasses.dataclass(frozen=True)
class CommitResult:
    """The manifest after a commit, and whether the commit created a new generation."""

    manifest: Manifest
    manifest_key: str
    created: bool

    @property
    def generation(self) -> int:
        """The latest generation after the commit."""
        return self.manifest.latest.generation_number


@dataclasses.dataclass(frozen=True)
class Condition:
    """A requirement on the base version: the key's stored entry, or its value bytes.

    ``entry`` compares what the leaf holds (inline bytes or the exact reference, which is how
    TensorStore's storage generations behave); ``value`` compares the value's bytes.
    """

    kind: str  # "entry" | "value"
    expected: Any  # None (absent), bytes, or an IndirectDataReference


class Writer:
    """Commits mutation sets to the database in ``kv``; one commit at a time per writer."""

    def __init__(
        self,
        kv: KvStore,
        constraints: ConfigConstraints,
        options: WriterOptions,
        cache: LruCache[object],
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ):
        if kv.read_only:
            raise ReadOnlyError(f"{kv.url} is read-only")
        if not supports_conditional_writes(kv):
            raise UnsupportedError(
                f"{kv.url} does not support atomic conditional writes, which committing to an "
                f"OCDBT database needs (local directories and memory stores do)"
            )
        self.kv = kv
        self.constraints = constraints
        self.options = options
        self.cache = cache
        self.max_retries = max_retries
        self.io = ManifestIO(kv)
        self._lock = threading.RLock()
        self._state: ManifestState | None = None
        self._new_config: Config | None = None
        self._uuid: bytes | None = None
        #: Number of lost manifest races (for tests and benchmarks).
        self.conflicts = 0

    # -- state -------------------------------------------------------------------------------
    def _check_config(self, config: Config) -> None:
        self.constraints.check(config, self.kv.url)
        if self._uuid is not None and config.uuid != self._uuid:
            raise ConditionFailedError(
                f"the database at {self.kv.url} was replaced by another one (uuid changed)"
            )
        self._uuid = config.uuid

    def _read(self) -> ManifestState:
        state = self.io.read()
        if state.config is not None:
            self._check_config(state.config)
        return state

    def config_for_new(self) -> Config:
        """The config a new database would get (fixed once chosen, uuid included)."""
        if self._new_config is None:
            self._new_config = self.constraints.create()
        return self._new_config

    def load(self) -> tuple[Manifest, str]:
        """Re-read the manifest; with no database yet, a placeholder with no versions."""
        with self._lock:
            state = self._read()
            self._state = state
            return self._view(state)

    def _view(self, state: ManifestState) -> tuple[Manifest, str]:
        if state.manifest is not None:
            return state.manifest, state.key
        config = state.config if state.config is not None else self.config_for_new()
        return Manifest(config), state.key

    def reader(self, config: Config) -> NodeReader:
        """A node reader sharing the writer's cache."""
        return NodeReader(self.kv, config, self.cache)

    # -- committing ----------------------------------------------------------------------------
    def commit(self, muts: MutationSet) -> CommitResult:
        """Apply ``muts`` as one new generation (or none if nothing changes).

        Raises :class:`ConditionFailedError` when a condition does not hold, or when the
        manifest race was lost ``max_retries`` times.
        """
        with self._lock:
            try:
                return self._commit(muts)
            except BaseException:
                self._state = None  # the cache may be stale after any failure
                raise

    def _ensure_exists(self, state: ManifestState) -> ManifestState:
        """Write the initial manifest (empty generation 1) if there is none."""
        while state.manifest is None:
            config = state.config if state.config is not None else self.config_for_new()
            empty = BtreeGenerationReference(1, None, 0, _ZERO, next_commit_time(None))
            written = self.io.try_write(state, initial_manifest(config, empty), self.reader(config))
            state = written if written is not None else self._read()
        return state

    def _commit(self, muts: MutationSet) -> CommitResult:
        writers = DataWriters(
            self.kv,
            value_prefix=self.options.value_data_prefix,
            btree_prefix=self.options.btree_node_data_prefix,
            version_prefix=self.options.version_tree_node_data_prefix,
            target_size=self.options.target_data_file_size,
        )
        staged: dict[int, Any] | None = None
        staged_at = 0.0
        state = self._state if self._state is not None else self._read()
        attempt = 0
        try:
            while True:
                if state.manifest is None and not self.options.assume_config:
                    state = self._ensure_exists(state)
                m = state.manifest
                config = m.config if m is not None else (state.config or self.config_for_new())
                reader = self.reader(config)
                latest = m.latest if m is not None else None
                root = (latest.root, latest.root_height) if latest is not None else (None, 0)
                self._check_conditions(reader, root, muts.conditions)
                if staged is not None and time.monotonic() - staged_at > RESTAGE_AFTER_SECONDS:
                    staged = None  # stay well inside garbage collection's grace period
                if staged is None:
                    staged = self._stage(muts, config, writers)
                    staged_at = time.monotonic()
                result = self._build(reader, state, config, root, muts, staged, writers)
                if result is None:  # nothing changed: no new generation
                    self._state = state
                    assert m is not None
                    return CommitResult(m, state.key, False)
                writers.flush()
                written = self.io.try_write(state, result, reader)
                if written is not None:
                    self._state = written
                    return CommitResult(result, written.key, True)
                self.conflicts += 1
                attempt += 1
                if attempt > self.max_retries:
                    raise ConditionFailedError(
                        f"gave up committing to {self.kv.url} after losing the manifest race "
                        f"{attempt} times to concurrent writers"
                    )
                time.sleep(random.uniform(0, min(0.05, 0.0002 * (1 << min(attempt, 8)))))
                state = self._read()
        finally:
            writers.discard()

    def _stage(self, muts: MutationSet, config: Config, writers: DataWriters) -> dict[int, Any]:
        """Values larger than the inline limit go to the value writer, in key order.

        Returns the references of the staged values by position in ``muts.sorted_keys()``.
        """
        limit = config.max_inline_value_bytes
        staged: dict[int, Any] = {}
        append = writers.value.append
        w = muts.writes
        values: list[Any] = list(map(w.__getitem__, muts.sorted_keys()))
        bytes_t = bytes
        big = [i for i, v in enumerate(values) if v is not None and (type(v) is not bytes_t or len(v) > limit)]
        run: list[int] = []  # consecutive plain bytes values go through append_many
        for i in big:
            v = values[i]
            if type(v) is bytes_t:
                run.append(i)
                continue
            if run:
                staged.update(zip(run, writers.value.append_many([values[j] for j in run])))
                run = []
            if v is not None and not isinstance(v, IndirectDataReference) and value_length(v) > limit:
                staged[i] = append(v.parts if isinstance(v, ChunkedValue) else v)
        if run:
            staged.update(zip(run, writers.value.append_many([values[j] for j in run])))
        return staged

    def _build(
        self,
        reader: NodeReader,
        state: ManifestState,
        config: Config,
        root: tuple[IndirectDataReference | None, int],
        muts: MutationSet,
        staged: dict[int, Any],
        writers: DataWriters,
    ) -> Manifest | None:
        mutations = muts.sorted(staged)
        tree = TreeWriter(reader, config, writers.btree.append)
        new_root = tree.apply(root[0], root[1], mutations)
        m = state.manifest
        if new_root is None:
            if m is not None:
                return None
            new_root_ref = None
            height = 0
            stats = _ZERO
        else:
            new_root_ref, height, stats = new_root.location, new_root.height, new_root.statistics
        gen = BtreeGenerationReference(0, new_root_ref, height, stats, next_commit_time(m))
        if m is None:
            return initial_manifest(config, gen)

        def read_node(ref: VersionNodeReference) -> VersionTreeNode:
            return reader.version_node(ref.location, ref.height, ref.generation_number)

        return add_generation(m, gen, read_node=read_node, write=writers.version.append)

    def _check_conditions(
        self,
        reader: NodeReader,
        root: tuple[IndirectDataReference | None, int],
        conditions: dict[bytes, Condition],
    ) -> None:
        if not conditions:
            return
        keys = sorted(conditions)
        found = lookup_many(reader, root, keys)
        for k, have in zip(keys, found):
            cond = conditions[k]
            want = cond.expected
            if cond.kind == "entry":
                ok = have == want
            elif want is None or have is None:
                ok = want is None and have is None
            elif isinstance(have, bytes):
                ok = have == want
            else:
                ok = have.length == len(want) and reader.read(have) == want
            if not ok:
                raise ConditionFailedError(
                    f"condition on key {k!r} failed: it changed since it was read or is not the "
                    f"expected value"
                )
