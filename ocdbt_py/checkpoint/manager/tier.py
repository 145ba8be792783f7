"""One storage tier of the multi-tier manager: its committed steps, saves in flight, retention.

A :class:`Tier` is the bookkeeping half of a checkpoint manager for one root: it lists the
committed steps, takes a started save (a :class:`~ocdbt_py.checkpoint.saving.SaveHandle`),
waits for its commit on a background thread (saves are recorded in order), runs an optional
step after the commit, and applies the retention policy.  Only a tier with ``deletes`` removes
step directories; the others (processes that share a persistent tier they do not commit)
just forget the steps.  A tier without a store only tracks steps other processes save.
A tier given ``shared_infos`` applies retention to the union of its own steps and those
(steps other processes hold, identical in every process), so that every process drops the
same steps; ``on_forget`` is then called for the shared steps it drops too.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ocdbt_py.checkpoint.manager import save_policy as sp
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.manager.preservation import PreservationPolicy, StepInfo
from ocdbt_py.checkpoint.manager.steps import delete_step, read_step_info, scan
from ocdbt_py.errors import OcdbtError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.pools import lower_thread_priority

__all__ = ["Tier"]


class Tier:
    """Steps of one root (``kv``; ``None``: steps tracked for a tier other processes write)."""

    def __init__(self, label: str, kv: KvStore | None, fmt: StepNameFormat,
                 preservation: PreservationPolicy | None, *, deletes: bool,
                 on_forget: Callable[[int], None] | None = None,
                 shared_infos: Callable[[], dict[int, StepInfo]] | None = None):
        self.label = label
        self.kv = kv
        self.fmt = fmt
        self.preservation = preservation
        self.deletes = deletes and kv is not None
        self._lock = threading.RLock()
        self._names: dict[int, str] = {}
        self._infos: dict[int, StepInfo] = {}
        self._in_flight: set[int] = set()
        self._saves: list[sp.SavedStep] = []
        self._finisher: threading.Thread | None = None
        self._handle: Any = None
        self._errors: list[BaseException] = []
        self._on_forget = on_forget
        self._shared_infos = shared_infos
        self._recorded: threading.Event | None = None  # set once the newest save's outcome is recorded

    # ---- queries --------------------------------------------------------------------------

    def scan(self) -> None:
        """Re-read the committed steps from storage."""
        if self.kv is None:
            return
        names, infos = scan(self.kv, self.fmt)
        with self._lock:
            self._names, self._infos = names, infos
            if infos and not self._saves:
                last = infos[max(infos)]
                self._saves.append(sp.SavedStep(last.step, last.time, last.time))

    def set_known(self, steps: set[int]) -> None:
        """Replace the tracked steps (a tier without a store: what another process listed)."""
        with self._lock:
            self._names = {s: self.fmt.name(s) for s in sorted(steps)}
            self._infos = {s: self._infos.get(s, StepInfo(s, time.time())) for s in self._names}

    def steps(self) -> list[int]:
        """Committed (or, without a store, known) steps, oldest first."""
        with self._lock:
            return sorted(self._names)

    def name(self, step: int) -> str | None:
        """The directory name of a committed step (``None`` when not committed)."""
        with self._lock:
            return self._names.get(step)

    def info(self, step: int) -> StepInfo | None:
        """Commit time and metrics of a committed step."""
        with self._lock:
            return self._infos.get(step)

    def infos(self) -> list[StepInfo]:
        """Every committed step's :class:`StepInfo`, oldest first."""
        with self._lock:
            return [self._infos[s] for s in sorted(self._infos)]

    def in_flight(self, step: int) -> bool:
        """Whether ``step`` is being saved."""
        with self._lock:
            return step in self._in_flight

    def wait_recorded(self) -> None:
        """Block until the newest started save is committed or failed (not its retention)."""
        ev = self._recorded
        if ev is not None:
            ev.wait()

    def newest(self) -> int:
        """The newest step committed or in flight (``-1`` when none)."""
        with self._lock:
            return max([*self._names, *self._in_flight, -1])

    def busy(self) -> bool:
        """Whether a save has not been recorded yet."""
        with self._lock:
            return bool(self._in_flight)

    def context(self, step: int, reached_preemption: bool) -> sp.SaveContext:
        """What a save policy sees for ``step`` in this tier."""
        with self._lock:
            previous = tuple(self._saves)
            busy = bool(self._in_flight)
        return sp.SaveContext(step, time.time(), previous, busy, reached_preemption)

    # ---- saving ---------------------------------------------------------------------------

    def start(self, step: int, handle: Any, after_commit: Callable[[], None] | None = None, *,
              started: float | None = None, nice: int = 0) -> None:
        """Track a started save of ``step``: when ``handle`` finishes, run ``after_commit``,
        record the step and apply retention (in the order saves were started).  ``started``:
        when the save began (default: now); ``nice``: run that (and the deletions of local
        steps) at that much lower priority than the caller (a training loop's next copy)."""
        name = self.fmt.name(step)
        if started is None:
            started = time.time()
        with self._lock:
            self._in_flight.add(step)
            self._saves.append(sp.SavedStep(step, started, None))
        self._handle = handle
        previous = self._finisher
        recorded = threading.Event()
        self._recorded = recorded
        t = threading.Thread(target=self._finish,
                             args=(step, name, started, handle, after_commit, previous, recorded, nice),
                             name=f"ocdbt-{self.label}:{name}", daemon=False)
        self._finisher = t
        t.start()

    def record(self, step: int) -> None:
        """Track a step saved by other processes (a tier without a store)."""
        now = time.time()
        with self._lock:
            self._names[step] = self.fmt.name(step)
            self._infos[step] = StepInfo(step, now)
            self._saves = [*self._saves, sp.SavedStep(step, now, now)][-64:]
        self._retain()

    def _finish(self, step: int, name: str, started: float, handle: Any, after: Callable[[], None] | None,
                previous: threading.Thread | None, recorded: threading.Event, nice: int = 0) -> None:
        # local stores only: deletes elsewhere run on shared pools whose threads would inherit it
        if nice > 0 and self.kv is not None and self.kv.local_path() is not None:
            lower_thread_priority(nice)
        try:
            if previous is not None:
                previous.join()  # saves are recorded, and retention runs, in start order
            ok = self._record_outcome(step, name, started, handle, after)
        finally:
            recorded.set()
        if not ok:
            return
        try:
            self._retain()
        except BaseException as e:  # noqa: BLE001
            with self._lock:
                self._errors.append(e)

    def _record_outcome(self, step: int, name: str, started: float, handle: Any,
                        after: Callable[[], None] | None) -> bool:
        try:
            handle.wait()
            if after is not None:
                after()
        except BaseException as e:  # noqa: BLE001 - reported by check_for_errors
            with self._lock:
                self._in_flight.discard(step)
                self._saves = [s for s in self._saves if s.step != step]
                self._errors.append(e)
            return False
        info = StepInfo(step, time.time())
        if self.kv is not None:
            try:
                info = read_step_info(self.kv, step, name, fallback_time=info.time)
            except OcdbtError:
                pass
        with self._lock:
            self._in_flight.discard(step)
            self._names[step] = name
            self._infos[step] = info
            self._saves = [s if s.step != step else sp.SavedStep(step, started, info.time) for s in self._saves][-64:]
        return True

    def _retain(self) -> None:
        if self.preservation is None:
            return
        shared = self._shared_infos() if self._shared_infos is not None else {}
        with self._lock:
            own = dict(self._infos)
            busy = set(self._in_flight)
        merged = {**shared, **own}
        if not merged:
            return
        infos = [merged[s] for s in sorted(merged)]
        keep = set(self.preservation.keep(infos))
        keep.add(infos[-1].step)  # never the newest committed step
        for s in [i.step for i in infos if i.step not in keep and i.step not in busy]:
            if s in own:
                self.forget(s)
            elif self._on_forget is not None:
                self._on_forget(s)

    def forget(self, step: int) -> None:
        """Drop ``step`` (and delete its directory when this tier deletes)."""
        with self._lock:
            name = self._names.pop(step, None)
            self._infos.pop(step, None)
        if self._on_forget is not None:
            self._on_forget(step)
        if name is not None and self.deletes and self.kv is not None:
            delete_step(self.kv, name)

    # ---- lifecycle ------------------------------------------------------------------------

    def wait(self) -> None:
        """Block until every save of this tier is recorded; raise the first error."""
        t = self._finisher
        if t is not None:
            t.join()
        self.check_for_errors()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save or deletion (once)."""
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            for extra in errors[1:]:
                warnings.warn(f"another background {self.label} checkpoint error: {extra!r}", stacklevel=2)
            raise errors[0]
