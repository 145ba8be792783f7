"""Sharing small JSON documents between the processes of a JAX job, with timeouts.

The multi-tier manager's decisions (which tier saves a step, which source a restore reads)
must agree across processes, so each process publishes what it knows (its local steps, ...)
in the key-value store of ``jax.distributed``'s coordination service and reads everyone
else's.  Every wait is bounded: a process that never publishes raises
:class:`CoordinationTimeoutError` after ``timeout_s`` instead of hanging.

Round names must be unique per exchange and taken in the same order by every process (the
manager numbers them).  Without ``jax.distributed`` (one process) an exchange returns the
process's own document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ocdbt_py.errors import OcdbtError

__all__ = ["CoordinationTimeoutError", "Exchange"]

_MAX_DOC = 8 << 20


class CoordinationTimeoutError(OcdbtError, TimeoutError):
    """Another process did not take part in a coordinated decision in time (or the
    coordination service failed)."""


class Exchange:
    """All-gathers JSON documents through the coordination service's key-value store.

    ``prefix`` names this user of the store (unique per manager); ``client`` is
    ``jax.distributed``'s client (``None``: a single process).
    """

    def __init__(self, prefix: str, process_index: int, process_count: int, client: Any, timeout_s: float):
        if process_count > 1 and client is None:
            raise OcdbtError("a multi-process job needs jax.distributed's coordination service "
                             "(call jax.distributed.initialize first)")
        self.prefix = prefix
        self.process_index = process_index
        self.process_count = process_count
        self.timeout_s = float(timeout_s)
        self._client = client

    def publish(self, name: str, doc: Any) -> None:
        """Publish this process's document of round ``name``."""
        if self._client is None:
            return
        data = json.dumps(doc)
        if len(data) > _MAX_DOC:
            raise OcdbtError(f"coordination document {name!r} is too large ({len(data)} bytes)")
        try:
            self._client.key_value_set(f"{self.prefix}/{name}/{self.process_index}", data)
        except Exception as e:  # noqa: BLE001 - the client raises its own runtime errors
            raise CoordinationTimeoutError(f"cannot publish {name!r} to the coordination service: {e}") from e

    def fetch(self, name: str, process_index: int, doc_if_self: Any = None) -> Any:
        """Process ``process_index``'s document of round ``name`` (waits up to the timeout)."""
        if process_index == self.process_index or self._client is None:
            return doc_if_self
        key = f"{self.prefix}/{name}/{process_index}"
        try:
            data = self._client.blocking_key_value_get(key, int(self.timeout_s * 1000))
        except Exception as e:  # noqa: BLE001 - DEADLINE_EXCEEDED and friends
            raise CoordinationTimeoutError(
                f"process {process_index} did not publish {name!r} within {self.timeout_s:g} s "
                f"(does every process call the same manager methods in the same order?): {e}") from e
        try:
            return json.loads(data)
        except (TypeError, ValueError) as e:
            raise OcdbtError(f"process {process_index} published an unreadable {name!r}: {e}") from e

    def allgather(self, name: str, doc: Any, processes: Sequence[int] | None = None) -> list[Any]:
        """Publish ``doc`` and return every process's document (``processes``: only those,
        in that order; this process must be among them)."""
        procs = list(range(self.process_count)) if processes is None else list(processes)
        self.publish(name, doc)
        return [self.fetch(name, p, doc) for p in procs]

    def from_process(self, name: str, root: int, doc: Any = None) -> Any:
        """Process ``root``'s document of round ``name`` (``doc`` is published when this
        process is ``root``)."""
        if self.process_index == root:
            self.publish(name, doc)
            return doc
        return self.fetch(name, root)
