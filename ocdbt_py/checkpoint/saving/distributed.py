"""Process index, process count and barriers for multi-process saves.

Without JAX (or with a single JAX process) there is one process and barriers are no-ops.
With ``jax.distributed`` initialized, barriers use the distributed runtime's coordination
service (``wait_at_barrier``, as Orbax does), falling back to a device collective.  Barrier
names are unique per save: every process numbers its saves in the same order.
"""

from __future__ import annotations

import itertools
import sys
import threading
from typing import Any

__all__ = ["Coordinator", "coordinator", "PeerFailedError"]

_counter = itertools.count()
_counter_lock = threading.Lock()


class PeerFailedError(RuntimeError):
    """Another process of a multi-process save failed."""


class Coordinator:
    """Who this process is among the writers of one save, and how they wait for each other."""

    def __init__(self, process_index: int = 0, process_count: int = 1, *, timeout_s: float = 600.0,
                 client: Any = None, save_id: int = 0):
        self.process_index = process_index
        self.process_count = process_count
        self.timeout_s = timeout_s
        self._client = client
        self._save_id = save_id

    @property
    def is_primary(self) -> bool:
        """Whether this process writes the shared metadata and commits."""
        return self.process_index == 0

    def barrier(self, name: str) -> None:
        """Wait until every process reached the barrier ``name`` of this save."""
        if self.process_count <= 1:
            return
        key = f"ocdbt_py_save_{self._save_id}_{name}"
        if self._client is not None:
            self._client.wait_at_barrier(key, int(self.timeout_s * 1000))
            return
        from jax.experimental import multihost_utils  # pragma: no cover - no coordination client

        multihost_utils.sync_global_devices(key)

    def sync(self, name: str, error: BaseException | None) -> None:
        """A barrier that also shares failures: every process arrives (with ``error`` if its
        part of the phase failed), then all raise if any process failed.

        A process's own error is re-raised as is; another process's failure raises
        :class:`PeerFailedError`.  Without a coordination client, only the barrier is done.
        """
        if self.process_count <= 1 or self._client is None:
            if error is not None:
                raise error
            self.barrier(name)
            return
        prefix = f"ocdbt_py_save_{self._save_id}_{name}_status"
        status = "ok" if error is None else f"{type(error).__name__}: {error}"[:2000]
        self._client.key_value_set(f"{prefix}/{self.process_index}", status)
        self.barrier(name)
        failed: list[str] = []
        for i in range(self.process_count):
            if i == self.process_index:
                continue
            st = self._client.blocking_key_value_get(f"{prefix}/{i}", int(self.timeout_s * 1000))
            if st != "ok":
                failed.append(f"process {i}: {st}")
        if error is not None:
            raise error
        if failed:
            raise PeerFailedError(f"the save failed in another process ({'; '.join(failed)})")


def _jax_client() -> Any:
    try:
        from jax._src import distributed

        return distributed.global_state.client
    except Exception:  # noqa: BLE001 - private API moved: fall back to collectives
        return None


def coordinator(*, timeout_s: float = 600.0, force_single: bool = False) -> Coordinator:
    """The coordinator of a new save (JAX's processes when JAX is running several)."""
    with _counter_lock:
        save_id = next(_counter)
    if force_single or "jax" not in sys.modules:
        return Coordinator(timeout_s=timeout_s, save_id=save_id)
    import jax

    count = int(jax.process_count())
    if count <= 1:
        return Coordinator(timeout_s=timeout_s, save_id=save_id)
    return Coordinator(int(jax.process_index()), count, timeout_s=timeout_s, client=_jax_client(), save_id=save_id)
