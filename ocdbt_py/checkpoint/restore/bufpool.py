"""Reused read buffers: pieces cut from a few slabs, so that the bytes of a whole restore
land in the same few already-touched pages.

Fresh memory costs more than the copy into it: on the development VM first-touch page faults
made receiving into new buffers 2-4x the CPU of receiving into reused ones, and a pool that
reused only buffers of about the size asked for allocated 199 MiB of fresh buffers for a
231 MiB restore (now: 64 MiB).
"""

from __future__ import annotations

import threading

import numpy as np

from ocdbt_py.checkpoint.restore.pages import small_pages

__all__ = ["SlabPool"]


class _Slab:
    """One reusable buffer, handed out front to back; it starts over from the front once
    every piece handed out has come back."""

    __slots__ = ("arr", "top", "live")

    def __init__(self, n: int):
        with small_pages():
            self.arr = np.empty(n, dtype=np.uint8)
        self.top = 0
        self.live = 0


class SlabPool:
    """Buffers of exactly the size asked for, cut from slabs of ``slab`` bytes.

    At most ``limit`` bytes of slabs plus one more slab exist (pieces are cut front to back and
    a slab is reused once all its pieces are back, so one extra slab absorbs the
    fragmentation of out-of-order returns); a request larger than a slab, or one that finds no
    room, gets a buffer of its own (dropped when given back).  Slab pages are first touched by
    whatever fills them (socket or file reads on I/O threads, without the GIL).
    """

    def __init__(self, limit: int, slab: int):
        self.limit = limit
        self.slab = max(1, min(slab, limit))
        self.max_slabs = -(-limit // self.slab) + 1
        self.slabs: list[_Slab] = []
        self._owner: dict[int, _Slab] = {}
        self.lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        """A ``uint8`` buffer of exactly ``n`` bytes, the caller's until :meth:`give`."""
        if n <= self.slab:
            with self.lock:
                slab = next((sl for sl in self.slabs if sl.top + n <= sl.arr.nbytes), None)
                if slab is None and len(self.slabs) < self.max_slabs:
                    slab = _Slab(self.slab)
                    self.slabs.append(slab)
                if slab is not None:
                    piece = slab.arr[slab.top: slab.top + n]
                    slab.top += n
                    slab.live += 1
                    self._owner[id(piece)] = slab
                    return piece
        with small_pages():
            return np.empty(n, dtype=np.uint8)

    def give(self, b: np.ndarray) -> None:
        """Return a buffer from :meth:`take` (its bytes may be overwritten from now on)."""
        with self.lock:
            slab = self._owner.pop(id(b), None)
            if slab is not None:
                slab.live -= 1
                if slab.live == 0:
                    slab.top = 0

    @property
    def nbytes(self) -> int:
        """Bytes of slabs allocated."""
        return sum(sl.arr.nbytes for sl in self.slabs)
