"""A fault-injecting :class:`KvStore` wrapper for crash-safety testing.

:class:`FaultyStore` forwards every call to a wrapped store and numbers the I/O steps it
sees.  At a chosen step it raises :class:`InjectedFault` (a
:class:`~ocdbt_py.errors.StorageError`), kills the process with ``os._exit`` (a crash: no
cleanup, no ``finally`` blocks), or first writes a torn prefix of the value and then kills
the process (a crash in the middle of a non-atomic write)::

    probe = FaultyStore(LocalStore(path))            # count the steps of one commit
    ocdbt_py.open(probe, mode="a").put(b"k", b"v")
    for step in range(len(probe.log)):
        store = FaultyStore(LocalStore(path), fail_at=step, action="raise")
        ...

Only steps whose operation is in ``ops`` count (all I/O by default).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ocdbt_py.errors import StorageError
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, normalize_request
from ocdbt_py.kvstore.wrapper import WrapperStore

__all__ = ["FaultyStore", "InjectedFault", "ALL_OPS", "WRITE_OPS"]

#: Every operation :class:`FaultyStore` can fail.
ALL_OPS = frozenset({"get", "list", "set", "delete", "get_with_generation", "set_if"})
#: Operations that change the store.
WRITE_OPS = frozenset({"set", "delete", "set_if"})
#: Exit status of a process killed by an injected fault.
KILL_STATUS = 77


class InjectedFault(StorageError):
    """The error a :class:`FaultyStore` raises at its chosen step."""


#: members that would read or write around the injected faults: KvStore's defaults (built on
#: the counted primitives) instead of the wrapped store's
_AROUND = frozenset({
    "exists", "size", "list_sized", "list_dir", "delete_prefix", "local_path", "no_follow_root",
    "fsspec_location", "syncs_later", "note_written", "supports_read_into", "read_into",
    "supports_read_parts", "read_parts", "supports_read_ahead", "read_ahead", "lists_sizes",
})


class FaultyStore(WrapperStore):
    """Wraps ``base``; fails at I/O step ``fail_at`` (0-based) with ``action``.

    ``action``: ``"raise"`` (raise :class:`InjectedFault` instead of doing the step),
    ``"kill"`` (``os._exit(KILL_STATUS)`` instead of doing the step), or ``"torn"`` (for a
    plain ``set``: store only the first half of the value, then exit; other steps behave as
    ``"kill"``, since conditional writes are atomic by contract).
    ``log`` records ``(operation, key)`` for every counted step,
    including the failing one.  With ``fail_at=None`` nothing fails (use it to count steps).
    Every other capability of ``base`` is forwarded, except those that would go around the
    counted steps (:data:`_AROUND`).
    """

    withheld = _AROUND

    def __init__(
        self,
        base: KvStore,
        *,
        fail_at: int | None = None,
        action: str = "raise",
        ops: Sequence[str] | frozenset[str] = ALL_OPS,
    ):
        if action not in ("raise", "kill", "torn"):
            raise ValueError(f"unknown action {action!r}")
        unknown = set(ops) - ALL_OPS
        if unknown:
            raise ValueError(f"unknown operation(s) {sorted(unknown)}")
        super().__init__(base)
        self.fail_at = fail_at
        self.action = action
        self.ops = frozenset(ops)
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _step(self, op: str, key: str, value: Any = None) -> None:
        if op not in self.ops:
            return
        with self._lock:
            n = len(self.log)
            self.log.append((op, key))
        if self.fail_at is None or n != self.fail_at:
            return
        if self.action == "raise":
            raise InjectedFault(f"injected fault at step {n}: {op} {key!r}")
        if self.action == "torn" and op == "set" and value is not None:
            data = bytes(memoryview(value).cast("B")) if not isinstance(value, list) else b"".join(value)
            self.base.set(key, data[: len(data) // 2])
        os._exit(KILL_STATUS)

    # -- reading -----------------------------------------------------------------------------
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        self._step("get", key)
        return self.base.get(key, byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        return [self.get(k, r) for k, r in (normalize_request(q) for q in requests)]

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        self._step("list", prefix)
        return iter(list(self.base.list(prefix, start=start, stop=stop)))

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        self._step("get_with_generation", key)
        return self.base.get_with_generation(key)

    # -- writing -----------------------------------------------------------------------------
    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        self._step("set", key, value)
        self.base.set(key, value)

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self._step("set", key, list(parts))
        self.base.set_parts(key, parts)

    def delete(self, key: str) -> None:
        self._step("delete", key)
        self.base.delete(key)

    def set_if(self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None) -> str:
        self._step("set_if", key, value)
        return self.base.set_if(key, value, if_generation=if_generation)
