"""``ocp.Checkpointer`` and friends: save or restore one checkpoint directory.

``Checkpointer(handler)`` saves blocking, ``AsyncCheckpointer(handler)`` in the background
(``wait_until_finished()`` before reading); ``StandardCheckpointer`` (async, as in Orbax) and
``PyTreeCheckpointer`` are the usual shortcuts.  Saves go through
:func:`ocdbt_py.checkpoint.save`, restores through :func:`ocdbt_py.checkpoint.restore`.
"""

from __future__ import annotations

import os
from typing import Any

from ocdbt_py.checkpoint.restore.api import resolve
from ocdbt_py.checkpoint.saving.atomic import CheckpointExistsError, open_destination
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

__all__ = ["DestinationExistsError", "AbstractCheckpointer", "Checkpointer", "AsyncCheckpointer",
           "StandardCheckpointer", "PyTreeCheckpointer"]

Location = str | os.PathLike[str] | KvStore


class DestinationExistsError(CheckpointExistsError, ValueError):
    """``save`` without ``force`` found the directory already there (a ``ValueError``, as
    Orbax raises)."""


def _args_from_call(handler: CheckpointHandler, for_save: bool, positional: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """Orbax's ``construct_checkpoint_args``: ``args=``, a positional CheckpointArgs, or the
    legacy ``save(path, item, **kw)`` form wrapped into the handler's argument class."""
    a = kwargs.pop("args", None)
    if a is None and positional and isinstance(positional[0], args_lib.CheckpointArgs):
        a, positional = positional[0], positional[1:]
    if a is not None:
        if positional or kwargs:
            raise TypeError("give either args= or the legacy item arguments, not both")
        return a
    if not positional and not kwargs:
        return None
    cls = handler.save_args if for_save else handler.restore_args
    if cls is args_lib.Composite or cls is args_lib.CheckpointArgs:
        raise TypeError(f"{type(handler).__name__} needs args=")
    return cls(*positional, **kwargs)


class AbstractCheckpointer:
    """What every checkpointer offers: ``save``, ``restore``, ``metadata``, ``close``."""


class Checkpointer(AbstractCheckpointer):
    """Saves (blocking) and restores one directory with ``handler``."""

    _blocking = True

    def __init__(self, handler: CheckpointHandler, **ignored: Any):
        refuse_orbax_object(handler, "the checkpointer's handler")
        if not isinstance(handler, CheckpointHandler):
            raise TypeError(f"{handler!r} is not an ocdbt_py.orbax handler")
        self._handler = handler
        self._handle: Any = None

    @property
    def handler(self) -> CheckpointHandler:
        """The handler this checkpointer uses."""
        return self._handler

    def save(self, directory: Location, *args: Any, force: bool = False,
             custom_metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Write a checkpoint to ``directory`` (``force``: replace an existing one)."""
        kwargs.pop("save_context", None)
        a = _args_from_call(self._handler, True, args, kwargs)
        if a is None:
            raise ValueError("nothing to save: pass args=")
        self.wait_until_finished()
        if not force and open_destination(directory, None).exists():
            raise DestinationExistsError(f"Destination {directory} already exists.")
        self._handle = self._handler.start_save(directory, a, force=force, custom_metadata=custom_metadata,
                                                blocking=self._blocking)

    def restore(self, directory: Location, *args: Any, **kwargs: Any) -> Any:
        """Restore ``directory`` (``args=`` says how; a ``Composite`` result for composites)."""
        a = _args_from_call(self._handler, False, args, kwargs)
        self.wait_until_finished()
        if isinstance(self._handler, CompositeCheckpointHandler):
            available = [n for n in resolve(directory).items() if n != "metrics"]
            return self._handler.restore_items(directory, a, available)
        return self._handler.restore_from(directory, a)

    def metadata(self, directory: Location) -> StepMetadata:
        """``_CHECKPOINT_METADATA`` and the item's tree metadata (no array data read)."""
        return step_metadata(directory, composite=isinstance(self._handler, CompositeCheckpointHandler))

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
        """Wait for a background save."""
        self.wait_until_finished()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncCheckpointer(Checkpointer):
    """As :class:`Checkpointer`, but ``save`` returns once host copies are made."""

    _blocking = False

    def __init__(self, handler: CheckpointHandler, timeout_secs: int = 600, **ignored: Any):
        super().__init__(handler)


class StandardCheckpointer(AsyncCheckpointer):
    """``save(directory, state)`` / ``restore(directory, target)`` of a tree of arrays (async)."""

    def __init__(self, **ignored: Any):
        super().__init__(StandardCheckpointHandler())

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
