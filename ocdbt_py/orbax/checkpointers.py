"""``ocp.Checkpointer`` and friends: save or restore one checkpoint directory.

``Checkpointer(handler)`` saves blocking, ``AsyncCheckpointer(handler)`` in the background
(``wait_until_finished()`` before reading); ``StandardCheckpointer`` (async, as in Orbax) and
``PyTreeCheckpointer`` are the usual shortcuts.  A save to a local directory runs Orbax's
sequence (temporary path, the handler's ``save``/``async_save`` into it, ``_CHECKPOINT_METADATA``,
``finalize``); the built-in handlers write through :func:`ocdbt_py.checkpoint.save`, restores
go through :func:`ocdbt_py.checkpoint.restore`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import pathlib
import shutil
import time
from collections.abc import Coroutine
from typing import Any

from ocdbt_py.checkpoint.layout import STEP_METADATA
from ocdbt_py.checkpoint.layout import step_metadata as read_step_doc
from ocdbt_py.checkpoint.restore.api import resolve
from ocdbt_py.checkpoint.saving import async_save
from ocdbt_py.checkpoint.saving.atomic import CheckpointExistsError, open_destination
from ocdbt_py.checkpoint.saving.distributed import Coordinator, coordinator
from ocdbt_py.checkpoint.saving.layout_writer import checkpoint_metadata
from ocdbt_py.errors import NotFoundError, OcdbtError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.orbax import args as args_lib
from ocdbt_py.orbax._foreign import refuse_orbax_object
from ocdbt_py.orbax.handlers import (
    CheckpointHandler,
    CompositeCheckpointHandler,
    PyTreeCheckpointHandler,
    StandardCheckpointHandler,
)
from ocdbt_py.orbax.metadata import StepMetadata, step_metadata
from ocdbt_py.orbax.options import AsyncOptions
from ocdbt_py.orbax.path import atomicity
from ocdbt_py.orbax.step_statistics import from_stored
from ocdbt_py.orbax.utils import is_primary_host

__all__ = ["DestinationExistsError", "IncompleteCheckpointError", "wait_for_futures", "AbstractCheckpointer",
           "Checkpointer", "AsyncCheckpointer", "StandardCheckpointer", "PyTreeCheckpointer"]

Location = str | os.PathLike[str] | KvStore


class DestinationExistsError(CheckpointExistsError, ValueError):
    """``save`` without ``force`` found the directory already there (a ``ValueError``, as
    Orbax raises)."""


class IncompleteCheckpointError(OcdbtError, ValueError):
    """``restore`` of a directory a save never finalized (a temporary directory, or no
    ``commit_success.txt`` with ``CommitFileTemporaryPath``): a ``ValueError``, as Orbax raises."""


class _LegacyArgs(args_lib.CheckpointArgs):
    """The positional and keyword arguments of a handler with no registered argument classes
    (Orbax's legacy handler protocol: ``save(directory, item, ...)``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args = args
        self.kwargs = kwargs


def _args_from_call(handler: CheckpointHandler, for_save: bool, positional: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """Orbax's ``construct_checkpoint_args``: ``args=``, a positional CheckpointArgs, or the
    legacy ``save(path, item, **kw)`` form wrapped into the argument class registered for the
    handler (its ``save_args``/``restore_args`` otherwise)."""
    a = kwargs.pop("args", None)
    if a is None and positional and isinstance(positional[0], args_lib.CheckpointArgs):
        a, positional = positional[0], positional[1:]
    if a is not None:
        if positional or kwargs:
            raise TypeError("give either args= or the legacy item arguments, not both")
        return a
    if not positional and not kwargs and handler._builtin:
        return None
    try:
        save_cls, restore_cls = args_lib.get_registered_args_cls(handler)
    except ValueError:
        save_cls, restore_cls = handler.save_args, handler.restore_args
    cls = save_cls if for_save else restore_cls
    if cls is args_lib.Composite or cls is args_lib.CheckpointArgs:
        if not positional and not kwargs:
            return None
        raise TypeError(f"{type(handler).__name__} needs args=")
    return cls(*positional, **kwargs)


def _local_directory(directory: Location) -> pathlib.Path | None:
    """``directory`` as a local path, or ``None`` for a URL or a :class:`KvStore`."""
    if isinstance(directory, KvStore):
        return None
    text = os.fspath(directory)
    if "://" in text and not text.startswith("file://"):
        return None
    return pathlib.Path(text.removeprefix("file://"))


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to its end, also when called from inside a running event loop (then on a
    thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    async_save.Background(run, name="ocdbt-orbax-async-save").join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _flat_futures(found: Any) -> list[Any]:
    """The futures an ``async_save`` returned (nested lists allowed, ``None`` dropped)."""
    out: list[Any] = []
    stack = [found]
    while stack:
        x = stack.pop()
        if x is None:
            continue
        if isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        else:
            out.append(x)
    return out


def wait_for_futures(futures: list[Any], timeout_secs: float | None) -> None:
    """Wait for every future in turn, all within ``timeout_secs``; ``TimeoutError`` with
    Orbax's text ("ChainedFuture completed k/n futures but timed out after ...") otherwise."""
    start = time.time()
    n = len(futures)
    for k, f in enumerate(futures):
        remaining = None
        if timeout_secs is not None:
            elapsed = time.time() - start
            if elapsed >= timeout_secs:
                raise TimeoutError(f"Timed out after {elapsed} seconds.")
            remaining = timeout_secs - elapsed
        try:
            f.result(timeout=remaining)
        except (TimeoutError, concurrent.futures.TimeoutError) as e:
            raise TimeoutError(f"ChainedFuture completed {k}/{n} futures but timed out after "
                               f"{time.time() - start:.2f} seconds.") from e


class AbstractCheckpointer:
    """What every checkpointer offers: ``save``, ``restore``, ``metadata``, ``close``."""


class Checkpointer(AbstractCheckpointer):
    """Saves (blocking) and restores one directory with ``handler``.

    A save to a local directory runs as Orbax's does: the directory's temporary path
    (``temporary_path_class``, default ``AtomicRenameTemporaryPath``) is created, the handler
    writes into it, ``_CHECKPOINT_METADATA`` is written, then the handler's ``finalize`` and the
    temporary path's ``finalize`` make the checkpoint visible.  A handler with no registered
    argument classes is called Orbax's legacy way (``save(directory, *args, **kwargs)``).
    """

    _blocking = True

    def __init__(self, handler: CheckpointHandler, *, multiprocessing_options: Any = None,
                 temporary_path_class: type[atomicity.TemporaryPath] | None = None,
                 checkpoint_metadata_store: Any = None, **ignored: Any):
        refuse_orbax_object(handler, "the checkpointer's handler")
        if not isinstance(handler, CheckpointHandler):
            raise TypeError(f"{handler!r} is not an ocdbt_py.orbax handler")
        for what, obj in (("multiprocessing_options", multiprocessing_options),
                          ("temporary_path_class", temporary_path_class),
                          ("checkpoint_metadata_store", checkpoint_metadata_store)):
            if obj is not None:
                refuse_orbax_object(obj, what)
        if temporary_path_class is not None and not (isinstance(temporary_path_class, type) and
                                                     issubclass(temporary_path_class, atomicity.TemporaryPath)):
            raise TypeError(f"temporary_path_class must be an ocp.path.atomicity.TemporaryPath class, "
                            f"not {temporary_path_class!r}")
        self._handler = handler
        self._legacy = handler._custom() and not args_lib.registered_args_of(handler)
        self._temporary_path_class = temporary_path_class
        self._primary = getattr(multiprocessing_options, "primary_host", 0)
        self._handle: Any = None

    @property
    def handler(self) -> CheckpointHandler:
        """The handler this checkpointer uses."""
        return self._handler

    def _save_args(self, positional: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._legacy:
            return _LegacyArgs(*positional, **kwargs)
        a = _args_from_call(self._handler, True, positional, kwargs)
        if a is None:
            raise ValueError("nothing to save: pass args=")
        return a

    def save(self, directory: Location, *args: Any, force: bool = False,
             custom_metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Write a checkpoint to ``directory`` (``force``: replace an existing one)."""
        kwargs.pop("save_context", None)
        self.wait_until_finished()
        local = _local_directory(directory)
        if local is None:  # URLs and stores: the native save commits by the marker file itself
            a = self._save_args(args, kwargs)
            if not force and open_destination(directory, None).exists():
                raise DestinationExistsError(f"Destination {directory} already exists.")
            self._handle = self._handler.start_save(directory, a, force=force, custom_metadata=custom_metadata,
                                                    blocking=self._blocking)
            return
        started = time.perf_counter()
        cls = self._temporary_path_class or atomicity.AtomicRenameTemporaryPath
        primary = is_primary_host(self._primary)
        exists = os.path.lexists(local)
        if exists and not force:
            raise DestinationExistsError(f"Destination {directory} already exists.")
        a = self._save_args(args, kwargs)
        tmp = cls.from_final(local)
        if exists and primary and not issubclass(cls, atomicity.AtomicRenameTemporaryPath):
            _remove(local)  # written in place: the old one goes first (a rename replaces it at the end)
        init_ns = time.time_ns()
        coord = coordinator()  # every process saves: the primary creates and finalizes, all wait for it
        err: BaseException | None = None
        if primary:
            try:
                tmp.create()
                (tmp.get() / STEP_METADATA).write_bytes(checkpoint_metadata(None, init_ns=init_ns, commit_ns=None))
            except BaseException as e:  # noqa: BLE001 - shared with the other processes first
                err = e
        coord.sync("checkpointer_created", err)
        if self._blocking:
            try:
                self._write(tmp.get(), a)
            except BaseException as e:  # noqa: BLE001 - shared with the other processes first
                err = e
            coord.sync("checkpointer_written", err)
            self._finish(coord, tmp, custom_metadata, init_ns, primary)
            return
        try:
            futures = self._write_async(tmp.get(), a)
        except BaseException as e:
            coord.sync("checkpointer_written", e)  # the others' background saves stop there
            raise
        timeout = self._timeout_secs

        def work() -> None:
            err: BaseException | None = None
            try:
                wait_for_futures(futures, timeout)
            except BaseException as e:  # noqa: BLE001 - shared with the other processes first
                err = e
            coord.sync("checkpointer_written", err)
            self._finish(coord, tmp, custom_metadata, init_ns, primary)

        self._handle = async_save.start(str(local), work, blocking=False, started=started)

    def _finish(self, coord: Coordinator, tmp: atomicity.TemporaryPath, custom_metadata: dict[str, Any] | None,
                init_ns: int, primary: bool) -> None:
        """The primary finalizes; every process returns once the checkpoint is visible."""
        err: BaseException | None = None
        if primary:
            try:
                self._finalize(tmp, custom_metadata, init_ns)
            except BaseException as e:  # noqa: BLE001 - shared with the other processes first
                err = e
        coord.sync("checkpointer_finalized", err)

    _timeout_secs: float | None = None

    def _write(self, path: pathlib.Path, a: Any) -> None:
        """The handler's blocking save into ``path``."""
        h = self._handler
        if isinstance(a, _LegacyArgs):
            h.save(path, *a.args, **a.kwargs)
        elif h._custom() and not h._overrides("save"):
            h._write_custom(path, a)  # an async-only custom handler: its async_save, waited for
        else:
            h.save(path, args=a)

    def _write_async(self, path: pathlib.Path, a: Any) -> list[Any]:
        """The handler's ``async_save`` into ``path``: the futures its background part is."""
        h = self._handler
        if isinstance(a, _LegacyArgs):
            if not h._overrides("async_save"):
                h.save(path, *a.args, **a.kwargs)
                return []
            return _flat_futures(_run_sync(h.async_save(path, *a.args, **a.kwargs)))
        return _flat_futures(_run_sync(h.async_save(path, args=a)))

    def _finalize(self, tmp: atomicity.TemporaryPath, custom_metadata: dict[str, Any] | None, init_ns: int) -> None:
        """``_CHECKPOINT_METADATA``, the handler's ``finalize``, then the temporary path's
        (the primary process, as Orbax)."""
        self._write_step_metadata(tmp.get(), custom_metadata, init_ns)
        self._handler.finalize(tmp.get())
        tmp.finalize()

    def _write_step_metadata(self, path: pathlib.Path, custom_metadata: dict[str, Any] | None, init_ns: int) -> None:
        """``_CHECKPOINT_METADATA``: what the handler's save wrote there (a composite save's
        item handlers), with the handler's type, the custom metadata and the commit time."""
        f = path / STEP_METADATA
        try:
            doc = json.loads(f.read_bytes())
        except (OSError, ValueError):
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        if isinstance(self._handler, CompositeCheckpointHandler):
            # as Orbax: the item handlers of what the save wrote (its items, still temporary)
            handlers = doc.get("item_handlers") or self._handler.metadata_from_temporary_paths(path).item_handlers
        else:
            handlers = self._handler.typestr()
        init = doc.get("init_timestamp_nsecs")
        fresh = json.loads(checkpoint_metadata(handlers, init_ns=init if isinstance(init, int) else init_ns,
                                               commit_ns=time.time_ns(), custom_metadata=custom_metadata))
        doc.update(fresh)
        f.write_text(json.dumps(doc), encoding="utf-8")

    def restore(self, directory: Location, *args: Any, **kwargs: Any) -> Any:
        """Restore ``directory`` (``args=`` says how; a ``Composite`` result for composites).

        ``FileNotFoundError`` when it does not exist; ``IncompleteCheckpointError`` (a
        ``ValueError``) when it was never finalized."""
        self.wait_until_finished()
        local = _local_directory(directory)
        if local is not None:
            if not local.exists():
                raise NotFoundError(f"Checkpoint at {directory} not found.")
            if not atomicity.is_finalized(local, self._temporary_path_class):
                raise IncompleteCheckpointError(f"Found incomplete checkpoint at {directory}.")
        if self._legacy:
            return self._handler.restore(directory, *args, **kwargs)
        a = _args_from_call(self._handler, False, args, kwargs)
        if isinstance(self._handler, CompositeCheckpointHandler):
            available = [n for n in resolve(directory).items() if n != "metrics"]
            return self._handler.restore_items(directory, a, available)
        return self._handler.restore_from(directory, a)

    def metadata(self, directory: Location) -> StepMetadata:
        """``_CHECKPOINT_METADATA`` and the item's metadata (no array data read): the tree
        metadata of a built-in handler's item; a custom handler's own ``metadata(directory)``
        (``None`` when it has none or it fails with ``FileNotFoundError``,
        ``NotImplementedError``, ``ValueError`` or ``TypeError``, as Orbax)."""
        h = self._handler
        if not h._custom():
            return step_metadata(directory, composite=isinstance(h, CompositeCheckpointHandler))
        doc = read_step_doc(resolve(directory).kv) or {}
        try:
            item = h.item_metadata(directory, None)
        except (FileNotFoundError, NotImplementedError, ValueError, TypeError):
            item = None
        return StepMetadata(item_handlers=doc.get("item_handlers"), item_metadata=item,
                            metrics=doc.get("metrics") or {},
                            performance_metrics=from_stored(doc.get("performance_metrics")),
                            init_timestamp_nsecs=doc.get("init_timestamp_nsecs"),
                            commit_timestamp_nsecs=doc.get("commit_timestamp_nsecs"),
                            custom_metadata=doc.get("custom_metadata") or {})

    def wait_until_finished(self) -> None:
        """Block until a background save is committed; raise its error."""
        h, self._handle = self._handle, None
        if h is not None:
            h.wait()

    def check_for_errors(self) -> None:
        """Raise the error of a finished background save, if any."""
        h = self._handle
        if h is not None and h.done():
            self.wait_until_finished()

    def close(self) -> None:
        """Wait for a background save, then close the handler."""
        self.wait_until_finished()
        self._handler.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


class AsyncCheckpointer(Checkpointer):
    """As :class:`Checkpointer`, but ``save`` returns once the handler's ``async_save`` has
    returned its futures (host copies made); they are waited for, and the checkpoint
    finalized, in the background.  ``timeout_secs`` (default ``async_options.timeout_secs``)
    bounds that wait: past it ``wait_until_finished()`` raises ``TimeoutError``."""

    _blocking = False

    def __init__(self, handler: CheckpointHandler, timeout_secs: int | None = None, *,
                 async_options: AsyncOptions | None = None, **options: Any):
        super().__init__(handler, **options)
        if async_options is not None:
            refuse_orbax_object(async_options, "async_options")
        timeout = timeout_secs or (async_options or AsyncOptions()).timeout_secs
        if timeout <= 0:
            raise ValueError(f"Timeout must be positive, but got {timeout} seconds.")
        self._timeout_secs = timeout


class StandardCheckpointer(AsyncCheckpointer):
    """``save(directory, state)`` / ``restore(directory, target)`` of a tree of arrays (async)."""

    def __init__(self, **options: Any):
        super().__init__(StandardCheckpointHandler(), **options)

    def save(self, directory: Location, state: Any = None, *args: Any, save_args: Any = None,  # type: ignore[override]
             force: bool = False, custom_metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Save ``state`` (``save_args``: per-leaf :class:`SaveArgs`)."""
        if isinstance(state, args_lib.CheckpointArgs):
            super().save(directory, args=state, force=force, custom_metadata=custom_metadata)
        elif "args" in kwargs:
            super().save(directory, args=kwargs["args"], force=force, custom_metadata=custom_metadata)
        else:
            super().save(directory, args=args_lib.StandardSave(state, save_args), force=force,
                         custom_metadata=custom_metadata)

    def restore(self, directory: Location, target: Any = None, *args: Any, strict: bool = True,  # type: ignore[override]
                **kwargs: Any) -> Any:
        """Restore onto ``target`` (abstract leaves with shardings, or ``None``)."""
        if isinstance(target, args_lib.CheckpointArgs):
            return super().restore(directory, args=target)
        if "args" in kwargs:
            return super().restore(directory, args=kwargs["args"])
        return super().restore(directory, args=args_lib.StandardRestore(target, strict=strict))


class PyTreeCheckpointer(Checkpointer):
    """``Checkpointer(PyTreeCheckpointHandler(...))`` (blocking, as in Orbax)."""

    def __init__(self, primary_host: int | None = 0, use_ocdbt: bool = True, use_zarr3: bool = False,
                 use_compression: bool = True):
        super().__init__(PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3,
                                                 use_compression=use_compression))
