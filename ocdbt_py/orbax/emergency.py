"""Orbax's emergency checkpoint manager API over :class:`MultiTierCheckpointManager`.

The names, arguments and results of ``orbax.checkpoint.experimental.emergency
.checkpoint_manager`` (Orbax 0.12.8): :class:`LocalCheckpointOptions`,
:class:`PersistentCheckpointOptions`, :class:`MultiprocessingOptions`,
:class:`CheckpointManagerOptions` and :class:`CheckpointManager`, so that

>>> from ocdbt_py.orbax import emergency  # doctest: +SKIP
>>> mgr = emergency.CheckpointManager(local_dir, persistent_dir, global_mesh=mesh,
...     abstract_state=abstract, options=emergency.CheckpointManagerOptions(
...         local=emergency.LocalCheckpointOptions(save_interval_steps=2, max_to_keep=2),
...         persistent=emergency.PersistentCheckpointOptions(save_interval_steps=5)))
>>> mgr.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)))  # doctest: +SKIP
>>> mgr.restore(None).state  # doctest: +SKIP

runs as with Orbax: the persistent tier is a normal Orbax root (item ``default``), local
steps use Orbax's layout, and local steps Orbax wrote are restored from local when their
mesh, tree and shardings match.  Differences, on purpose (``spec/orbax.md`` section 10.1):

* every replica (replica 0 too) keeps local steps, and replica 0 alone writes the
  persistent tier;
* ``save(args=Composite(state=..., <name>=JsonSave(doc), ...))``: every item other than
  ``state`` is this process's own JSON state (e.g. ``dataset``: a data iterator's position),
  saved in the step itself, in both tiers (Orbax sends ``dataset`` to a separate
  ``persistent_non_replicated_directory`` manager, which is accepted and ignored here);
  ``restore(step, args=Composite(<name>=JsonRestore()))`` gives each process its own back;
* with one replica, as Orbax, there is no local tier and the persistent steps name the item
  ``state`` (``default`` with several replicas).

``args`` may be this package's ``args.Composite``, Orbax's own, or any mapping of item names
to objects with an ``item`` attribute (``StandardSave``/``PyTreeSave``/``JsonSave``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.manager import save_policy as save_lib
from ocdbt_py.checkpoint.manager.multitier import MultiTierCheckpointManager
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.manager.preemption import PreemptionWatcher
from ocdbt_py.orbax import preservation as pp
from ocdbt_py.orbax import save_decision as sdp
from ocdbt_py.orbax import utils
from ocdbt_py.orbax.options import MultiprocessingOptions

__all__ = ["LocalCheckpointOptions", "PersistentCheckpointOptions", "MultiprocessingOptions",
           "CheckpointManagerOptions", "CheckpointManager"]

_STATE = "state"
_RESERVED = "process_metadata"


@dataclasses.dataclass
class LocalCheckpointOptions:
    """When local checkpoints are saved and how many are kept (Orbax's fields and defaults:
    every 10 steps, ``max_to_keep`` 1 unless a ``preservation_policy`` is given)."""

    save_interval_steps: int = 10
    max_to_keep: int | None = None
    read_only: bool = False
    should_save_fn: Callable[[int, int | None], bool] | None = None
    save_decision_policy: Any = None
    preservation_policy: Any = None
    debug_use_full_global_mesh: bool = False

    def __post_init__(self) -> None:
        if self.preservation_policy is not None:
            if self.max_to_keep is not None:
                raise ValueError("If `preservation_policy` is provided, `max_to_keep` must be left to its "
                                 "default value (None).")
        elif self.max_to_keep is None:
            self.max_to_keep = 1


@dataclasses.dataclass
class PersistentCheckpointOptions:
    """When persistent checkpoints are saved and which are kept (Orbax's fields and
    defaults: every 1000 steps, all kept)."""

    save_interval_steps: int = 1000
    max_to_keep: int | None = None
    keep_period: int | None = None
    should_save_fn: Callable[[int, int | None], bool] | None = None
    save_decision_policy: Any = None
    preservation_policy: Any = None

    def __post_init__(self) -> None:
        if self.preservation_policy is not None:
            for name in ("max_to_keep", "keep_period"):
                if getattr(self, name) is not None:
                    raise ValueError(f"If `preservation_policy` is provided, `{name}` must be left to its "
                                     "default value (None).")


@dataclasses.dataclass
class CheckpointManagerOptions:
    """Options of the emergency :class:`CheckpointManager` (Orbax's fields).

    ``step_name_format`` may be a :class:`~ocdbt_py.checkpoint.manager.naming.StepNameFormat`
    (``None``: plain step numbers); ``async_options`` and ``single_host_load_and_broadcast``
    are accepted and have no effect.
    """

    local: LocalCheckpointOptions = dataclasses.field(default_factory=LocalCheckpointOptions)
    persistent: PersistentCheckpointOptions = dataclasses.field(default_factory=PersistentCheckpointOptions)
    replica_axis_index: int = 0
    step_name_format: Any = None
    cleanup_tmp_directories: bool = False
    enable_async_checkpointing: bool = True
    async_options: Any = None
    multiprocessing_options: MultiprocessingOptions | None = None
    single_host_load_and_broadcast: bool = True


# ---- Orbax's policies on the native manager (the adapters ocp.CheckpointManager uses too) -----


@dataclasses.dataclass(frozen=True)
class _Never:
    """Saves nothing (a read-only local tier, or the local tier of a one-replica mesh)."""

    deterministic: bool = True

    def should_save(self, ctx: save_lib.SaveContext) -> bool:
        return False


def _save_policy(o: LocalCheckpointOptions | PersistentCheckpointOptions) -> Any:
    """As Orbax's tier managers: ``save_decision_policy``, else the default built from
    ``should_save_fn`` or the interval (which saves the first step too)."""
    policy = o.save_decision_policy or sdp.default_policy(o.save_interval_steps, None, o.should_save_fn)
    return sdp.NativeSaveDecision(policy, reached_preemption=utils.reached_preemption)


def _local_keep(o: LocalCheckpointOptions) -> Any:
    return pp.NativePreservation(o.preservation_policy or pp.default_policy(max_to_keep=o.max_to_keep))


def _persistent_keep(o: PersistentCheckpointOptions) -> Any:
    if o.preservation_policy is None and o.max_to_keep is None and o.keep_period is None:
        return None  # every step kept
    return pp.NativePreservation(o.preservation_policy or pp.default_policy(max_to_keep=o.max_to_keep,
                                                                            keep_period=o.keep_period))


# ---- args and results -----------------------------------------------------------------------


class _Result(Mapping[str, Any]):
    """A restore result indexable by name and attribute (as Orbax's ``args.Composite``)."""

    def __init__(self, **items: Any):
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["_items"][key]
        except KeyError:
            raise AttributeError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Composite({', '.join(f'{k}=...' for k in self._items)})"


def _composite(**items: Any) -> Any:
    """This package's ``args.Composite`` when present, else an equivalent mapping."""
    try:  # the rest of ocdbt_py.orbax (another module) provides Orbax's Composite
        from ocdbt_py.orbax.args import Composite  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return _Result(**items)
    return Composite(**items)


def _items(args: Any) -> dict[str, Any]:
    if args is None:
        return {}
    if isinstance(args, Mapping):
        return dict(args.items())
    if callable(getattr(args, "items", None)):
        return dict(args.items())
    raise ValueError(f"Expected args must be a Composite object, but got {type(args)}.")


def _item_value(arg: Any, name: str) -> Any:
    if not hasattr(arg, "item"):
        raise ValueError(f"item {name!r}: expected StandardSave/PyTreeSave/JsonSave args, not {type(arg).__name__}")
    return arg.item


class CheckpointManager:
    """Orbax's emergency ``CheckpointManager`` (``local_directory`` per process,
    ``persistent_directory`` shared, the ``global_mesh`` with its replica axis and the
    ``abstract_state`` tree) backed by :class:`MultiTierCheckpointManager`.

    Every process creates it and calls the same methods in the same order.  ``metadata``,
    ``logger``, ``item_handlers``, ``handler_registry`` and
    ``persistent_non_replicated_directory`` are accepted for compatibility and unused.
    """

    def __init__(self, local_directory: str | os.PathLike[str], persistent_directory: str | os.PathLike[str],
                 global_mesh: Any, abstract_state: Any, *, options: CheckpointManagerOptions | None = None,
                 metadata: dict[str, Any] | None = None, logger: Any = None, item_handlers: Any = None,
                 handler_registry: Any = None, persistent_non_replicated_directory: Any = None):
        o = options or CheckpointManagerOptions()
        self._options = o
        self._preemption: PreemptionWatcher | None = None
        self._abstract_state = abstract_state
        replicas = int(np.asarray(global_mesh.devices).shape[o.replica_axis_index])
        if replicas <= 0:
            raise ValueError(f"Slice count must be positive, but got {replicas} for mesh {global_mesh}.")
        local_policy: Any = _save_policy(o.local)
        if o.local.read_only or replicas == 1:
            local_policy = _Never()
        fmt = o.step_name_format if isinstance(o.step_name_format, StepNameFormat) else None
        timeout = (o.multiprocessing_options or MultiprocessingOptions()).coordination_timeout_secs
        self._mgr = MultiTierCheckpointManager(
            local_directory, persistent_directory, global_mesh=global_mesh, abstract_state=abstract_state,
            replica_axis_index=o.replica_axis_index, local_policy=local_policy,
            local_preservation=_local_keep(o.local),
            persistent_policy=_save_policy(o.persistent),
            persistent_preservation=_persistent_keep(o.persistent), async_save=o.enable_async_checkpointing,
            step_name_format=fmt, coordination_timeout_secs=float(timeout),
            persistent_item="default" if replicas > 1 else _STATE)

    @property
    def multitier(self) -> MultiTierCheckpointManager:
        """The native manager underneath."""
        return self._mgr

    @property
    def directory(self) -> Any:
        """The persistent directory: a ``pathlib.Path`` when local, else its URL."""
        url = self._mgr.persistent_directory
        if url.startswith("file://"):
            return pathlib.Path(url[len("file://"):])
        return pathlib.Path(url) if "://" not in url else url

    @property
    def in_primary_slice(self) -> bool:
        """Whether this process belongs to replica 0 (the one writing the persistent tier)."""
        return self._mgr.replica == 0

    @property
    def global_mesh(self) -> Any:
        """The mesh given at creation."""
        return self._mgr.global_mesh

    def all_steps(self, read: bool | None = None) -> Sequence[int]:
        """Steps complete in some replica's local tiers or in the persistent tier (the same
        list in every process).  ``read=True`` re-reads every tier (a collective)."""
        if read:
            self._mgr.reload()
        return self._mgr.all_steps()

    def latest_step(self) -> int | None:
        """The newest of :meth:`all_steps`."""
        return self._mgr.latest_step()

    def best_step(self) -> int | None:
        """Not implemented, as in Orbax."""
        raise NotImplementedError("Metrics tracking not yet implemented for emergency.CheckpointManager.")

    def reload(self) -> None:
        """Re-read both tiers (every process calls it)."""
        self._mgr.reload()

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is at or after JAX's preemption sync point."""
        if self._preemption is None:
            self._preemption = PreemptionWatcher()
        return self._preemption.reached(step)

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save to some tier."""
        latest = self.latest_step()
        if latest is not None and latest >= step:
            return False
        return self._mgr.should_save(step)

    def delete(self, step: int) -> None:
        """Not implemented, as in Orbax."""
        raise NotImplementedError("Delete not yet implemented for emergency.CheckpointManager.")

    def save(self, step: int, args: Any, *, force: bool = False, custom_metadata: dict[str, Any] | None = None
             ) -> bool:
        """Save ``args.state`` (the state tree) to the tiers whose options say so, with every
        other item as this process's own JSON state; returns whether any tier saved.
        ``custom_metadata`` is accepted and not stored (the steps carry the manager's own)."""
        items = _items(args)
        if _STATE not in items:
            raise ValueError(f"{_STATE} is a required key and should be specified by the user.")
        if _RESERVED in items:
            raise ValueError(f"{_RESERVED} is a reserved key and should not be specified by the user.")
        state = _item_value(items.pop(_STATE), _STATE)
        process_state = {k: _item_value(v, k) for k, v in items.items()} or None
        return self._mgr.save(step, state, force=force, process_state=process_state)

    def restore(self, step: int | None, args: Any = None) -> Any:
        """Restore ``step`` (``None``: the latest) onto ``abstract_state``: ``Composite(state=...)``
        plus, for each JSON item named in ``args``, this process's own document."""
        wanted = [k for k in _items(args) if k != _STATE]
        if step is None and self.latest_step() is None:
            raise FileNotFoundError("No steps found in persistent or local storage.")
        tree, own = self._mgr.restore(step, with_process_state=True)
        out = {_STATE: tree}
        for k in wanted:
            out[k] = own.get(k) if isinstance(own, dict) else None
        return _composite(**out)

    def item_metadata(self, step: int) -> Any:
        """Not implemented, as in Orbax."""
        raise NotImplementedError("Item metadata not implemented for emergency.CheckpointManager.")

    def metadata(self, step: int | None = None) -> Any:
        """Not implemented, as in Orbax."""
        raise NotImplementedError("Metadata not yet implemented for emergency.CheckpointManager.")

    def metrics(self, step: int) -> Any:
        """Not implemented, as in Orbax."""
        raise NotImplementedError("Metrics not yet implemented for emergency.CheckpointManager.")

    def wait_until_finished(self) -> None:
        """Block until every save has committed."""
        self._mgr.wait_until_finished()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save."""
        self._mgr.check_for_errors()

    def close(self) -> None:
        """Wait for saves and release the manager."""
        try:
            self._mgr.close()
        finally:
            if self._preemption is not None:
                self._preemption.close()
                self._preemption = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
