"""``MultiTierCheckpointManager``: frequent local checkpoints, rarer persistent ones.

The emergency-checkpointing scheme of Orbax's ``experimental.emergency.CheckpointManager``
for a JAX job whose global mesh has a data-parallel *replica* axis:

* **Local tier** -- every process saves, often, the shards its own devices hold into its own
  local directory (a local disk or a RAM disk), as its own primary: no barrier, no waiting for
  other processes.  Layout (as Orbax's local tier): ``<local>/<step>/state/`` (OCDBT + Zarr v3,
  only this process's chunks; its ``_METADATA`` says ``store_array_data_equal_to_fill_value:
  false`` so that readers take the absent chunks as fill values rather than damage),
  ``process_metadata/{global_process_metadata.json, mesh_metadata.json}`` (the topology),
  ``_CHECKPOINT_METADATA``, ``commit_success.txt``.  A step appears by an atomic rename once
  complete.
* **Persistent tier** -- the processes of replica 0 save, less often, a normal checkpoint of
  the whole state (item ``default``, OCDBT + Zarr v3) that Orbax's own ``CheckpointManager``
  restores; only those processes take part (barriers among them alone).
* **Restore** takes the newest step complete somewhere, decided identically by every process
  after exchanging local step lists through the ``jax.distributed`` key-value store: if every
  replica has it locally, each process reads its own local tier; if one replica has it (a
  process restarted on a fresh host lost its local tier), that replica reads its local tier
  and a JAX collective copies the values to the other replicas; otherwise every process reads
  its regions from the persistent tier.  A local step written on another topology (other
  process count, device ids or mesh, or another sharding of the state) is never used: the
  restore falls back to the persistent tier and says why (:attr:`last_restore`).

Every process creates the manager and calls ``save``/``restore``/``reload`` with the same
arguments in the same order (they take part in shared decisions).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.manager import save_policy as sp
from ocdbt_py.checkpoint.manager.exchange import CoordinationTimeoutError, Exchange
from ocdbt_py.checkpoint.manager.lifecycle import Lifecycle
from ocdbt_py.checkpoint.manager.mesh_metadata import (
    PROCESS_METADATA,
    ReplicaLayout,
    Topology,
    foreign_state_problem,
    state_fingerprint,
)
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.manager.preemption import PreemptionWatcher
from ocdbt_py.checkpoint.manager.preservation import LatestN, PreservationPolicy, StepInfo
from ocdbt_py.checkpoint.manager.steps import METRICS_FILE, METRICS_ITEM, committed, metrics_json, read_step_info
from ocdbt_py.checkpoint.manager.steps import cleanup as cleanup_root
from ocdbt_py.checkpoint.manager.tier import Tier
from ocdbt_py.checkpoint.manager.tier_plan import (
    LOCAL,
    PEER,
    PERSISTENT,
    RestorePlan,
    complete_per_replica,
    plan_restore,
)
from ocdbt_py.checkpoint.restore.api import restore
from ocdbt_py.checkpoint.saving.api import JsonItem, save
from ocdbt_py.checkpoint.saving.atomic import fsync_dir
from ocdbt_py.checkpoint.saving.distributed import _jax_client, group_coordinator
from ocdbt_py.checkpoint.saving.layout_writer import COMMIT_MARKER, commit_marker
from ocdbt_py.errors import CorruptionError, MissingDependencyError, OcdbtError, StorageError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = ["MultiTierCheckpointManager", "RestoreInfo", "CoordinationTimeoutError", "STATE_ITEM",
           "PERSISTENT_ITEM", "PROCESS_STATE_ITEM"]

log = logging.getLogger(__name__)

#: The item holding the state in a local step (Orbax's name).
STATE_ITEM = "state"
#: The item holding the state in a persistent step (a single-item Orbax CheckpointManager).
PERSISTENT_ITEM = "default"
#: The JSON item (``<step>/process_state/metadata``, Orbax's ``JsonSave`` layout) holding
#: every process's ``process_state``: ``{"format", "process_count", "states": [...]}``.
PROCESS_STATE_ITEM = "process_state"
_PROCESS_STATE_FORMAT = "ocdbt_py.process_state/1"
_MAX_PROCESS_STATE = 1 << 20  # bytes of one process's document
_STAGING = ".orbax-checkpoint-tmp-multitier"
_PROCESS_METADATA_HANDLER = (
    "orbax.checkpoint.experimental.emergency.process_metadata_checkpoint_handler.ProcessMetadataCheckpointHandler")
_META_KEY = "ocdbt_py_multitier"
#: Keyword arguments of :func:`ocdbt_py.checkpoint.save` the manager passes through.
SAVE_OPTIONS = frozenset({"use_compression", "chunk_byte_size", "ocdbt_target_data_file_size", "keep_copy_buffer",
                          "workers", "sync"})
_RESTORE_ATTEMPTS = 4
#: Defaults (immutable): local every 10 steps keeping the newest 2, persistent every 100.
DEFAULT_LOCAL_POLICY = sp.FixedInterval(10)
DEFAULT_LOCAL_PRESERVATION = LatestN(2)
DEFAULT_PERSISTENT_POLICY = sp.FixedInterval(100)

_ids = itertools.count()
_ids_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RestoreInfo:
    """Where the last :meth:`MultiTierCheckpointManager.restore` read from.

    ``source`` is ``"local"`` (every process its own local tier), ``"peer"`` (replica
    ``replica`` read its local tiers and broadcast to the others) or ``"persistent"``;
    ``notes`` say why local steps were not used (changed topology, failed reads, ...);
    ``process_state`` is this process's own JSON document saved with the step (``None`` when
    the step was saved without one).
    """

    step: int
    source: str
    replica: int | None
    notes: tuple[str, ...] = ()
    process_state: Any = None



def _info_doc(info: StepInfo | None) -> list[Any]:
    """A step's retention facts as JSON (for the exchange)."""
    return [info.time, dict(info.metrics) if info.metrics is not None else None] if info else [0.0, None]


def _info_from_doc(step: int, doc: Any) -> StepInfo:
    if not isinstance(doc, list) or len(doc) != 2 or not isinstance(doc[0], (int, float)):
        return StepInfo(step, 0.0)
    return StepInfo(step, float(doc[0]), doc[1] if isinstance(doc[1], dict) else None)


def _checked_arguments(policies: Mapping[str, Any], preservations: Mapping[str, Any],
                       save_options: Mapping[str, Any] | None, timeout_s: float, persistent_item: Any
                       ) -> dict[str, Any]:
    """The manager's arguments checked (``TypeError``/``ValueError``); the save options."""
    for what, policy in policies.items():
        if not callable(getattr(policy, "should_save", None)):
            raise TypeError(f"{what}={policy!r} is not a save policy (it has no should_save method)")
    for what, keep in preservations.items():
        if keep is not None and not callable(getattr(keep, "keep", None)):
            raise TypeError(f"{what}={keep!r} is not a preservation policy (it has no keep method)")
    opts = dict(save_options or {})
    unknown = set(opts) - SAVE_OPTIONS
    if unknown:
        raise TypeError(f"unknown save_options {sorted(unknown)} (known: {sorted(SAVE_OPTIONS)})")
    if not timeout_s > 0:
        raise ValueError("coordination_timeout_secs must be positive")
    if not isinstance(persistent_item, str) or not persistent_item or "/" in persistent_item \
            or persistent_item in (PROCESS_STATE_ITEM, METRICS_ITEM, PROCESS_METADATA):
        raise ValueError(f"persistent_item={persistent_item!r} is not a usable item name")
    return opts


class MultiTierCheckpointManager(Lifecycle):
    """Frequent process-local checkpoints plus rarer persistent ones, restored from the
    fastest tier that has the newest step (see the module documentation).

    >>> mgr = MultiTierCheckpointManager("/mnt/ramdisk/ckpt", "gs://bucket/run1",
    ...                                  global_mesh=mesh, abstract_state=abstract)  # doctest: +SKIP
    >>> if mgr.latest_step() is not None:
    ...     state = mgr.restore()
    >>> for step in range(start, steps):
    ...     state = train_step(state)
    ...     mgr.save(step, state)
    >>> mgr.close()

    * ``local_directory``: a local path, one per process; ``{process_index}`` in it is
      replaced by the JAX process index (handy when processes share a machine).
    * ``persistent_directory``: a path or fsspec URL every process can read (shared storage).
    * ``global_mesh``: the ``jax.sharding.Mesh`` of the state; ``replica_axis_index`` names its
      data-parallel axis (each process's devices must lie in one replica).
    * ``abstract_state``: a tree of ``jax.ShapeDtypeStruct`` (with shardings) or ``jax.Array``
      describing the state, the default restore target.
    * ``local_policy``/``persistent_policy``: when each tier saves (save policies of
      :mod:`~ocdbt_py.checkpoint.manager.save_policy`); ``local_preservation``/
      ``persistent_preservation``: what each tier keeps (``None``: everything).
    * ``async_save``: ``save`` returns after host copies (the local write, and the persistent
      one where it happens, continue in the background; a persistent save waits for the local
      save of the same step first).
    * ``save_options``: passed to :func:`ocdbt_py.checkpoint.save` for both tiers
      (``use_compression``, ``chunk_byte_size``, ``workers``, ...); ``local_sync``: fsync
      local steps (off by default: a local step is meant to survive a process restart, the
      persistent tier covers host crashes).
    * ``coordination_timeout_secs``: how long a process waits for the others in a shared
      decision or a persistent save's barrier before raising
      :class:`~ocdbt_py.checkpoint.manager.exchange.CoordinationTimeoutError`.
    * ``persistent_item``: the item name of the state in persistent steps (``"default"``, as
      Orbax's emergency manager with several replicas; it uses ``"state"`` with one).
    * ``save(..., process_state=doc)``: each process's own JSON state (a data iterator's
      position) is saved with the step; ``restore(..., with_process_state=True)`` gives it back.

    Limitations: the state is one tree of ``jax.Array`` (no NumPy or JSON leaves); a peer
    restore needs every leaf replicated across replicas (a ``NamedSharding`` on the global
    mesh that does not use the replica axis), otherwise the persistent tier is used; managers
    must be created in the same order in every process (their coordination keys are numbered).
    """

    def __init__(
        self,
        local_directory: str | os.PathLike[str],
        persistent_directory: str | os.PathLike[str] | KvStore,
        *,
        global_mesh: Any,
        abstract_state: Any = None,
        replica_axis_index: int = 0,
        local_policy: sp.SavePolicy = DEFAULT_LOCAL_POLICY,
        local_preservation: PreservationPolicy | None = DEFAULT_LOCAL_PRESERVATION,
        persistent_policy: sp.SavePolicy = DEFAULT_PERSISTENT_POLICY,
        persistent_preservation: PreservationPolicy | None = None,
        async_save: bool = True,
        step_name_format: StepNameFormat | None = None,
        storage_options: dict[str, Any] | None = None,
        save_options: Mapping[str, Any] | None = None,
        local_sync: bool = False,
        coordination_timeout_secs: float = 120.0,
        cleanup: bool = True,
        persistent_item: str = PERSISTENT_ITEM,
    ):
        MissingDependencyError.require("jax", "jax", "MultiTierCheckpointManager")
        # optional: JAX is imported only for trees that hold JAX objects
        import jax

        self._save_options = _checked_arguments(
            {"local_policy": local_policy, "persistent_policy": persistent_policy},
            {"local_preservation": local_preservation, "persistent_preservation": persistent_preservation},
            save_options, coordination_timeout_secs, persistent_item)
        self.persistent_item = persistent_item
        self._local_sync = bool(local_sync)
        self.global_mesh = global_mesh
        self.abstract_state = abstract_state
        self.local_policy = local_policy
        self.persistent_policy = persistent_policy
        self.async_save = bool(async_save)
        self.timeout_s = float(coordination_timeout_secs)
        self.step_name_format = step_name_format or StepNameFormat()

        self.process_index = int(jax.process_index())
        self.process_count = int(jax.process_count())
        self.layout = ReplicaLayout.of(global_mesh, replica_axis_index)
        replica = self.layout.replica_of(self.process_index)
        if replica is None:
            raise ValueError(f"process {self.process_index} has no device in the global mesh")
        missing = [p for p in range(self.process_count) if self.layout.replica_of(p) is None]
        if missing:
            raise ValueError(f"processes {missing} have no device in the global mesh; every process must")
        self.replica = replica
        self.topology = Topology.current(global_mesh)
        self._local_devices = frozenset(int(d.id) for d in jax.local_devices())
        self._persistent_group = self.layout.replicas[0]
        self.in_persistent_group = self.process_index in self._persistent_group

        with _ids_lock:
            self._id = next(_ids)

        client = _jax_client() if self.process_count > 1 else None
        self._exchange = Exchange(f"ocdbt_py_multitier/{self._id}", self.process_index, self.process_count,
                                  client, self.timeout_s)
        self._round = 0
        self._persistent_saves = 0
        self._local_saves = 0

        path = os.fspath(local_directory)
        if "{process_index}" in path:
            path = path.replace("{process_index}", str(self.process_index))
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the local directory {path}: {e}") from e
        self.local_directory = os.path.abspath(path)
        self.local_kv: KvStore = open_kvstore(self.local_directory)
        self.persistent_kv: KvStore = open_kvstore(persistent_directory, storage_options,
                                                   read_only=not self.in_persistent_group)
        self.persistent_directory = self.persistent_kv.url

        # Steps complete in some replica's local tiers, as every process knows them: from the
        # last exchange, plus this manager's committed local saves, minus what retention
        # dropped (the same in every process: retention sees this shared view).
        self._shared_local: dict[int, StepInfo] = {}
        self._shared_lock = threading.Lock()
        self._local = Tier("local", self.local_kv, self.step_name_format, local_preservation, deletes=True,
                           on_forget=self._forget_local, shared_infos=self._shared_infos)
        persistent_primary = self.in_persistent_group and self.process_index == self._persistent_group[0]
        self._persistent = Tier("persistent", self.persistent_kv if self.in_persistent_group else None,
                                self.step_name_format, persistent_preservation, deletes=persistent_primary)
        self._closed = False
        self._preemption = (PreemptionWatcher() if sp.uses(local_policy, sp.Preemption)
                            or sp.uses(persistent_policy, sp.Preemption) else None)
        self.last_restore: RestoreInfo | None = None
        self._gathered_infos: dict[int, StepInfo] = {}
        self._foreign_checks: dict[tuple[str, str | None], str | None] = {}

        if cleanup:
            cleanup_root(self.local_kv, self.step_name_format)
            if persistent_primary:
                cleanup_root(self.persistent_kv, self.step_name_format)
        self.reload()

    # ---- shared view ----------------------------------------------------------------------

    def _next_round(self, what: str) -> str:
        self._round += 1
        return f"{self._round}-{what}"

    def _local_report(self, fingerprint: str | None, target: Any = None) -> tuple[list[int], dict[int, str]]:
        """This process's local steps usable on the current topology, and why the others
        are not."""
        self._local.scan()
        usable: list[int] = []
        reasons: dict[int, str] = {}
        for step in self._local.steps():
            why = self._local_step_problem(step, fingerprint, target)
            if why is None:
                usable.append(step)
            else:
                reasons[step] = why
        return usable, reasons

    def _local_step_problem(self, step: int, fingerprint: str | None, target: Any = None) -> str | None:
        name = self.step_name_format.name(step)

        try:
            recorded = Topology.read(PrefixStore(self.local_kv, f"{name}/{PROCESS_METADATA}"))
            meta = read_json(self.local_kv, f"{name}/_CHECKPOINT_METADATA", 16 << 20)
        except OcdbtError as e:
            return f"unreadable metadata: {e}"
        if recorded is None:
            return f"it has no {PROCESS_METADATA}/"
        why = recorded.mismatch(self.topology, self.process_index)
        if why is not None:
            return f"written on another topology: {why}"
        custom = meta.get("custom_metadata") if isinstance(meta, dict) else None
        mine = custom.get(_META_KEY) if isinstance(custom, dict) else None
        if not isinstance(mine, dict):  # written by Orbax's emergency manager: compare its metadata
            return self._foreign_step_problem(name, fingerprint, target)
        if fingerprint is not None and mine.get("state_fingerprint") != fingerprint:
            return "the state's tree, shapes, dtypes or shardings differ from the restore target"
        if mine.get("process_state"):
            try:
                self._read_states(PrefixStore(self.local_kv, name), required=True)
            except OcdbtError as e:
                return f"its process states are incomplete: {e}"
        return None

    def _foreign_step_problem(self, name: str, fingerprint: str | None, target: Any) -> str | None:
        """A local step without our fingerprint (Orbax's emergency manager wrote it): usable
        when its recorded tree, shapes, dtypes and shardings equal the target's."""
        if target is None:
            return "it has no state fingerprint and there is no target to compare it with"
        key = (name, fingerprint)
        if key not in self._foreign_checks:
            try:
                why = foreign_state_problem(os.path.join(self.local_directory, name, STATE_ITEM), target)
            except OcdbtError as e:
                why = f"unreadable state metadata: {e}"
            self._foreign_checks[key] = None if why is None else f"(written without a fingerprint) {why}"
        return self._foreign_checks[key]

    def _persistent_listing(self) -> list[int]:

        return sorted(committed(self.persistent_kv, self.step_name_format))

    def _gather(self, what: str, fingerprint: str | None, exclude: set[int] | None = None, target: Any = None
                ) -> tuple[dict[int, set[int]], list[int], dict[int, dict[str, str]]]:
        """Exchange every process's usable local steps (and process 0's persistent listing)."""
        usable, reasons = self._local_report(fingerprint, target)
        usable = [s for s in usable if s not in (exclude or set())]
        doc: dict[str, Any] = {"local": usable, "reasons": {str(k): v for k, v in list(reasons.items())[-8:]},
                               "infos": {str(s): _info_doc(self._local.info(s)) for s in usable}}
        if self.process_index == 0:
            doc["persistent"] = self._persistent_listing()
        docs = self._exchange.allgather(self._next_round(what), doc)
        local = {p: {int(s) for s in d.get("local", [])} for p, d in enumerate(docs)}
        persistent = [int(s) for s in docs[0].get("persistent", [])]
        why = {p: {str(k): str(v) for k, v in d.get("reasons", {}).items()} for p, d in enumerate(docs)}
        self._gathered_infos = {}
        for d in reversed(docs):  # the lowest process reporting a step gives its info
            for k, v in (d.get("infos") or {}).items():
                self._gathered_infos[int(k)] = _info_from_doc(int(k), v)
        return local, persistent, why

    def reload(self) -> None:
        """Re-read both tiers and agree on the steps with the other processes (every process
        must call it)."""
        fp = state_fingerprint(self.abstract_state) if self.abstract_state is not None else None
        local, persistent, _ = self._gather("reload", fp, target=self.abstract_state)
        self._persistent.scan()
        if not self.in_persistent_group:
            self._persistent.set_known(set(persistent))

        complete = complete_per_replica(local, self.layout.replicas)
        steps = set().union(*complete) if complete else set()
        with self._shared_lock:
            self._shared_local = {s: self._gathered_infos.get(s) or StepInfo(s, 0.0) for s in steps}

    def _forget_local(self, step: int) -> None:
        with self._shared_lock:  # every process's retention drops the same steps
            self._shared_local.pop(step, None)

    def _shared_infos(self) -> dict[int, StepInfo]:
        with self._shared_lock:
            return dict(self._shared_local)

    def _add_shared(self, step: int, info: StepInfo) -> None:
        with self._shared_lock:
            self._shared_local[step] = info

    def all_steps(self) -> list[int]:
        """Steps restorable from some tier: complete in some replica's local tiers or
        persistent.  Not a collective: each process answers from what every process knows
        (the last :meth:`reload`/:meth:`restore`, the local saves since and the retention
        applied to them), so every process lists the same steps once their saves finished
        (:meth:`wait_until_finished`), even after a process lost its local tier."""
        with self._shared_lock:
            shared = set(self._shared_local)
        return sorted(shared | set(self._persistent.steps()))

    def latest_step(self) -> int | None:
        """The newest of :meth:`all_steps` (``None`` when there is none)."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def local_steps(self) -> list[int]:
        """This process's committed local steps."""
        return self._local.steps()

    def persistent_steps(self) -> list[int]:
        """The persistent tier's committed steps (as this process knows them)."""
        return self._persistent.steps()

    def is_saving_in_progress(self) -> bool:
        """Whether a save of either tier has not committed yet."""
        return self._local.busy() or self._persistent.busy()

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is at or after the preemption point (needs a ``Preemption`` policy)."""
        return self._preemption is not None and self._preemption.reached(step)

    # ---- saving ---------------------------------------------------------------------------

    def _decide(self, step: int, force: bool) -> tuple[bool, bool]:
        reached = False
        if self._preemption is not None:
            reached = self._preemption.reached(step) and self._preemption.step == step
        local_new = step > max(self._local.newest(), max(self._shared_infos(), default=-1))
        persistent_new = step > self._persistent.newest()
        deterministic = sp.is_deterministic(self.local_policy) and sp.is_deterministic(self.persistent_policy)
        if self.process_count > 1 and not deterministic and not force:
            name = self._next_round(f"save-{step}")
            decision = None
            if self.process_index == 0:
                decision = [local_new and bool(self.local_policy.should_save(self._local.context(step, reached))),
                            persistent_new and bool(self.persistent_policy.should_save(
                                self._persistent.context(step, reached)))]
            got = self._exchange.from_process(name, 0, decision)
            return bool(got[0]), bool(got[1])
        local = local_new and (force or bool(self.local_policy.should_save(self._local.context(step, reached))))
        persistent = persistent_new and (force or bool(self.persistent_policy.should_save(
            self._persistent.context(step, reached))))
        return local, persistent

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save to some tier (every process must call it
        when a policy depends on the clock)."""
        self._check_open()
        local, persistent = self._decide(step, False)
        return local or persistent

    def save(self, step: int, state: Any, *, force: bool = False, metrics: Mapping[str, Any] | None = None,
             process_state: Any = None) -> bool:
        """Save ``state`` (a tree of ``jax.Array``) as ``step`` to the tiers whose policy says
        so (both with ``force``); returns whether any tier saves.  Every process calls it
        with the same step.

        ``process_state``: this process's own non-tensor state (a JSON-serializable value,
        e.g. a data iterator's position), different in each process; every process passes one
        or none does.  The documents of all processes are gathered and saved in the step (in
        each local step and the persistent step), so the step is complete only with all of
        them, and a restore gives each process its own back, wherever the step is read from.
        """
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"a step is a non-negative int, not {step!r}")
        if metrics is not None and not isinstance(metrics, Mapping):
            raise TypeError("metrics must be a dict")
        self.check_for_errors()
        local, persistent = self._decide(step, force)
        if not (local or persistent):
            return False
        items: dict[str, Any] = {}
        if metrics is not None:
            items[METRICS_ITEM] = JsonItem(metrics_json(metrics), filename=METRICS_FILE)
        if process_state is not None:
            items[PROCESS_STATE_ITEM] = JsonItem(self._gather_process_states(step, process_state))
        fingerprint = state_fingerprint(state)
        if local:
            self._save_local(step, state, items, fingerprint)
        if persistent:
            if self.in_persistent_group:
                self._save_persistent(step, state, items, fingerprint)
            else:
                self._persistent.record(step)
        if not self.async_save:
            self.wait_until_finished()
        return True

    def _gather_process_states(self, step: int, doc: Any) -> dict[str, Any]:
        """Every process's ``process_state`` (the same document in every process)."""
        try:
            text = json.dumps(doc, allow_nan=False)
            mine: dict[str, Any] = ({"error": f"{len(text)} bytes, over {_MAX_PROCESS_STATE}"}
                                    if len(text) > _MAX_PROCESS_STATE else {"state": doc})
        except (TypeError, ValueError) as e:
            mine = {"error": f"not JSON-serializable: {e}"}
        docs = self._exchange.allgather(self._next_round(f"process-state-{step}"), mine)
        bad = [(p, d["error"]) for p, d in enumerate(docs) if not isinstance(d, dict) or "error" in d]
        if bad:
            raise ValueError(f"process_state of step {step}: "
                             + "; ".join(f"process {p}: {e}" for p, e in bad))
        return {"format": _PROCESS_STATE_FORMAT, "process_count": self.process_count,
                "states": [d.get("state") for d in docs]}

    def _custom_metadata(self, tier: str, fingerprint: str, with_states: bool = False) -> dict[str, Any]:
        doc = {"tier": tier, "process_index": self.process_index, "replica": self.replica,
               "state_fingerprint": fingerprint}
        if with_states:
            doc["process_state"] = True
        return {_META_KEY: doc}

    def _save_local(self, step: int, state: Any, extra: dict[str, Any], fingerprint: str) -> None:

        self._local_saves += 1
        name = self.step_name_format.name(step)
        staging = name + _STAGING
        coord = group_coordinator([self.process_index], writer_devices=self._local_devices, partial=True,
                                  key_prefix=f"ocdbt_py_mt{self._id}_local{self._local_saves}",
                                  timeout_s=self.timeout_s)
        opts = {"sync": self._local_sync, **self._save_options}
        handle = save(PrefixStore(self.local_kv, staging), {STATE_ITEM: state, **extra}, composite=True,
                      force=True, use_zarr3=True, handler="pytree", blocking=not self.async_save,
                      custom_metadata=self._custom_metadata("local", fingerprint, PROCESS_STATE_ITEM in extra),
                      _coordinator=coord, **opts)
        sync = bool(opts.get("sync", False))
        self._local.start(step, handle, lambda: self._commit_local(step, staging, name, sync))

    def _commit_local(self, step: int, staging: str, name: str, sync: bool) -> None:
        self._publish_local(staging, name, sync)
        try:
            info = read_step_info(self.local_kv, step, name, fallback_time=time.time())
        except OcdbtError:
            info = StepInfo(step, time.time())
        self._add_shared(step, info)

    def _publish_local(self, staging: str, name: str, sync: bool) -> None:
        """After the local save committed into its staging directory: add the topology files,
        then rename the step into place (the moment it becomes visible)."""

        src = os.path.join(self.local_directory, staging)
        dst = os.path.join(self.local_directory, name)
        skv = PrefixStore(self.local_kv, staging)
        self.topology.write(PrefixStore(skv, PROCESS_METADATA))
        skv.set(f"{PROCESS_METADATA}/{COMMIT_MARKER}", commit_marker(f"{dst}/{PROCESS_METADATA}"))
        # Only this process's chunks are stored: absent chunks are the fill value, not damage.
        tree = read_json(skv, f"{STATE_ITEM}/_METADATA")
        if isinstance(tree, dict):
            tree["store_array_data_equal_to_fill_value"] = False
            skv.set(f"{STATE_ITEM}/_METADATA", json.dumps(tree).encode())
        meta = read_json(skv, "_CHECKPOINT_METADATA", 16 << 20)
        if isinstance(meta, dict) and isinstance(meta.get("item_handlers"), dict):
            meta["item_handlers"][PROCESS_METADATA] = _PROCESS_METADATA_HANDLER
            skv.set("_CHECKPOINT_METADATA", json.dumps(meta).encode())
        if sync:
            fsync_dir(os.path.join(src, PROCESS_METADATA))
            fsync_dir(src)
        try:
            if os.path.lexists(dst):  # a leftover that was never committed
                trash = f"{dst}{_STAGING}-old-{uuid.uuid4().hex[:8]}"
                os.rename(dst, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(src, dst)
        except OSError as e:
            raise StorageError(f"cannot publish local step {dst}: {e}") from e
        if sync:
            fsync_dir(self.local_directory)

    def _save_persistent(self, step: int, state: Any, extra: dict[str, Any], fingerprint: str) -> None:

        self._persistent_saves += 1
        coord = group_coordinator(self._persistent_group, writer_devices=self.layout.replica_devices[0],
                                  key_prefix=f"ocdbt_py_mt{self._id}_persistent{self._persistent_saves}",
                                  timeout_s=self.timeout_s)
        name = self.step_name_format.name(step)
        handle = save(PrefixStore(self.persistent_kv, name), {self.persistent_item: state, **extra}, composite=True,
                      use_zarr3=True, handler="pytree", blocking=not self.async_save,
                      custom_metadata=self._custom_metadata("persistent", fingerprint), _coordinator=coord,
                      **self._save_options)
        self._persistent.start(step, handle)

    # ---- restoring ------------------------------------------------------------------------

    def restore(self, step: int | None = None, target: Any = None, *, with_process_state: bool = False) -> Any:
        """Restore ``step`` (default: the newest step complete somewhere) as a tree of
        ``jax.Array`` placed as ``target`` (default: ``abstract_state``) says.

        Every process calls it.  Sources, in order of preference: every process's own local
        tier; one replica's local tiers broadcast to the others; the persistent tier.  A read
        that fails somewhere makes every process re-plan without that local step.
        :attr:`last_restore` records the choice and this process's ``process_state``;
        ``with_process_state=True`` returns ``(tree, process_state)`` instead of the tree.
        """
        # optional: JAX is imported only for trees that hold JAX objects
        import jax

        self._check_open()
        target = target if target is not None else self.abstract_state
        if target is None:
            raise ValueError("restore needs a target: pass target= or give the manager an abstract_state")
        leaves, treedef = jax.tree_util.tree_flatten(target)
        for leaf in leaves:
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype") and getattr(leaf, "sharding", None) is not None):
                raise TypeError(f"every target leaf must be a jax.ShapeDtypeStruct with a sharding or a jax.Array, "
                                f"not {type(leaf).__name__}")
        self.wait_until_finished()

        peer_why = None
        if self.layout.count < 2:
            peer_why = "the mesh has a single replica"
        else:
            # replica_broadcast imports JAX at its top: importing the manager package must not
            from ocdbt_py.checkpoint.manager.replica_broadcast import can_broadcast

            for leaf in leaves:
                peer_why = can_broadcast(leaf, self.global_mesh, self.layout)
                if peer_why is not None:
                    break
        fingerprint = state_fingerprint(target)
        excluded: set[int] = set()
        notes: list[str] = []
        for _attempt in range(_RESTORE_ATTEMPTS):
            local, persistent, reasons = self._gather("restore", fingerprint, excluded, target)
            plan = plan_restore(step, local, self.layout.replicas, persistent, peer_ok=peer_why is None)
            result, states, error = self._read(plan, target)
            statuses = self._exchange.allgather(self._next_round("restore-status"), error)
            failed = {p: s for p, s in enumerate(statuses) if s is not None}
            if not failed:
                notes.extend(self._explain(plan, local, reasons, peer_why))
                break
            if plan.source == PERSISTENT:
                raise OcdbtError(f"restoring step {plan.step} from the persistent tier failed: "
                                 + "; ".join(f"process {p}: {s}" for p, s in failed.items()))
            notes.append(f"step {plan.step}: local read failed in processes {sorted(failed)} "
                         f"({next(iter(failed.values()))}); planning again without it")
            log.warning("multi-tier restore: %s", notes[-1])
            if self.process_index in failed:
                excluded.add(plan.step)
        else:
            raise OcdbtError(f"restore failed {_RESTORE_ATTEMPTS} times: {'; '.join(notes)}")
        if plan.source == PEER:
            result, mine = self._receive_from_peer(plan, result, states, leaves, treedef)
        else:
            mine = states[self.process_index] if states is not None else None
        if plan.source != PERSISTENT:
            self._add_shared(plan.step, self._gathered_infos.get(plan.step) or StepInfo(plan.step, 0.0))
        self.last_restore = RestoreInfo(plan.step, plan.source, plan.replica, tuple(notes), mine)
        log.info("multi-tier restore of step %d from %s%s", plan.step, plan.source,
                 f" (replica {plan.replica})" if plan.source == PEER else "")
        return (result, mine) if with_process_state else result

    def _receive_from_peer(self, plan: RestorePlan, result: Any, states: list[Any] | None, leaves: list[Any],
                           treedef: Any) -> tuple[Any, Any]:
        """A peer restore's second half: the source replica's values copied to every replica
        by a collective, and each process's own ``process_state`` sent to it by the source
        replica's first process through the key-value store (one key per process, so the
        documents of a large job never travel as one)."""
        # optional: JAX and the module copying between replicas (it imports JAX)
        import jax

        from ocdbt_py.checkpoint.manager.replica_broadcast import broadcast_from_replica

        source = plan.replica if plan.replica is not None else 0
        source_values = jax.tree_util.tree_leaves(result) if result is not None else None
        if source_values is not None and len(source_values) != len(leaves):
            raise OcdbtError("the restored tree does not match the target's structure")
        values = broadcast_from_replica(source_values, leaves, self.global_mesh, self.layout, source)
        root = self.layout.replicas[source][0]
        name = self._next_round("restore-states")
        if self.process_index == root:  # _read checked the list's length
            for p in range(self.process_count):
                if p != root:
                    self._exchange.publish(f"{name}/{p}", None if states is None else states[p])
            mine = None if states is None else states[root]
        else:
            mine = self._exchange.fetch(f"{name}/{self.process_index}", root)
        return jax.tree_util.tree_unflatten(treedef, values), mine

    def _read(self, plan: RestorePlan, target: Any) -> tuple[Any, list[Any] | None, str | None]:
        """This process's part of ``plan``: the restored tree (``None`` when it only receives),
        every process's ``process_state`` saved with the step (``None``: none saved) and an
        error message (``None`` on success)."""

        name = self.step_name_format.name(plan.step)
        try:
            if plan.source == PERSISTENT:
                kv = PrefixStore(self.persistent_kv, name)
                return restore(kv, target, item=self.persistent_item), self._read_states(kv), None
            if plan.source == PEER and self.replica != plan.replica:
                return None, None, None
            kv = PrefixStore(self.local_kv, name)
            return restore(kv, target, item=STATE_ITEM), self._read_states(kv), None
        except Exception as e:  # noqa: BLE001 - shared with every process, then re-planned
            log.warning("multi-tier restore: reading step %d (%s) failed: %r", plan.step, plan.source, e)
            return None, None, f"{type(e).__name__}: {e}"[:1000]

    def _read_states(self, step_kv: KvStore, required: bool = False) -> list[Any] | None:
        """The ``process_state`` documents of every process saved in a step (``None``: the
        step has none and ``required`` is false)."""
        doc = read_json(step_kv, f"{PROCESS_STATE_ITEM}/metadata", _MAX_PROCESS_STATE * (self.process_count + 1))
        if doc is None and not required:
            return None
        if not isinstance(doc, dict):
            doc = {}
        states = doc.get("states")
        if not isinstance(states, list) or doc.get("process_count") != self.process_count \
                or len(states) != self.process_count:
            raise CorruptionError(f"{PROCESS_STATE_ITEM} is missing, damaged or from a job of another size",
                                  path=f"{step_kv.url.rstrip('/')}/{PROCESS_STATE_ITEM}")
        return states

    def _explain(self, plan: RestorePlan, local: dict[int, set[int]], reasons: dict[int, dict[str, str]],
                 peer_why: str | None) -> list[str]:
        notes: list[str] = []
        if plan.source == LOCAL:
            return notes
        without = [p for p, steps in local.items() if plan.step not in steps]
        if without:
            notes.append(f"processes {without} do not hold step {plan.step} locally")
        for p, why in reasons.items():
            for s, reason in why.items():
                notes.append(f"process {p}: local step {s} not used: {reason}")
        if plan.source == PERSISTENT and peer_why is not None and self.layout.count > 1:
            notes.append(f"no peer restore: {peer_why}")
        if notes and plan.source == PERSISTENT:
            log.log(logging.WARNING if any(reasons.values()) else logging.INFO,
                    "multi-tier restore of step %d from the persistent tier: %s", plan.step, "; ".join(notes))
        return notes

    # ---- lifecycle ------------------------------------------------------------------------

    def wait_until_finished(self) -> None:
        """Block until every save of both tiers has committed; raise the first error."""
        try:
            self._local.wait()
        finally:
            self._persistent.wait()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save (once)."""
        try:
            self._local.check_for_errors()
        finally:
            self._persistent.check_for_errors()

    def __repr__(self) -> str:
        return (f"<MultiTierCheckpointManager local={self.local_directory} persistent={self.persistent_directory} "
                f"replica={self.replica}/{self.layout.count} local_steps={self.local_steps()} "
                f"persistent_steps={self.persistent_steps()}>")

