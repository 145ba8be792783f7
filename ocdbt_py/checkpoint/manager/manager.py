"""``CheckpointManager``: a training loop's checkpoint lifecycle on any filesystem.

Each step is a directory ``<root>/<step name>/`` holding one directory per item, laid out as
Orbax's ``CheckpointManager`` with ``ocp.args.Composite`` lays it out (pytree items, JSON
items, ``metrics/metrics``, ``_CHECKPOINT_METADATA``, ``commit_success.txt``), so either
library lists and restores the other's steps.

* **Saving** goes through :func:`ocdbt_py.checkpoint.save`: atomic (a temporary directory
  renamed into place on local disks, the commit marker written last elsewhere) and, by
  default, asynchronous: :meth:`CheckpointManager.save` returns once host copies are made.
* **Deciding** whether a step is saved is a save policy's job
  (:mod:`~ocdbt_py.checkpoint.manager.save_policy`); **retention** a preservation policy's
  (:mod:`~ocdbt_py.checkpoint.manager.preservation`).  Deletions run in the background after
  each commit, never touch the newest committed step or a step being written.
* In a multi-process JAX job every process creates the manager and calls ``save`` with the
  same steps; process 0 commits and deletes, and decisions that depend on the clock are made
  by process 0 and shared.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ocdbt_py.checkpoint.layout import COMMIT_MARKER
from ocdbt_py.checkpoint.manager import rootlock
from ocdbt_py.checkpoint.manager import save_policy as sp
from ocdbt_py.checkpoint.manager.lifecycle import Lifecycle
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.manager.preemption import PreemptionWatcher
from ocdbt_py.checkpoint.manager.preservation import AnyOf as AnyOfKeep
from ocdbt_py.checkpoint.manager.preservation import BestN, PreservationPolicy, StepInfo
from ocdbt_py.checkpoint.manager.steps import (
    METRICS_FILE,
    METRICS_ITEM,
    metrics_json,
    writes_in_place,
)
from ocdbt_py.checkpoint.manager.steps import cleanup as cleanup_root
from ocdbt_py.checkpoint.manager.tier import Tier
from ocdbt_py.checkpoint.meta import metadata
from ocdbt_py.checkpoint.restore.api import restore
from ocdbt_py.checkpoint.saving.api import JsonItem, background_nice, save
from ocdbt_py.checkpoint.saving.distributed import _jax_client
from ocdbt_py.errors import NotFoundError, OcdbtError, ReadOnlyError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = ["CheckpointManager", "StepAlreadyExistsError", "default_save_policy"]

_ids = itertools.count()
_ids_lock = threading.Lock()
#: Keyword arguments of :func:`ocdbt_py.checkpoint.save` a manager passes through.
SAVE_OPTIONS = frozenset({
    "use_zarr3", "use_ocdbt", "use_compression", "checksum", "chunk_byte_size", "leaf_chunk_byte_sizes",
    "ocdbt_target_data_file_size", "handler", "item_options", "pytree_custom_metadata",
    "keep_copy_buffer", "replica_parallel", "workers", "sync", "barrier_timeout", "finalize",
})


class StepAlreadyExistsError(OcdbtError, FileExistsError, ValueError):
    """``save`` was asked to write a step the manager already has (a ``ValueError``, as
    Orbax's ``checkpoint_manager.StepAlreadyExistsError``, and a ``FileExistsError``, as
    Orbax v1's)."""


def default_save_policy() -> sp.AnyOf:
    """Every step, plus the preemption step: ``AnyOf(FixedInterval(1), Preemption())``."""
    return sp.AnyOf(sp.FixedInterval(1), sp.Preemption())


def _process() -> tuple[int, int, Any]:
    """``(index, count, coordination client)`` of this process in a JAX job."""

    if "jax" not in sys.modules:
        return 0, 1, None
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    count = int(jax.process_count())
    if count <= 1:
        return 0, 1, None

    return int(jax.process_index()), count, _jax_client()


class CheckpointManager(Lifecycle):
    """Saves, lists, restores and prunes the steps of a checkpoint root.

    >>> mgr = CheckpointManager("/ckpts", save_policy=FixedInterval(100),
    ...                         preservation=LatestN(3))                      # doctest: +SKIP
    >>> for step in range(1000):
    ...     state = train_step(state)
    ...     mgr.save(step, {"state": state, "config": JsonItem(cfg)}, metrics={"loss": loss})
    >>> mgr.wait_until_finished()
    >>> state = mgr.restore()["state"]

    * ``root``: a local path, any fsspec URL (``s3://``, ``gs://``, ``az://``, ...) or a
      :class:`~ocdbt_py.kvstore.KvStore`; ``storage_options`` go to fsspec.
    * ``save_policy``: when to save (default: every step, and the preemption step);
      ``preservation``: what to keep (default: everything).
    * ``async_save``: ``save`` returns once host copies are made; the write, the commit and
      retention continue in the background (:meth:`wait_until_finished` waits).
    * ``step_name_format`` (or ``step_prefix``/``step_format_fixed_length``): step directory
      names, as Orbax's options of the same names.
    * ``save_options``: passed to :func:`ocdbt_py.checkpoint.save` (``use_zarr3``,
      ``use_ocdbt``, ``use_compression``, ``chunk_byte_size``, ``item_options`` per item,
      ``workers``, ``sync``, ...).
    * ``cleanup``: remove leftovers of interrupted saves and deletions when opening.
    * ``read_only``: list and restore only.
    * ``retention="after_commit"`` (default): the preservation policy is asked after each
      commit and never drops the newest step; ``"orbax"``: as Orbax's manager, it is asked
      when a save starts (over the committed steps and the new one), the dropped steps stop
      being listed at once and are deleted after the commit, and the newest may be dropped.
    * ``on_commit``: called (on the background thread) after each save commits, before the
      step is recorded.
    * ``todelete_subdir``: deleted steps are moved into ``<root>/<todelete_subdir>/``
      instead of being removed (Orbax's option of the same name).
    * ``clock``: where a save's start time (what time-based preservation policies see) is
      read from, in epoch seconds (default: ``time.time()``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | KvStore,
        *,
        save_policy: sp.SavePolicy | None = None,
        preservation: PreservationPolicy | None = None,
        async_save: bool = True,
        step_name_format: StepNameFormat | None = None,
        step_prefix: str | None = None,
        step_format_fixed_length: int | None = None,
        storage_options: dict[str, Any] | None = None,
        save_options: Mapping[str, Any] | None = None,
        cleanup: bool = True,
        read_only: bool = False,
        retention: str = "after_commit",
        on_commit: Callable[[], None] | None = None,
        todelete_subdir: str | None = None,
        clock: Callable[[], float] | None = None,
    ):
        if step_name_format is not None and (step_prefix is not None or step_format_fixed_length is not None):
            raise ValueError("give step_name_format or step_prefix/step_format_fixed_length, not both")
        self.step_name_format = step_name_format or StepNameFormat(step_prefix, step_format_fixed_length)
        self.save_policy: sp.SavePolicy = save_policy if save_policy is not None else default_save_policy()
        if not callable(getattr(self.save_policy, "should_save", None)):
            raise TypeError(f"{self.save_policy!r} is not a save policy (it has no should_save method)")
        if preservation is not None and not callable(getattr(preservation, "keep", None)):
            raise TypeError(f"{preservation!r} is not a preservation policy (it has no keep method)")
        self.preservation = preservation
        self.async_save = bool(async_save)
        self._clock = clock
        self.read_only = bool(read_only)
        opts = dict(save_options or {})
        unknown = set(opts) - SAVE_OPTIONS
        if unknown:
            raise TypeError(f"unknown save_options {sorted(unknown)} (known: {sorted(SAVE_OPTIONS)})")
        self._save_options = opts
        self._storage_options = storage_options
        self.kv: KvStore = open_kvstore(root, storage_options, read_only=read_only)
        self.root = self.kv.url
        self._process_index, self._process_count, self._client = _process()
        with _ids_lock:
            self._id = next(_ids)
        self._closed = False
        self._preemption = PreemptionWatcher() if sp.uses(self.save_policy, sp.Preemption) else None
        if retention not in ("after_commit", "orbax"):
            raise ValueError(f"retention must be 'after_commit' or 'orbax', not {retention!r}")
        self._on_commit = on_commit
        orbax = retention == "orbax"
        # one writing manager per local root across processes (RootInUseError otherwise)
        self._root_hold: weakref.finalize | None = None
        self._wants_hold = not self.read_only and self.is_primary and self.kv.local_path() is not None
        self._take_root_hold(create=False)  # a missing root is locked when the first save makes it
        self._steps = Tier("steps", self.kv, self.step_name_format, preservation, deletes=self.is_primary,
                           decide_at_start=orbax, keep_newest=not orbax, keep_deleted_in=todelete_subdir)
        if not self.read_only and self.is_primary:
            # steps whose deletion was interrupted are gone already: removed even without cleanup
            cleanup_root(self.kv, self.step_name_format, only_deleted=not cleanup)
        self.reload()

    def _take_root_hold(self, *, create: bool) -> None:
        if not self._wants_hold or self._root_hold is not None:
            return
        hold = rootlock.acquire(self.kv, create=create)
        if hold is not None:
            self._root_hold = weakref.finalize(self, hold)
        if hold is not None or create:
            self._wants_hold = False  # held, or this filesystem cannot lock: never ask again

    def close(self) -> None:
        """Wait for pending saves, then release the manager and its hold on the root."""
        try:
            super().close()
        finally:
            if self._root_hold is not None:
                self._root_hold()

    # ---- queries --------------------------------------------------------------------------

    @property
    def is_primary(self) -> bool:
        """Whether this process commits and deletes (process 0 of a JAX job)."""
        return self._process_index == 0

    def reload(self) -> None:
        """Re-read the steps on storage (another writer may have added or deleted some)."""
        self._steps.scan()

    def all_steps(self, *, in_flight: bool = False) -> list[int]:
        """The committed steps, oldest first (and, with ``in_flight``, those being saved)."""
        return self._steps.tracked() if in_flight else self._steps.steps()

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None``."""
        steps = self._steps.steps()
        return steps[-1] if steps else None

    def step_infos(self, *, in_flight: bool = False) -> list[StepInfo]:
        """Commit time and metrics of every committed step (and, with ``in_flight``, of the
        steps being saved: start time and given metrics), oldest first."""
        return self._steps.tracked_infos() if in_flight else self._steps.infos()

    def step_info(self, step: int) -> StepInfo:
        """Commit time and metrics of a committed step."""
        info = self._steps.info(step)
        if info is None:
            raise NotFoundError(f"{self.root}: no committed step {step} (have {self.all_steps()})")
        return info

    def metrics(self, step: int) -> Mapping[str, Any] | None:
        """The metrics saved with ``step`` (``None`` if it has none)."""
        return self.step_info(step).metrics

    def _best_policy(self) -> BestN | None:
        p = self.preservation
        if isinstance(p, BestN):
            return p
        if isinstance(p, AnyOfKeep):
            for q in p.walk():
                if isinstance(q, BestN):
                    return q
        return None

    def best_step(self, metric: str | None = None, mode: str | None = None) -> int | None:
        """The committed step with the best metric: by ``metric``/``mode`` when given, else by
        the preservation policy's :class:`BestN`; the latest step when there is no metric."""
        best = self._best_policy()
        if metric is not None:
            best = BestN(1, metric, mode or "min")
        elif best is None:
            return self.latest_step()
        ranked = best.ranked(self._steps.infos())
        return ranked[0].step if ranked else self.latest_step()

    def step_path(self, step: int) -> str:
        """Where ``step`` is (or would be) stored."""
        return f"{self.root.rstrip('/')}/{self.step_name_format.name(step)}"

    def is_saving_in_progress(self) -> bool:
        """Whether a save has not committed yet."""
        return self._steps.busy()

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is at or after the preemption point (always ``False`` without a
        :class:`~ocdbt_py.checkpoint.manager.save_policy.Preemption` policy)."""
        return self._preemption is not None and self._preemption.reached(step)

    # ---- saving ---------------------------------------------------------------------------

    def _context(self, step: int) -> sp.SaveContext:
        reached = self._preemption is not None and self._preemption.reached(step)
        if reached and self._preemption is not None and self._preemption.step != step:
            reached = False  # only the step where the notice was taken up
        return self._steps.context(step, reached)

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save (the save policy's answer, shared by the
        primary process when it depends on local state)."""
        self._check_open()
        if self.read_only:
            return False
        newest = self._steps.newest()
        ctx = self._context(step)  # always: JAX's preemption sync point needs every step
        if step <= newest:
            return False
        if self._process_count > 1 and not sp.is_deterministic(self.save_policy):
            return self._shared_decision(step, ctx)
        return bool(self.save_policy.should_save(ctx))

    def _shared_decision(self, step: int, ctx: sp.SaveContext) -> bool:
        key = f"ocdbt_py_manager/{self._id}/should_save/{step}"
        timeout_ms = int(float(self._save_options.get("barrier_timeout", 600.0)) * 1000)
        if self._client is None:  # pragma: no cover - no coordination service
            raise OcdbtError("a clock-based save policy in a multi-process job needs jax.distributed")
        if self.is_primary:
            decision = bool(self.save_policy.should_save(ctx))
            self._client.key_value_set(key, "1" if decision else "0")
            return decision
        return bool(self._client.blocking_key_value_get(key, timeout_ms) == "1")

    def save(
        self,
        step: int,
        items: Mapping[str, Any],
        *,
        metrics: Mapping[str, Any] | None = None,
        force: bool = False,
        custom_metadata: Mapping[str, Any] | None = None,
        save_options: Mapping[str, Any] | None = None,
        write_metrics: bool = True,
    ) -> bool:
        """Save ``items`` as ``step`` if the save policy says so (or ``force``); returns
        whether a save was started.

        ``save_options`` override the manager's ``save_options`` for this save only.

        ``items`` maps item names to pytrees (NumPy or JAX) or
        :class:`~ocdbt_py.checkpoint.JsonItem`; ``{"default": tree}`` is Orbax's single-item
        layout.  ``metrics`` (a JSON dict) is stored as Orbax stores it (``metrics/metrics``)
        for :class:`~ocdbt_py.checkpoint.manager.preservation.BestN`.  With ``async_save``
        the call returns after host copies; errors surface from the next ``save``,
        :meth:`wait_until_finished` or :meth:`check_for_errors`.  ``write_metrics=False``:
        the metrics go to the preservation policy but are not stored with the step.
        """
        self._check_open()
        if self.read_only:
            raise ReadOnlyError(f"{self.root}: the manager is read-only")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"a step is a non-negative int, not {step!r}")
        if not isinstance(items, Mapping) or not items:
            raise TypeError("items must be a non-empty dict of item name -> pytree or JsonItem")
        if metrics is not None and METRICS_ITEM in items:
            raise ValueError(f"the item name {METRICS_ITEM!r} holds the metrics; rename the item")
        if metrics is not None and not isinstance(metrics, Mapping):
            raise TypeError("metrics must be a dict")
        self.check_for_errors()
        if self._steps.name(step) is not None or self._steps.in_flight(step):
            raise StepAlreadyExistsError(f"{self.step_path(step)} already exists: a step is saved once (delete it "
                                         "with manager.delete(step), or start the run in a new directory)")
        if force:
            if self._preemption is not None:
                self._preemption.reached(step)  # keep JAX's sync point in step with the others
        elif not self.should_save(step):
            return False
        options = dict(self._save_options)
        if save_options:
            unknown = set(save_options) - SAVE_OPTIONS
            if unknown:
                raise TypeError(f"unknown save_options {sorted(unknown)} (known: {sorted(SAVE_OPTIONS)})")
            options.update(save_options)
        self._start_save(step, items, metrics, custom_metadata, options, write_metrics)
        return True

    def _start_save(self, step: int, items: Mapping[str, Any], metrics: Mapping[str, Any] | None,
                    custom_metadata: Mapping[str, Any] | None, options: Mapping[str, Any],
                    write_metrics: bool = True) -> None:

        tree: dict[str, Any] = dict(items)
        if metrics is not None and write_metrics:
            tree[METRICS_ITEM] = JsonItem(metrics_json(metrics), filename=METRICS_FILE)
        name = self.step_name_format.name(step)
        self._take_root_hold(create=True)  # the first save of a root that did not exist yet
        self._steps.wait_recorded()  # saves run one at a time: wait for the previous commit
        self.check_for_errors()
        started = self._clock() if self._clock is not None else time.time()
        # On object stores a failed earlier save of this step may have left files without a
        # commit marker: they are no checkpoint, so the new save replaces them.
        replace = writes_in_place(self.kv) and not self.kv.exists(f"{name}/{COMMIT_MARKER}")
        handle = save(PrefixStore(self.kv, name), tree, composite=True, blocking=not self.async_save,
                      force=replace, custom_metadata=custom_metadata, **options)
        self._steps.start(step, handle, self._on_commit, started=started,
                          nice=background_nice() if self.async_save else 0,
                          metrics=None if metrics is None else dict(metrics))
        if not self.async_save:
            self.wait_until_finished()

    # ---- lifecycle ------------------------------------------------------------------------

    def wait_until_finished(self) -> None:
        """Block until every save (and its retention) is done; raise the first error."""
        self._steps.wait()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save or deletion (once)."""
        self._steps.check_for_errors()

    def delete(self, step: int) -> None:
        """Delete a committed step (not one being written)."""
        self._check_open()
        if self.read_only:
            raise ReadOnlyError(f"{self.root}: the manager is read-only")
        if self._steps.in_flight(step):
            raise ValueError(f"step {step} is still being written; wait_until_finished() first")
        if self._steps.name(step) is None:
            raise NotFoundError(f"{self.root}: no committed step {step} (have {self.all_steps()})")
        self._steps.forget(step)

    # ---- restoring ------------------------------------------------------------------------

    def _resolve_step(self, step: int | None) -> tuple[int, str]:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise NotFoundError(f"{self.root}: no committed step to restore")
        name = self._steps.name(step)
        if name is None:
            raise NotFoundError(f"{self.root}: no committed step {step} (have {self.all_steps()})")
        return step, name

    def restore(
        self,
        step: int | None = None,
        items: str | Sequence[str] | None = None,
        target: Any = None,
        *,
        lazy: bool = False,
    ) -> Any:
        """Restore a committed step (default: the latest).

        * ``items=None``: every item, as ``{name: tree}`` (or the bare tree of a single
          ``default`` item, as Orbax returns it); a name: that item's tree; a list of names:
          ``{name: tree}`` of those.
        * ``target``: as :func:`ocdbt_py.checkpoint.restore` (for several items a dict keyed
          by item name) -- JAX targets give sharded ``jax.Array`` leaves.
        """

        _, name = self._resolve_step(step)
        skv = PrefixStore(self.kv, name)
        if isinstance(items, str):
            return restore(skv, target, item=items, lazy=lazy)
        if items is None:
            return restore(skv, target, lazy=lazy)
        names = list(items)
        if target is not None and (not isinstance(target, Mapping) or not set(target) <= set(names)):
            raise ValueError("with several items, target must be a dict keyed by item name")
        return {n: restore(skv, (target or {}).get(n), item=n, lazy=lazy) for n in names}

    def item_metadata(self, step: int | None = None, item: str | None = None) -> Any:
        """Shapes and dtypes of a step's items without reading array data."""

        _, name = self._resolve_step(step)
        return metadata(PrefixStore(self.kv, name), item=item)

    def __repr__(self) -> str:
        return f"<CheckpointManager {self.root} steps={self.all_steps()}>"
