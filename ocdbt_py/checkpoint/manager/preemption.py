"""Noticing preemption: SIGTERM in one process, JAX's preemption sync point in a JAX job.

A cloud scheduler announces preemption with SIGTERM some seconds before it kills a process.
The watcher turns the signal into "the next step is the one to save at": in a single process
its handler only sets a flag (the process is not terminated, so the training loop can save
and exit); in a multi-process JAX job JAX's own preemption sync manager (set up by
``jax.distributed.initialize``) makes every process agree on the same step.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

__all__ = ["PreemptionWatcher"]

_lock = threading.Lock()
_users = 0
_received = threading.Event()
_previous: Any = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.set()


def _install() -> None:
    global _users, _previous
    with _lock:
        if _users == 0 and threading.current_thread() is threading.main_thread():
            try:
                _previous = signal.signal(signal.SIGTERM, _on_sigterm)
            except (ValueError, OSError):  # not allowed here (e.g. embedded interpreters)
                _previous = None
            else:
                _users += 1
                return
        elif _users > 0:
            _users += 1


def _uninstall() -> None:
    global _users, _previous
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and threading.current_thread() is threading.main_thread():
            try:
                signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
            except (ValueError, OSError, TypeError):
                pass
            _previous = None


def _jax_sync_manager() -> Any:
    if "jax" not in sys.modules:
        return None
    try:
        # optional: JAX is imported only for trees that hold JAX objects
        import jax
        from jax._src import distributed

        if jax.process_count() <= 1:
            return None
        return distributed.global_state.preemption_sync_manager
    except Exception:  # noqa: BLE001 - private API moved: fall back to the signal
        return None


class PreemptionWatcher:
    """Answers whether a step is at or after the preemption point."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._installed = False
        if _jax_sync_manager() is None:
            _install()
            self._installed = True

    def reached(self, step: int) -> bool:
        """Whether ``step`` is at or after the step where preemption was taken up.

        The first step asked about after the notice becomes the preemption step.
        """
        if self._step is not None:
            return step >= self._step
        mgr = _jax_sync_manager()
        if mgr is not None:
            hit = bool(mgr.reached_sync_point(step))
        else:
            hit = _received.is_set()
        if hit:
            self._step = step
        return hit

    @property
    def step(self) -> int | None:
        """The preemption step, once known."""
        return self._step

    def close(self) -> None:
        """Restore the previous SIGTERM handler (when this was its last user)."""
        if self._installed:
            self._installed = False
            _uninstall()
