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

Retention runs after each commit over the committed steps and never drops the newest one.
Orbax's manager decides differently, and a tier can do it its way: ``decide_at_start`` asks
the policy when a save starts, over the committed steps plus the new one (timed at its start,
with the metrics it was given), stops tracking the dropped steps at once and deletes them
after the commit; ``keep_newest=False`` lets the policy drop the newest step too.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ocdbt_py.checkpoint.manager import save_policy as sp
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.manager.preservation import PreservationPolicy, StepInfo
from ocdbt_py.checkpoint.manager.steps import delete_step, read_step_info, scan
from ocdbt_py.checkpoint.saving.async_save import Background
from ocdbt_py.errors import OcdbtError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.pools import lower_thread_priority

__all__ = ["Tier"]


class Tier:
    """Steps of one root (``kv``; ``None``: steps tracked for a tier other processes write)."""

    def __init__(self, label: str, kv: KvStore | None, fmt: StepNameFormat,
                 preservation: PreservationPolicy | None, *, deletes: bool,
                 on_forget: Callable[[int], None] | None = None,
                 shared_infos: Callable[[], dict[int, StepInfo]] | None = None,
                 decide_at_start: bool = False, keep_newest: bool = True, keep_deleted_in: str | None = None):
        self.label = label
        self.keep_deleted_in = keep_deleted_in
        self.decide_at_start = decide_at_start
        self.keep_newest = keep_newest
        self.kv = kv
        self.fmt = fmt
        self.preservation = preservation
        self.deletes = deletes and kv is not None
        self._lock = threading.RLock()
        self._names: dict[int, str] = {}
        self._infos: dict[int, StepInfo] = {}
        self._in_flight: set[int] = set()
        self._saves: list[sp.SavedStep] = []
        self._finisher: Background | None = None
        self._handle: Any = None
        self._errors: list[BaseException] = []
        self._on_forget = on_forget
        self._shared_infos = shared_infos
        self._recorded: threading.Event | None = None  # set once the newest save's outcome is recorded
        self._leaving: dict[int, list[str]] = {}  # decide_at_start: step -> directories dropped when it started
        self._doomed: set[int] = set()  # decide_at_start: steps being saved that the policy already dropped
        self._given_metrics: dict[int, Any] = {}  # metrics given to start() for steps that do not store them

    # ---- queries --------------------------------------------------------------------------

    def scan(self) -> None:
        """Re-read the committed steps from storage."""
        if self.kv is None:
            return
        names, infos = scan(self.kv, self.fmt)
        with self._lock:
            self._names, self._infos = names, infos
            flying = [s for s in self._saves if s.step in self._in_flight]
            self._saves = [sp.SavedStep(i.step, i.time, i.time) for _, i in sorted(infos.items())] + flying

    def set_known(self, steps: set[int]) -> None:
        """Replace the tracked steps (a tier without a store: what another process listed)."""
        with self._lock:
            self._names = {s: self.fmt.name(s) for s in sorted(steps)}
            self._infos = {s: self._infos.get(s, StepInfo(s, time.time())) for s in self._names}

    def steps(self) -> list[int]:
        """Committed (or, without a store, known) steps, oldest first."""
        with self._lock:
            return sorted(self._names)

    def tracked(self) -> list[int]:
        """Committed steps and steps being saved, oldest first."""
        with self._lock:
            return sorted({*self._names, *self._in_flight} - self._doomed)

    def tracked_infos(self) -> list[StepInfo]:
        """:meth:`infos`, and the steps being saved (timed at their start, with the metrics
        they were given), oldest first."""
        with self._lock:
            out = dict(self._infos)
            for s in self._saves:
                if s.step in self._in_flight and s.step not in self._doomed:
                    out[s.step] = StepInfo(s.step, s.start_time, self._given_metrics.get(s.step))
            return [out[s] for s in sorted(out)]

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
              started: float | None = None, nice: int = 0, metrics: Any = None) -> None:
        """Track a started save of ``step``: when ``handle`` finishes, run ``after_commit``,
        record the step and apply retention (in the order saves were started).  ``started``:
        when the save began (default: now); ``nice``: run that (and the deletions of local
        steps) at that much lower priority than the caller (a training loop's next copy);
        ``metrics``: the step's metrics when they are not stored with it."""
        name = self.fmt.name(step)
        if started is None:
            started = time.time()
        with self._lock:
            self._in_flight.add(step)
            self._saves.append(sp.SavedStep(step, started, None))
            if metrics is not None:
                self._given_metrics[step] = metrics
        if self.decide_at_start:
            self._decide_now(step, started)
        self._handle = handle
        previous = self._finisher
        recorded = threading.Event()
        self._recorded = recorded
        # on the one kind of thread saving runs work on; an error escaping _finish is kept
        # for wait() / check_for_errors() like a failed save's
        self._finisher = Background(
            functools.partial(self._finish, step, name, started, handle, after_commit, previous, recorded, nice),
            name=f"ocdbt-{self.label}:{name}", daemon=False, then=self._keep_error)

    def record(self, step: int) -> None:
        """Track a step saved by other processes (a tier without a store)."""
        now = time.time()
        with self._lock:
            self._names[step] = self.fmt.name(step)
            self._infos[step] = StepInfo(step, now)
            self._saves = [*self._saves, sp.SavedStep(step, now, now)]
        self._retain()

    def _finish(self, step: int, name: str, started: float, handle: Any, after: Callable[[], None] | None,
                previous: Background | None, recorded: threading.Event, nice: int = 0) -> None:
        # local stores only: deletes elsewhere run on shared pools whose threads would inherit it
        if nice > 0 and self.kv is not None and self.kv.local_path() is not None:
            lower_thread_priority(nice)
        try:
            if previous is not None:
                previous.join(check=False)  # saves are recorded, and retention runs, in start order
            ok = self._record_outcome(step, name, started, handle, after)
        finally:
            recorded.set()
        if not ok:
            return
        try:
            if self.decide_at_start:
                self._delete_left(step)
            else:
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
                self._given_metrics.pop(step, None)
                self._leaving.pop(step, None)  # not deleted: a reload finds them again
                self._doomed.discard(step)
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
            given = self._given_metrics.pop(step, None)
        if info.metrics is None and given is not None:
            info = StepInfo(info.step, info.time, given)
        if self.decide_at_start:
            info = StepInfo(info.step, started, info.metrics)  # tracked by when its save began
        with self._lock:
            self._in_flight.discard(step)
            if step in self._doomed:
                self._doomed.discard(step)
                self._saves = [s for s in self._saves if s.step != step]
                return True
            self._names[step] = name
            self._infos[step] = info
            self._saves = [s if s.step != step else sp.SavedStep(step, started, info.time) for s in self._saves]
        return True

    def _decide_now(self, step: int, started: float) -> None:
        """``decide_at_start``: ask the policy over the committed steps plus ``step``; stop
        tracking the dropped ones (deleted once ``step`` commits)."""
        if self.preservation is None:
            return
        with self._lock:
            infos = [self._infos[s] for s in sorted(self._infos)]
            infos.append(StepInfo(step, started, self._given_metrics.get(step)))
            keep = set(self.preservation.keep(infos))
            if self.keep_newest:
                keep.add(step)
            others_flying = self._in_flight - {step}
            dropped = [i.step for i in infos if i.step not in keep and i.step not in others_flying]
            names = [n for s in dropped if (n := self._names.pop(s, None)) is not None]
            if step in dropped:  # Orbax drops a new step that is not among the best once it commits
                self._doomed.add(step)
                names.append(self.fmt.name(step))
            for s in dropped:
                self._infos.pop(s, None)
            self._saves = [s for s in self._saves if s.step not in dropped]
            self._leaving[step] = names
        if self._on_forget is not None:
            for s in dropped:
                self._on_forget(s)

    def _delete_left(self, step: int) -> None:
        with self._lock:
            names = self._leaving.pop(step, [])
        if self.deletes and self.kv is not None:
            for name in names:
                delete_step(self.kv, name, keep_in=self.keep_deleted_in)

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
        if self.keep_newest:
            keep.add(infos[-1].step)  # never the newest committed step
        for s in [i.step for i in infos if i.step not in keep and i.step not in busy]:
            if s in own:
                self.forget(s)
            elif self._on_forget is not None:
                self._on_forget(s)

    def forget(self, step: int) -> None:
        """Drop ``step`` (and delete its directory when this tier deletes).  It stops being
        listed before its deletion starts; a step that cannot be deleted is listed again."""
        with self._lock:
            name = self._names.pop(step, None)
            info = self._infos.pop(step, None)
            saves = self._saves
            self._saves = [s for s in saves if s.step != step]
        if name is not None and self.deletes and self.kv is not None:
            try:
                delete_step(self.kv, name, keep_in=self.keep_deleted_in)
            except BaseException:
                with self._lock:
                    self._names[step] = name
                    if info is not None:
                        self._infos[step] = info
                    self._saves = sorted({*self._saves, *(s for s in saves if s.step == step)},
                                         key=lambda s: s.step)
                raise
        if self._on_forget is not None:
            self._on_forget(step)

    # ---- lifecycle ------------------------------------------------------------------------

    def wait(self) -> None:
        """Block until every save of this tier is recorded; raise the first error."""
        t = self._finisher
        if t is not None:
            t.join(check=False)  # its error, if any, is among check_for_errors()'s
        self.check_for_errors()

    def _keep_error(self, error: BaseException | None) -> None:
        if error is not None:
            with self._lock:
                self._errors.append(error)

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save or deletion (once)."""
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            for extra in errors[1:]:
                warnings.warn(f"another background {self.label} checkpoint error: {extra!r}", stacklevel=2)
            raise errors[0]
