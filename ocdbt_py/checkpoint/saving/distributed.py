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
from collections.abc import Sequence
from typing import Any

__all__ = ["Coordinator", "coordinator", "group_coordinator", "PeerFailedError"]

_counter = itertools.count()
_counter_lock = threading.Lock()


class PeerFailedError(RuntimeError):
    """Another process of a multi-process save failed."""


class Coordinator:
    """Who this process is among the writers of one save, and how they wait for each other."""

    def __init__(self, process_index: int = 0, process_count: int = 1, *, timeout_s: float = 600.0,
                 client: Any = None, save_id: int = 0, participants: Sequence[int] | None = None,
                 writer_devices: frozenset[int] | None = None, partial: bool = False,
                 key_prefix: str | None = None):
        self.process_index = process_index
        self.process_count = process_count
        self.timeout_s = timeout_s
        self._client = client
        self._save_id = save_id
        #: The JAX processes taking part in this save (all by default); the first commits.
        self.participants: tuple[int, ...] = (tuple(participants) if participants is not None
                                              else tuple(range(process_count)))
        if process_index not in self.participants:
            raise ValueError(f"process {process_index} is not among the participants {self.participants}")
        #: Device ids whose regions are written (each distinct region once, by the lowest id
        #: holding it); ``None``: the shards with ``replica_id == 0``.
        self.writer_devices = writer_devices
        #: The checkpoint holds only the participants' regions (no completeness check).
        self.partial = partial
        self._key_prefix = key_prefix if key_prefix is not None else f"ocdbt_py_save_{save_id}"

    @property
    def is_primary(self) -> bool:
        """Whether this process writes the shared metadata and commits."""
        return self.process_index == self.participants[0]

    def barrier(self, name: str) -> None:
        """Wait until every process reached the barrier ``name`` of this save."""
        if len(self.participants) <= 1:
            return
        key = f"{self._key_prefix}_{name}"
        if self._client is not None:
            if len(self.participants) < self.process_count:
                self._client.wait_at_barrier(key, int(self.timeout_s * 1000), process_ids=list(self.participants))
            else:
                self._client.wait_at_barrier(key, int(self.timeout_s * 1000))
            return
        if len(self.participants) < self.process_count:  # pragma: no cover - no coordination client
            raise RuntimeError("a save by a subset of the processes needs jax.distributed's coordination service")
        from jax.experimental import multihost_utils  # pragma: no cover - no coordination client

        multihost_utils.sync_global_devices(key)

    def sync(self, name: str, error: BaseException | None) -> None:
        """A barrier that also shares failures: every process arrives (with ``error`` if its
        part of the phase failed), then all raise if any process failed.

        A process's own error is re-raised as is; another process's failure raises
        :class:`PeerFailedError`.  Without a coordination client, only the barrier is done.
        """
        if len(self.participants) <= 1 or self._client is None:
            if error is not None:
                raise error
            self.barrier(name)
            return
        prefix = f"{self._key_prefix}_{name}_status"
        status = "ok" if error is None else f"{type(error).__name__}: {error}"[:2000]
        self._client.key_value_set(f"{prefix}/{self.process_index}", status)
        self.barrier(name)
        failed: list[str] = []
        for i in self.participants:
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
        # optional: JAX is imported only for trees that hold JAX objects
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
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    count = int(jax.process_count())
    if count <= 1:
        return Coordinator(timeout_s=timeout_s, save_id=save_id)
    return Coordinator(int(jax.process_index()), count, timeout_s=timeout_s, client=_jax_client(), save_id=save_id)


def group_coordinator(participants: Sequence[int], *, key_prefix: str, writer_devices: frozenset[int] | None = None,
                      partial: bool = False, timeout_s: float = 600.0) -> Coordinator:
    """The coordinator of a save by some of the JAX processes (``participants``, this one
    included; the first commits), with barrier keys under ``key_prefix`` (unique per save)."""
    if "jax" not in sys.modules:
        return Coordinator(timeout_s=timeout_s, writer_devices=writer_devices, partial=partial, key_prefix=key_prefix)
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    count = int(jax.process_count())
    client = _jax_client() if count > 1 and len(participants) > 1 else None
    return Coordinator(int(jax.process_index()), count, timeout_s=timeout_s, client=client,
                       participants=sorted(participants), writer_devices=writer_devices, partial=partial,
                       key_prefix=key_prefix)
