"""``ocp.CheckpointManager`` with Orbax's options and semantics, over the native manager.

The native :class:`ocdbt_py.checkpoint.manager.CheckpointManager` writes, lists, restores
and deletes steps; this class keeps Orbax's bookkeeping on top: the list of tracked
checkpoints (a step counts from the moment its save starts), Orbax's save decision and
preservation policies (asked with that list, so ``BestN`` may delete the step just saved),
deletions after the commit, default-item mode and ``Composite`` arguments and results.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pathlib
import time
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

from ocdbt_py.checkpoint.manager.manager import CheckpointManager as NativeManager
from ocdbt_py.checkpoint.manager.manager import StepAlreadyExistsError
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.meta import list_steps
from ocdbt_py.checkpoint.restore.api import resolve
from ocdbt_py.errors import NotFoundError, UnsupportedError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore
from ocdbt_py.orbax import _telemetry as telemetry
from ocdbt_py.orbax import args as args_lib
from ocdbt_py.orbax import preservation as pp
from ocdbt_py.orbax import save_decision as sdp
from ocdbt_py.orbax import utils
from ocdbt_py.orbax._foreign import refuse_orbax_object
from ocdbt_py.orbax.checkpointers import AsyncCheckpointer, Checkpointer
from ocdbt_py.orbax.handlers import CheckpointHandler, CompositeCheckpointHandler
from ocdbt_py.orbax.logging import StandardLogger
from ocdbt_py.orbax.metadata import (
    RootMetadata,
    StepMetadata,
    read_root_metadata,
    step_metadata,
    write_root_metadata,
)
from ocdbt_py.orbax.options import AsyncOptions, FileOptions, MultiprocessingOptions
from ocdbt_py.orbax.path import atomicity
from ocdbt_py.orbax.path.step import native_format
from ocdbt_py.orbax.preservation import CheckpointInfo
from ocdbt_py.orbax.step_statistics import RestoreStepStatistics, SaveStepStatistics

__all__ = ["CheckpointManager", "CheckpointManagerOptions", "CheckpointInfo", "StepAlreadyExistsError",
           "DEFAULT_ITEM_NAME", "METRIC_ITEM_NAME"]

DEFAULT_ITEM_NAME = "default"
#: a save that waited longer than this for the previous one logs a warning (as Orbax)
WAIT_FOR_PREV_SAVE_WARNING_SECS = 1.0
_log = logging.getLogger(__name__)
METRIC_ITEM_NAME = "metrics"


@dataclasses.dataclass
class CheckpointManagerOptions:
    """Orbax's manager options (same names and defaults; see ``spec/orbax-api.md`` for the few
    that are accepted and ignored)."""

    save_interval_steps: int = 1
    max_to_keep: int | None = None
    keep_time_interval: datetime.timedelta | None = None
    keep_period: int | None = None
    best_fn: Callable[[Any], float] | None = None
    best_mode: str = "max"
    keep_checkpoints_without_metrics: bool = True
    step_prefix: str | None = None
    step_format_fixed_length: int | None = None
    step_name_format: Any = None
    create: bool = True
    cleanup_tmp_directories: bool = False
    save_on_steps: Container[int] | None = None
    single_host_load_and_broadcast: bool = False
    todelete_subdir: str | None = None
    todelete_full_path: str | None = None
    enable_background_delete: bool = False
    num_deletion_threads: int | None = None
    read_only: bool = False
    enable_async_checkpointing: bool = True
    async_options: AsyncOptions | None = None
    multiprocessing_options: MultiprocessingOptions = dataclasses.field(default_factory=MultiprocessingOptions)
    should_save_fn: Callable[[int, int | None], bool] | None = None
    file_options: FileOptions = dataclasses.field(default_factory=FileOptions)
    atomicity_options: Any = None
    save_root_metadata: bool = True
    temporary_path_class: Any = None
    save_decision_policy: sdp.SaveDecisionPolicy | None = None
    preservation_policy: pp.PreservationPolicy | None = None
    prevent_write_metrics: bool = False
    enable_should_save_is_saving_in_progress_check: bool = True
    enable_per_process_directory_creation: bool = False
    lightweight_initialize: bool = False

    def __post_init__(self) -> None:
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"`CheckpointManagerOptions.best_mode` must be one of None, 'min' or 'max'. "
                             f"Got {self.best_mode}.")
        if self.preservation_policy is None and self.max_to_keep is not None and self.max_to_keep < 0:
            raise ValueError("Setting of `max_to_keep` must be None or non-negative.")
        if self.read_only:  # as Orbax: a read-only manager neither saves nor deletes
            self.save_interval_steps = 0
            self.max_to_keep = self.keep_time_interval = self.keep_period = None
            self.create = self.cleanup_tmp_directories = False
            self.save_on_steps = None
            self.todelete_subdir = self.todelete_full_path = None
            self.should_save_fn = None
        fmt_broadcast = bool(getattr(self.step_name_format, "single_host_load_and_broadcast", False))
        if self.single_host_load_and_broadcast and self.step_name_format is not None and not fmt_broadcast:
            raise ValueError("`CheckpointManagerOptions.single_host_load_and_broadcast=True` requires "
                             "`step_name_format.single_host_load_and_broadcast` to be True.")
        if fmt_broadcast and not self.single_host_load_and_broadcast:
            raise ValueError("`step_name_format.single_host_load_and_broadcast=True` but "
                             "`CheckpointManagerOptions.single_host_load_and_broadcast=False`.")
        if self.todelete_full_path is not None:
            raise UnsupportedError("todelete_full_path (a GCS bucket-relative trash path) is not supported; "
                                   "use todelete_subdir")
        if self.todelete_subdir is not None and self.todelete_full_path is not None:
            raise ValueError("todelete_subdir and todelete_full_path both cannot be set togther")
        self.save_on_steps = frozenset(self.save_on_steps or ())  # type: ignore[call-overload]


def default_save_decision_policy(o: CheckpointManagerOptions) -> sdp.SaveDecisionPolicy:
    """The policy Orbax builds from ``save_interval_steps``/``save_on_steps``/``should_save_fn``."""
    return sdp.default_policy(o.save_interval_steps, o.save_on_steps, o.should_save_fn)


def default_preservation_policy(o: CheckpointManagerOptions) -> pp.PreservationPolicy:
    """The policy Orbax builds from ``max_to_keep``/``keep_period``/``keep_time_interval``/``best_fn``."""
    return pp.default_policy(max_to_keep=o.max_to_keep, keep_period=o.keep_period,
                             keep_time_interval=o.keep_time_interval, best_fn=o.best_fn, best_mode=o.best_mode,
                             keep_checkpoints_without_metrics=o.keep_checkpoints_without_metrics)


def _no_args_in_items(items: Any) -> None:
    """Orbax's check: ``CheckpointArgs`` passed positionally (where the legacy ``items`` go)."""
    if isinstance(items, args_lib.CheckpointArgs):
        raise ValueError("Found `CheckpointArgs` in `items`; pass them as `args=` (the positional argument is the "
                         "legacy `items`).")


def _create_root(directory: str | os.PathLike[str], o: CheckpointManagerOptions) -> None:
    """``create=True``: the primary host makes a missing local root (object stores need none)."""
    if o.multiprocessing_options.active_processes is not None:
        raise NotImplementedError("Option `create=True` with `active_processes` set is not supported. Please create "
                                  "the root directory yourself.")
    path = os.fspath(directory)
    if "://" in path and not path.startswith("file://"):
        return
    local = pathlib.Path(path.removeprefix("file://"))
    if not local.exists() and utils.is_primary_host(o.multiprocessing_options.primary_host):
        mode = o.file_options.path_permission_mode if o.file_options else None
        local.mkdir(parents=True, exist_ok=True, **({"mode": mode} if mode is not None else {}))


def _saves_async(o: CheckpointManagerOptions, checkpointers: Any) -> bool:
    """Whether saves run in the background: ``enable_async_checkpointing``, and in the legacy
    ``checkpointers`` form only when one of them is an ``AsyncCheckpointer`` (as Orbax: a
    manager of ``PyTreeCheckpointer``s saves blocking)."""
    if checkpointers is None:
        return bool(o.enable_async_checkpointing)
    given = checkpointers.values() if isinstance(checkpointers, Mapping) else [checkpointers]
    return bool(o.enable_async_checkpointing) and any(isinstance(c, AsyncCheckpointer) for c in given)


class CheckpointManager:
    """Orbax's ``CheckpointManager(directory, item_names=..., item_handlers=..., options=...)``.

    ``storage_options`` (not in Orbax) go to fsspec for URLs.
    """

    def __init__(self, directory: str | os.PathLike[str] | KvStore, checkpointers: Any = None,
                 options: CheckpointManagerOptions | None = None, metadata: Mapping[str, Any] | None = None,
                 item_names: Sequence[str] | None = None,
                 item_handlers: CheckpointHandler | Mapping[str, CheckpointHandler] | None = None,
                 logger: Any = None, handler_registry: Any = None, *,
                 storage_options: dict[str, Any] | None = None):
        for what, obj in (("logger", logger), ("handler_registry", handler_registry), ("options", options)):
            if obj is not None:
                refuse_orbax_object(obj, what)
        if isinstance(item_handlers, Mapping):
            for name, h in item_handlers.items():
                refuse_orbax_object(h, f"item_handlers[{name!r}]")
        elif item_handlers is not None:
            refuse_orbax_object(item_handlers, "item_handlers")
        telemetry.record_event("/jax/orbax/checkpoint_manager/init")
        self._logger = logger if logger is not None else StandardLogger()  # as Orbax: step statistics at INFO
        self._last_save_time: float | None = None
        self._options = o = options or CheckpointManagerOptions()
        fmt = self._name_format(o)
        if o.create and not o.read_only and isinstance(directory, (str, os.PathLike)):
            _create_root(directory, o)
        self._save_policy = o.save_decision_policy or default_save_decision_policy(o)
        self._preservation = o.preservation_policy or default_preservation_policy(o)
        callback = o.async_options.post_finalization_callback if o.async_options else None
        self._native_preservation = pp.NativePreservation(self._preservation)
        # the native manager decides and keeps the steps, asking Orbax's policies through adapters
        self._native = NativeManager(
            directory, save_policy=sdp.NativeSaveDecision(
                self._save_policy, multiprocessing_options=o.multiprocessing_options,
                busy_check=o.enable_should_save_is_saving_in_progress_check,
                reached_preemption=utils.reached_preemption),
            preservation=self._native_preservation, retention="orbax", on_commit=callback,
            todelete_subdir=o.todelete_subdir, async_save=_saves_async(o, checkpointers), step_name_format=fmt,
            storage_options=storage_options, cleanup=o.cleanup_tmp_directories, read_only=o.read_only,
            clock=pp.now)
        self._default: bool | None = None
        handlers: dict[str, CheckpointHandler] = {}
        self._legacy = checkpointers is not None
        if checkpointers is not None:  # Orbax's older form: a Checkpointer, or item name -> Checkpointer
            telemetry.record_event("/jax/orbax/deprecation/checkpoint_manager_legacy_init")
            if item_names is not None or item_handlers is not None:
                raise ValueError("`checkpointers` cannot be combined with `item_names` or `item_handlers`.")
            if isinstance(checkpointers, Mapping):
                self._default = False
                for name, ckptr in checkpointers.items():
                    refuse_orbax_object(ckptr, f"checkpointers[{name!r}]")
                    if not isinstance(ckptr, Checkpointer):
                        raise ValueError(f"Value corresponding to {name} in `checkpointers` is not a Checkpointer. "
                                         f"Found {type(ckptr)}.")
                    if name == METRIC_ITEM_NAME:
                        raise ValueError(f"Found {name} in `checkpointers`; this is a reserved key.")
                    handlers[name] = ckptr.handler
            else:
                refuse_orbax_object(checkpointers, "checkpointers")
                if not isinstance(checkpointers, Checkpointer):
                    raise ValueError(f"Invalid type for `checkpointers`. Found {checkpointers}.")
                self._default = True
                handlers[DEFAULT_ITEM_NAME] = checkpointers.handler
        if item_names is not None:
            self._default = False
        if isinstance(item_handlers, CheckpointHandler):
            if item_names is not None:
                raise ValueError("`item_handlers` in default item mode (a single CheckpointHandler) cannot be combined "
                                 "with `item_names`.")
            self._default = True
            handlers[DEFAULT_ITEM_NAME] = item_handlers
        elif item_handlers is not None:
            self._default = False
            handlers.update(item_handlers)
        if handler_registry is not None and (item_names is not None or item_handlers is not None):
            raise ValueError("`handler_registry` cannot be combined with `item_names` or `item_handlers`.")
        if handler_registry is not None:
            self._default = None
            self._handler = CompositeCheckpointHandler(handler_registry=handler_registry)
        else:
            self._handler = CompositeCheckpointHandler(*(item_names or ()), **handlers)
        # as Orbax: a local step becomes visible through its temporary path class's finalize
        tmp_cls = o.temporary_path_class or atomicity.AtomicRenameTemporaryPath
        self._finalize: Callable[[str, str], None] | None = None
        if isinstance(tmp_cls, type) and issubclass(tmp_cls, atomicity.AtomicRenameTemporaryPath):
            self._finalize = lambda tmp, final: tmp_cls(tmp, final).finalize()
        self._met_items: set[str] = set()  # items a save or restore of this manager handled
        self._root_metadata: RootMetadata | None = None
        if o.read_only and not any(True for _ in self._native.kv.list("metadata/")):
            # as Orbax: a read-only manager without saved root metadata uses the one given
            self._root_metadata = RootMetadata(custom_metadata={} if metadata is None else dict(metadata))
        if metadata is not None and o.save_root_metadata and not o.read_only and self._native.is_primary:
            write_root_metadata(self._native.kv, dict(metadata))
        self.reload()
        telemetry.record_scalar("/jax/orbax/checkpoint_manager/continuous_checkpointing_enabled",
                                int(self._continuous_checkpointing()))

    def _continuous_checkpointing(self) -> bool:
        """Whether the save decision policy given is (or holds) a ``ContinuousCheckpointingPolicy``."""
        policy = self._options.save_decision_policy
        policies = policy.policies if isinstance(policy, sdp.AnySavePolicy) else [policy]
        return any(isinstance(p, sdp.ContinuousCheckpointingPolicy) for p in policies)

    @staticmethod
    def _name_format(o: CheckpointManagerOptions) -> StepNameFormat:
        if o.step_name_format is None:
            return StepNameFormat(o.step_prefix, o.step_format_fixed_length)
        return native_format(o.step_name_format)

    # ---- queries --------------------------------------------------------------------------

    @property
    def directory(self) -> Any:
        """The root: a ``pathlib.Path`` for local directories, else the URL."""
        url = self._native.root
        if "://" not in url:
            return pathlib.Path(url)
        if url.startswith("file://"):
            return pathlib.Path(url[len("file://"):])
        return url

    def reload(self) -> None:
        """Re-read the steps on storage."""
        self._native.reload()

    def all_steps(self, read: bool = False) -> Sequence[int]:
        """The tracked steps, oldest first (a step being saved counts)."""
        if read:
            self.reload()
        return self._native.all_steps(in_flight=True)

    def latest_step(self) -> int | None:
        """The newest tracked step, or ``None``."""
        steps = self._native.all_steps(in_flight=True)
        return steps[-1] if steps else None

    @property
    def _track_best(self) -> bool:
        return self._options.best_fn is not None

    def best_step(self) -> int | None:
        """The best step by ``best_fn``/``best_mode`` (the latest step without ``best_fn``)."""
        if not self._track_best:
            return self.latest_step()
        scored = [c for c in self._native.step_infos(in_flight=True) if c.metrics is not None]
        if not scored:
            return None
        fn = self._options.best_fn
        assert fn is not None
        scored.sort(key=lambda c: fn(c.metrics), reverse=self._options.best_mode == "min")
        return scored[-1].step

    def metrics(self, step: int) -> Any:
        """The metrics stored with ``step`` (``None`` if none)."""
        try:
            m = self._native.metrics(step)
        except NotFoundError:
            return None
        return dict(m) if m is not None else None

    def is_saving_in_progress(self) -> bool:
        """Whether a save has not committed yet."""
        return self._native.is_saving_in_progress()

    def reached_preemption(self, step: int) -> bool:
        """Whether JAX's preemption sync point is reached (multi-process JAX jobs only)."""
        return utils.reached_preemption(step)

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` saves: the save decision policy, asked with the tracked
        checkpoints, after the step is newer than the latest."""
        if self._options.read_only:
            return False
        return self._native.should_save(step)

    # ---- saving ---------------------------------------------------------------------------

    def _composite_args(self, args: Any) -> args_lib.Composite:
        refuse_orbax_object(args, "args")
        if not isinstance(args, args_lib.CheckpointArgs):
            raise ValueError(f"Expected args of type `CheckpointArgs`; found {type(args)}.")
        if self._default is None:
            self._default = not isinstance(args, args_lib.Composite)
        if self._default:
            if isinstance(args, args_lib.Composite):
                raise ValueError("Cannot provide `args` of type `Composite` when dealing with a single, unnamed "
                                 "(default) checkpointable object.")
            return args_lib.Composite(**{DEFAULT_ITEM_NAME: args})
        if not isinstance(args, args_lib.Composite):
            raise ValueError("Must provide `args` of type `Composite` when dealing with multiple checkpointable "
                             "objects.")
        return args

    def _legacy_args(self, items: Any, kwargs: Any, *, for_save: bool) -> args_lib.CheckpointArgs:
        """Orbax's older ``items``/``save_kwargs``/``restore_kwargs`` as ``args``: each item's
        argument class is the one registered for its handler."""
        def one(name: str, item: Any, extra: Any) -> Any:
            handler = self._handler.handlers.get(name)
            if handler is None:
                raise ValueError(f"No handler for item {name!r}: pass `checkpointers` or `item_handlers`.")
            save_cls, restore_cls = args_lib.get_registered_args_cls(handler)
            return (save_cls if for_save else restore_cls)(item, **(extra or {}))

        if self._default is None:
            self._default = DEFAULT_ITEM_NAME in self._handler.handlers
        if self._default:
            return one(DEFAULT_ITEM_NAME, items, kwargs)  # type: ignore[no-any-return]
        items = dict(items or {})
        kwargs = dict(kwargs or {})
        names = list(items) + [k for k in kwargs if k not in items]
        return args_lib.Composite(**{n: one(n, items.get(n), kwargs.get(n)) for n in names})

    def save(self, step: int, items: Any = None, save_kwargs: Any = None, metrics: Any = None,
             force: bool | None = False, args: args_lib.CheckpointArgs | None = None,
             custom_metadata: dict[str, Any] | None = None) -> bool:
        """Save ``args`` as ``step`` if the save decision policy says so (or ``force``)."""
        _no_args_in_items(items)
        if args is None and items is not None:
            args = self._legacy_args(items, save_kwargs, for_save=True)
        if args is None:
            raise ValueError("Must provide `args` for `save`.")
        cargs = self._composite_args(args)
        blocking_start = time.time()
        stats = SaveStepStatistics(step=step, directory=str(self.directory),
                                   checkpoint_manager_blocking_start_time=blocking_start)
        if not force and not self.should_save(step):
            return False
        if self._options.read_only:
            return False
        if self.reached_preemption(step):
            stats.reached_preemption = True
            stats.preemption_received_at = time.time()
        stats.wait_for_prev_start_time = time.time()
        if self._last_save_time is not None:
            stats.time_between_consecutive_saves_sec = stats.wait_for_prev_start_time - self._last_save_time
        self.wait_until_finished()
        stats.wait_for_prev_duration_secs = time.time() - stats.wait_for_prev_start_time
        if stats.wait_for_prev_duration_secs > WAIT_FOR_PREV_SAVE_WARNING_SECS:
            _log.warning("Waiting for previous save to complete took %f seconds. If this number is high, consider "
                         "checkpointing less frequently.", stats.wait_for_prev_duration_secs)
        if step in self.all_steps():
            raise StepAlreadyExistsError(f"Checkpoint for step {step} already exists.")
        natives, opts = self._handler.to_native_items(cargs)
        self._met_items.update(natives)
        write = metrics is not None and self._track_best and not self._options.prevent_write_metrics
        stats.checkpointer_blocking_start_time = time.time()
        self._native_preservation.last_started = None
        if self._finalize is not None:
            opts["finalize"] = self._finalize
        self._native.save(step, natives, metrics=metrics, write_metrics=write, force=True,
                          custom_metadata=custom_metadata, save_options=opts)
        decided = self._native_preservation.last_started
        stats.get_old_steps_start_time = decided if decided is not None else time.time()
        stats.get_old_steps_duration_secs = self._native_preservation.last_duration if decided is not None else 0.0
        # the native save asks the preservation policy itself: that time is get_old_steps', as Orbax splits them
        stats.checkpointer_blocking_duration_secs = max(0.0, time.time() - stats.checkpointer_blocking_start_time
                                                        - stats.get_old_steps_duration_secs)
        self._last_save_time = time.time()
        stats.synchronous = not self._options.enable_async_checkpointing
        stats.checkpoint_manager_blocking_duration_secs = time.time() - blocking_start
        self._logger.log_entry(dataclasses.asdict(stats))
        return True

    def wait_until_finished(self) -> None:
        """Block until the last save is committed and its deletions done; raise its error."""
        self._native.wait_until_finished()

    def check_for_errors(self) -> None:
        """Raise the error of a finished background save, if any."""
        self._native.check_for_errors()

    def delete(self, step: int) -> None:
        """Delete a tracked step."""
        if self._options.read_only:
            return
        if step not in self.all_steps():
            raise FileNotFoundError(f"Requested deleting a non-existent step: {step}.")
        if step not in self._native.all_steps():
            self.wait_until_finished()  # still being committed
        self._native.delete(step)

    # ---- restoring ------------------------------------------------------------------------

    def _step_location(self, step: int, directory: Any) -> Any:
        if directory is not None:
            return f"{os.fspath(directory).rstrip('/')}/{self._native.step_name_format.name(step)}"
        if step in self.all_steps() and step not in self._native.all_steps():
            self.wait_until_finished()  # the step is still being committed
        if step not in self._native.all_steps():
            raise FileNotFoundError(f"No step {step} in {self._native.root} (steps: {self.all_steps()})")
        return PrefixStore(self._native.kv, self._native.step_name_format.name(step))

    def _available(self, location: Any, step: int | None = None) -> list[str]:
        names = [n for n in resolve(location).items() if n != METRIC_ITEM_NAME]
        if not names and step is not None:  # emptied by a concurrent delete (or never finished)
            raise NotFoundError(f"step {step} of {self._native.root} holds no items (deleted while being read?)")
        return names

    def restore(self, step: int | None, items: Any = None, restore_kwargs: Any = None,
                directory: Any = None, args: args_lib.CheckpointArgs | None = None) -> Any:
        """Restore ``step`` (``None``: the latest); a single item in default mode, else a
        ``Composite`` by item name."""
        started = time.time()
        if step is None:
            if directory is None:
                step = self.latest_step()
            else:
                found = [s.step for s in list_steps(directory)]
                step = max(found) if found else None
            if step is None:
                raise FileNotFoundError(f"No steps found in {directory or self.directory}.")
        stats = RestoreStepStatistics(step=step, directory=str(directory or self.directory),
                                      checkpoint_manager_start_time=started)
        location = self._step_location(step, directory)
        available = self._available(location, step)
        if self._default is None:
            self._default = DEFAULT_ITEM_NAME in available and not isinstance(args, args_lib.Composite)
        _no_args_in_items(items)
        if args is None and (items is not None or restore_kwargs is not None):
            args = self._legacy_args(items, restore_kwargs, for_save=False)
        cargs = None if args is None else self._composite_args(args)
        if cargs is None and self._default:
            cargs = args_lib.Composite(**{DEFAULT_ITEM_NAME: None})
        stats.checkpointer_start_time = time.time()
        result = self._handler.restore_items(location, cargs, available)
        stats.checkpointer_duration_secs = time.time() - stats.checkpointer_start_time
        self._met_items.update(result.keys())
        stats.checkpoint_manager_duration_secs = time.time() - started
        self._logger.log_entry(dataclasses.asdict(stats))
        return result[DEFAULT_ITEM_NAME] if self._default else result

    def metadata(self, step: int | None = None) -> StepMetadata | RootMetadata:
        """A step's :class:`StepMetadata`, or (no step) the manager's :class:`RootMetadata`."""
        if step is None:
            if self._root_metadata is None:
                self._root_metadata = read_root_metadata(self._native.kv)
            return self._root_metadata
        location = self._step_location(step, None)
        available = self._available(location, step)
        if self._default is None:
            self._default = DEFAULT_ITEM_NAME in available
        meta = step_metadata(location, composite=True)
        # as Orbax: an item whose handler this manager does not know yet (neither configured nor
        # met by a save or restore) has no item metadata
        meta.item_metadata = args_lib.Composite(**{
            n: self._item_metadata(location, n, v) for n, v in meta.item_metadata.items()})
        if self._default:
            meta.item_metadata = meta.item_metadata[DEFAULT_ITEM_NAME]
        m = self.metrics(step)
        if m is not None:
            meta.metrics = m
        return meta

    def _item_metadata(self, location: Any, name: str, stored: Any) -> Any:
        """Item ``name``'s metadata as its handler gives it (``stored`` for a handler met
        without an instance; ``None`` for an unknown one)."""
        h = self._handler.handlers.get(name)
        if h is not None:
            return h.item_metadata(location, name)
        return stored if self._knows_handler(name) else None

    def _knows_handler(self, name: str) -> bool:
        """Whether item ``name`` has a handler here: configured, registered or met by a save or restore."""
        if name in self._met_items or self._handler.handlers.get(name) is not None:
            return True
        reg = self._handler.registry
        return reg is not None and hasattr(reg, "handler_of_item") and reg.handler_of_item(name) is not None

    def item_metadata(self, step: int) -> Any:
        """The items' tree metadata (``metadata(step).item_metadata``)."""
        if step is None:
            raise ValueError("`step` must be provided.")
        meta = self.metadata(step)
        assert isinstance(meta, StepMetadata)
        return meta.item_metadata

    # ---- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for outstanding saves, then release the manager."""
        try:
            self.wait_until_finished()
        finally:
            self._native.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ocdbt_py.orbax.CheckpointManager {self._native.root} steps={self.all_steps()}>"
