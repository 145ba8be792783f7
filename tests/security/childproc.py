"""Run a snippet in a fresh interpreter (optionally under an address-space limit) and report
what it printed, so a test can measure peak memory without its own process's history."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["run_child", "ROOT"]

_PRELUDE = """
import resource, sys, time
sys.path.insert(0, {root!r})
if {limit}:
    resource.setrlimit(resource.RLIMIT_AS, ({limit} << 20, {limit} << 20))
from tests import peak_rss

def measure(fn):
    '''Run ``fn``; print ``name peak-growth-MiB cpu-seconds outcome`` on one line.  The
    seconds are the process's CPU time (every thread's): the work done, which the machine's
    load does not inflate as it does wall time.'''
    base = peak_rss.start()
    t0 = time.process_time()
    try:
        outcome = "ok " + repr(fn())[:200]
    except Exception as e:
        outcome = type(e).__name__ + " " + str(e)[:300].replace(chr(10), " ")
    print("MEASURE", fn.__name__, peak_rss.grown_kib(base) >> 10, round(time.process_time() - t0, 3), outcome,
          flush=True)
"""


def run_child(code: str, *, limit_mib: int = 0, timeout: float = 120) -> dict[str, tuple[int, float, str]]:
    """Run ``code`` (which calls ``measure(fn)`` for each case) in a child; returns per case
    ``(peak RSS growth in MiB, CPU seconds, outcome)``.  ``outcome`` is ``"ok <repr>"`` or the
    exception's class name and message.  A crash or hang of the child fails the caller."""
    prog = _PRELUDE.format(root=str(ROOT), limit=int(limit_mib)) + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    out: dict[str, tuple[int, float, str]] = {}
    for line in r.stdout.splitlines():
        if line.startswith("MEASURE "):
            _, name, mib, secs, outcome = line.split(" ", 4)
            out[name] = (int(mib), float(secs), outcome)
    return out
