"""The commit that ``test_crash`` injects faults into, and the fresh process that runs it.

A scenario that kills the process (``kill``, ``torn``) cannot run in the pytest process,
and must not run in a forked copy of it either: by the time the full suite gets there, JAX,
zstd, fsspec and HTTP pools have started threads, and a copy of a multi-threaded process can
inherit a lock some other thread held and deadlock.  ``test_crash`` instead starts this module
in a fresh interpreter as a *scenario server* (the ``forkserver`` pattern)::

    python -m tests.ocdbt_write._crash_child serve   # stdin: one JSON scenario per line

The server imports only ``ocdbt_py`` (``import jax`` is blocked), starts no thread, and checks
before every scenario that it is still single-threaded (Python threads and, on Linux, native
ones).  For each scenario line ``{"path": ..., "kind": ..., "step": ..., "action": ...}`` it
forks a copy of itself (safe: the copy has the one thread there is), which commits through a
:class:`~ocdbt_py.testing.faults.FaultyStore` failing at ``step`` with ``action``, and writes
``RESULT <exit status>`` to stdout.  The exit status is :data:`~ocdbt_py.testing.faults.KILL_STATUS`
when the fault killed the copy, :data:`NOT_KILLED` when the commit finished, :data:`FAILED`
(traceback on stderr) when it raised.  Exiting with a non-zero status of its own (message on
stderr) means the server found itself multi-threaded or with a blocked module imported.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import ocdbt_py
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.testing.faults import FaultyStore

Model = dict[bytes, bytes]

#: What one commit writes (and it deletes ``old/0``).
NEW: Model = {b"new/%d" % i: b"v%d" % i * (i * 40) for i in range(6)}
#: Exit status of a scenario whose commit finished although it should have been killed.
NOT_KILLED = 0
#: Exit status of a scenario whose commit raised instead of being killed.
FAILED = 3
#: Exit status of a server that is not in a state it may fork from.
UNSAFE = 4
#: Modules the server refuses to import (the commit must not need them).
BLOCKED_MODULES = ("jax",)
#: Modules a commit imports lazily; the server imports them once, so scenarios start fast.
PRELOAD = (
    "ocdbt_py.store",
    "ocdbt_py.write.commit",
    "ocdbt_py.write.transaction",
    "ocdbt_py.format.zstd_frame",
    "crc32c",
    "zstandard",
)
#: Whether the scenario server can run here (it needs ``os.fork``).
SERVER_SUPPORTED = hasattr(os, "fork")
#: Prefix of the lines the server writes to stdout.
RESULT_PREFIX = "RESULT "


def config(kind: str) -> dict[str, Any]:
    """The database configuration for manifest kind ``kind`` ("single" or "numbered")."""
    return {"manifest_kind": kind, "version_tree_arity_log2": 2, "max_inline_value_bytes": 50}


def commit(store: Any, kind: str) -> None:
    """The commit under test: put every key of :data:`NEW`, delete ``old/0``, in one transaction."""
    db = ocdbt_py.open(store, mode="a", config=config(kind))
    with db.transaction() as t:
        for k, v in NEW.items():
            t.put(k, v)
        t.delete(b"old/0")


def scenario_line(path: Path, kind: str, step: int, action: str) -> str:
    """One line of the server's input: the scenario ``(path, kind, step, action)``."""
    return json.dumps({"path": str(path), "kind": kind, "step": step, "action": action}) + "\n"


def run_scenario(scenario: Mapping[str, Any]) -> int:
    """Commit with the fault ``scenario`` describes; the exit status if the fault did not kill."""
    store = FaultyStore(LocalStore(Path(scenario["path"])), fail_at=int(scenario["step"]), action=scenario["action"])
    try:
        commit(store, scenario["kind"])
    except BaseException:
        traceback.print_exc()
        return FAILED
    return NOT_KILLED


def thread_count() -> int:
    """Threads of this process: native ones too where ``/proc`` tells, else Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _unsafe_reason() -> str | None:
    imported = [name for name in BLOCKED_MODULES if sys.modules.get(name) is not None]
    if imported:
        return f"scenario server imported {imported}"
    if threading.active_count() != 1 or thread_count() != 1:
        return f"scenario server is multi-threaded ({thread_count()} threads, {threading.active_count()} Python)"
    return None


def _fork_scenario(scenario: Mapping[str, Any]) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked copy
        code = FAILED
        try:
            code = run_scenario(scenario)
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def serve(lines: IO[str], out: IO[str]) -> int:
    """Run every scenario line of ``lines`` in a forked copy of this process; report to ``out``."""
    reason = _unsafe_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        return UNSAFE
    for name in BLOCKED_MODULES:
        sys.modules[name] = None  # type: ignore[assignment]  # makes ``import jax`` fail
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # only a head start; the scenario imports what it needs
            pass
    for line in lines:
        if not line.strip():
            continue
        reason = _unsafe_reason()
        if reason is not None:
            print(reason, file=sys.stderr)
            return UNSAFE
        out.write(f"{RESULT_PREFIX}{_fork_scenario(json.loads(line))}\n")
        out.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover - runs in the server process
    if sys.argv[1:] != ["serve"]:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'tests.ocdbt_write._crash_child'} serve")
    sys.exit(serve(sys.stdin, sys.stdout))
