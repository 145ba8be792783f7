"""This process's peak resident memory over a stretch of a test (Linux ``VmHWM``).

``ru_maxrss`` only ever grows, so once a long test run has peaked high a later test's growth
hides below it (and a child inherits its forked parent's peak across ``exec``). Resetting the
high-water mark (``/proc/self/clear_refs``) makes each measurement start from the current size.
"""

from __future__ import annotations

import resource

__all__ = ["start", "grown_kib", "peak_kib"]


def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def start() -> int:
    """Reset the high-water mark where the kernel allows it; the baseline (KiB) to pass to :func:`grown_kib`."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return _status("VmRSS") or 0


def peak_kib() -> int:
    """The peak since :func:`start` (``ru_maxrss`` where ``VmHWM`` is unavailable)."""
    hwm = _status("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def grown_kib(baseline: int) -> int:
    """How far the peak rose above ``baseline`` since :func:`start`."""
    return peak_kib() - baseline
