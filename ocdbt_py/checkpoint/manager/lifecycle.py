"""What both managers do when closed or used as context managers."""

from __future__ import annotations

from typing import TypeVar

from ocdbt_py.checkpoint.manager.preemption import PreemptionWatcher

__all__ = ["Lifecycle"]

_T = TypeVar("_T", bound="Lifecycle")


class Lifecycle:
    """``close()`` waits for pending saves, then releases the preemption watcher; a closed
    manager refuses further use.  Subclasses set ``_closed`` and ``_preemption`` and define
    :meth:`wait_until_finished`."""

    _closed: bool
    _preemption: PreemptionWatcher | None

    def wait_until_finished(self) -> None:
        """Block until every save is done; raise the first error."""
        raise NotImplementedError

    def close(self) -> None:
        """Wait for pending saves, then release the manager (idempotent)."""
        if self._closed:
            return
        try:
            self.wait_until_finished()
        finally:
            self._closed = True
            if self._preemption is not None:
                self._preemption.close()

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the {type(self).__name__} is closed")
