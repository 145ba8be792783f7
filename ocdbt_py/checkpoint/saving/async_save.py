"""Saves that finish in the background: :class:`SaveHandle`.

``save(..., blocking=False)`` copies what it needs to host memory, then hands encoding, I/O,
the merge and the commit to a (non-daemon) thread and returns a handle.  Saves run one at a
time per process: a new save first waits for the previous one and re-raises its error if
nobody collected it with :meth:`SaveHandle.wait`.  A save started from inside another save's
work (a custom handler whose ``save`` saves a built-in item into the step's directory) is part
of that save: it neither waits for it nor takes its place as the previous save, and it runs to
its end before returning, so the outer save ends after it.

:class:`Background` is the one way saving runs work on a thread of its own (the save of a
non-blocking call, the fsync of the data files while the primary builds the merged root, a
step manager's wait for each commit and the retention after it: ``manager/tier.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["SaveHandle", "Background", "start", "wait_for_previous"]

_lock = threading.Lock()
_last: SaveHandle | None = None
_inside = threading.local()  # .handle: the save whose work this thread is running


def _current() -> SaveHandle | None:
    """The save whose work runs on this thread (``None`` outside any)."""
    h: SaveHandle | None = getattr(_inside, "handle", None)
    return h


def _run_inside(handle: SaveHandle, work: Callable[[], None]) -> Callable[[], None]:
    """``work`` run with ``handle`` as this thread's current save."""
    def run() -> None:
        outer = _current()
        _inside.handle = handle
        try:
            work()
        finally:
            _inside.handle = outer
    return run


class Background:
    """``fn()`` on a thread of its own, started at once; :meth:`join` waits and re-raises its
    error.  ``then(error)``, if given, runs on that thread when ``fn`` has finished."""

    def __init__(self, fn: Callable[[], None], *, name: str, daemon: bool = True,
                 then: Callable[[BaseException | None], None] | None = None):
        self.error: BaseException | None = None
        self._fn = fn
        self._then = then
        self.thread = threading.Thread(target=self._run, name=name, daemon=daemon)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to join() / then()
            self.error = e
        if self._then is not None:
            self._then(self.error)

    def join(self, check: bool = True) -> None:
        """Wait for ``fn``; raise its error (``check``)."""
        self.thread.join()
        if check and self.error is not None:
            raise self.error


class SaveHandle:
    """A save in progress (or finished): :meth:`wait` blocks and re-raises its error."""

    def __init__(self, path: str):
        #: Where the checkpoint is committed.
        self.path = path
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._reported = False
        self._thread: threading.Thread | None = None
        #: Seconds the caller was blocked (planning and host copies).
        self.blocking_seconds = 0.0
        #: Seconds from the call to the commit (set when done).
        self.total_seconds: float | None = None

    def done(self) -> bool:
        """Whether the save has finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the save is committed; re-raise its error.

        Raises ``TimeoutError`` when ``timeout`` seconds pass first.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"save to {self.path} still running after {timeout} s")
        if self._error is not None:
            self._reported = True
            raise self._error

    def exception(self) -> BaseException | None:
        """The error the save failed with (``None`` while running or on success)."""
        return self._error

    def _finish(self, error: BaseException | None, started: float) -> None:
        self._error = error
        self.total_seconds = time.perf_counter() - started
        self._done.set()

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "done")
        return f"<SaveHandle {self.path} {state}>"


def wait_for_previous() -> None:
    """Block until this process's previous save finished; raise its error if unreported."""
    if _current() is not None:
        return  # a save nested in another's work: that one is still running, on this thread
    with _lock:
        prev = _last
    if prev is None:
        return
    prev._done.wait()
    if prev._error is not None and not prev._reported:
        prev._reported = True
        raise RuntimeError(f"the previous save to {prev.path} failed") from prev._error


def start(path: str, work: Callable[[], None], *, blocking: bool, started: float) -> SaveHandle:
    """Run ``work`` now (``blocking``) or on a background thread; returns its handle."""
    global _last
    handle = SaveHandle(path)
    handle.blocking_seconds = time.perf_counter() - started
    nested = _current() is not None
    work = _run_inside(handle, work)
    if blocking or nested:  # a nested save runs within the outer one's work, which ends after it
        if not nested:
            with _lock:
                _last = handle
        try:
            work()
        except BaseException as e:
            handle._reported = True
            handle._finish(e, started)
            raise
        handle._finish(None, started)
        handle.blocking_seconds = handle.total_seconds or 0.0
        return handle

    with _lock:
        _last = handle
    bg = Background(work, name=f"ocdbt-save:{path}", daemon=False, then=lambda e: handle._finish(e, started))
    handle._thread = bg.thread
    return handle
