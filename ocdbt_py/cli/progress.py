"""A dependency-free progress line on stderr for long walks.

It draws only when enabled (by default: when stderr is a terminal), waits ``delay`` seconds
before drawing anything so quick commands stay quiet, redraws at most ten times a second, and
erases itself when closed.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "want_progress", "progress_enabled"]


def want_progress(setting: bool | None, stream: TextIO | None = None) -> bool:
    """``setting`` if given (``--progress`` / ``--no-progress``), else whether ``stream`` is a TTY."""
    if setting is not None:
        return setting
    s = sys.stderr if stream is None else stream
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


def progress_enabled(args: object, stream: TextIO | None = None) -> bool:
    """Whether a command parsed into ``args`` shows progress: never with ``--quiet``, else
    ``--progress``/``--no-progress`` if the command has them, else when stderr is a TTY."""
    if getattr(args, "quiet", False):
        return False
    return want_progress(getattr(args, "progress", None), stream)


class Progress:
    """``update(done, total, detail)`` redraws ``label [#####.....] 42% detail``."""

    def __init__(
        self, label: str, *, enabled: bool, stream: TextIO | None = None, delay: float = 0.5,
        width: int = 30,
    ):
        self.label = label
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self.delay = delay
        self.width = width
        self._start = time.monotonic()
        self._last = 0.0
        self._drawn = 0

    def update(self, done: int, total: int | None = None, detail: str = "") -> None:
        """Report progress (cheap when called often: drawing is rate-limited)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._start < self.delay or now - self._last < 0.1:
            return
        self._last = now
        if total:
            frac = min(max(done / total, 0.0), 1.0)
            fill = int(frac * self.width)
            bar = f"[{'#' * fill}{'.' * (self.width - fill)}] {frac * 100:3.0f}% "
        else:
            bar = f"{done} "
        self._draw(f"{self.label} {bar}{detail}".rstrip())

    def _draw(self, line: str) -> None:
        pad = max(self._drawn - len(line), 0)
        try:
            self.stream.write("\r" + line + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False
            return
        self._drawn = len(line)

    def close(self) -> None:
        """Erase the line (if one was drawn)."""
        if self._drawn:
            try:
                self.stream.write("\r" + " " * self._drawn + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._drawn = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
