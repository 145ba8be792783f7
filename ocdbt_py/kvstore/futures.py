"""Waiting on several :class:`concurrent.futures.Future` objects as one."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["all_done"]


def all_done(parts: Sequence[concurrent.futures.Future[Any]]) -> concurrent.futures.Future[list[Any]]:
    """A future that finishes once every one of ``parts`` has, without blocking anyone: its
    result is the list of the parts' outcomes in order (each result, or the exception raised;
    a cancelled part gives :class:`concurrent.futures.CancelledError`)."""
    out: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
    if not parts:
        out.set_result([])
        return out
    left = [len(parts)]
    lock = threading.Lock()

    def outcome(p: concurrent.futures.Future[Any]) -> Any:
        if p.cancelled():
            return concurrent.futures.CancelledError()
        return p.exception() or p.result()

    def one_done(_f: concurrent.futures.Future[Any]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            out.set_result([outcome(p) for p in parts])

    for p in parts:
        p.add_done_callback(one_done)
    return out
