"""Values read ahead of their use, shared by the object-store backends (the fsspec route's
:class:`~ocdbt_py.kvstore.object_store.ObjectStore` and :class:`~ocdbt_py.kvstore.obstore_store.ObstoreStore`).

A caller that knows which small values it is about to read one after another (the metadata
files of a checkpoint, the root node of its B+tree) fetches them in one round trip with
:meth:`ReadAhead.read_ahead` while it does other work; each result answers one later ``get``
of its key whose range it covers.  A backend supplies only how one read is started
(:meth:`ReadAhead._start_ahead_read`) and how a key is checked (:meth:`ReadAhead._check_ahead_key`).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from typing import Any

from ocdbt_py.errors import OcdbtError
from ocdbt_py.kvstore.base import ByteRange
from ocdbt_py.kvstore.futures import all_done

__all__ = ["ReadAhead"]


class ReadAhead:
    """The read-ahead bookkeeping of a remote store (a mixin; call :meth:`_init_ahead` in
    ``__init__``, :meth:`_take_ahead` first in ``get`` and :meth:`_drop_ahead` on every write
    or delete of a key)."""

    #: a value read ahead answers one later ``get`` made within this many seconds
    ahead_seconds = 30.0

    def _init_ahead(self) -> None:
        #: key -> (future of the value, byte range, deadline)
        self._ahead: dict[str, tuple[concurrent.futures.Future[Any], tuple[int, int], float]] = {}
        self._ahead_lock = threading.Lock()

    def _check_ahead_key(self, key: str) -> None:
        """Raise for a key this store refuses (``InvalidKeyError``)."""
        raise NotImplementedError

    def _start_ahead_read(self, key: str, byte_range: tuple[int, int]) -> concurrent.futures.Future[Any]:
        """Start reading ``byte_range`` of ``key``: the future gives the bytes (``None`` for an
        absent object) or raises."""
        raise NotImplementedError

    @property
    def supports_read_ahead(self) -> bool:
        return True

    def read_ahead(self, requests: Sequence[tuple[str, tuple[int, int]]]) -> bool:
        """:meth:`start_read_ahead`, returning ``False`` (nothing started) instead of raising
        for keys or ranges this store refuses: the reads themselves then say what is wrong."""
        if not requests:
            return False
        try:
            self.start_read_ahead(requests)
        except (ValueError, TypeError, OcdbtError):
            return False
        return True

    def start_read_ahead(self, requests: Sequence[tuple[str, tuple[int, int]]]) -> concurrent.futures.Future[None]:
        """Start reading bytes ``[start, stop)`` of each ``(key, (start, stop))``, all
        concurrently, and return at once (the future says when all have arrived); each result
        (an absent object included) answers the next ``get`` of its key whose range it covers,
        once, within :attr:`ahead_seconds`.  A range read from offset 0 that comes back shorter
        than asked holds the whole object, so it also answers reads of any range.  Failures are
        not reported here: the later ``get`` then makes its own request (and reports its own
        error).  Writing or deleting a key drops what was read ahead for it.  ``ValueError``
        for ranges other than ``0 <= start < stop``."""
        reqs = [(k, (int(lo), int(hi))) for k, (lo, hi) in requests]
        for k, (lo, hi) in reqs:
            self._check_ahead_key(k)
            if lo < 0 or hi <= lo:
                raise ValueError("read_ahead needs ranges 0 <= start < stop")
        now = time.monotonic()
        futs = []
        with self._ahead_lock:
            for k in [k for k, e in self._ahead.items() if e[2] < now]:
                del self._ahead[k]
            for k, r in reqs:
                fut = self._start_ahead_read(k, r)
                futs.append(fut)
                self._ahead[k] = (fut, r, now + self.ahead_seconds)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        all_done(futs).add_done_callback(lambda _f: done.set_result(None))
        return done

    def _take_ahead(self, key: str, byte_range: ByteRange | None) -> tuple[bool, bytes | None]:
        """``(True, value)`` when a read ahead answers this read (and is used up by it)."""
        if not self._ahead:
            return False, None
        with self._ahead_lock:
            entry = self._ahead.pop(key, None)
        if entry is None:
            return False, None
        fut, (lo, hi), deadline = entry
        try:
            got = fut.result()
        except Exception:  # noqa: BLE001 - the read itself reports its own error
            return False, None
        if time.monotonic() > deadline:
            return False, None
        if got is None:
            return True, None
        if lo == 0 and len(got) < hi:  # the whole object came back
            if byte_range is None:
                return True, got
            start, stop = byte_range
            return True, (got[start:] if stop is None else got[start:stop])
        if byte_range is None or byte_range[1] is None or byte_range[0] < lo or byte_range[1] > hi:
            return False, None
        return True, got[byte_range[0] - lo: byte_range[1] - lo]

    def _drop_ahead(self, key: str) -> None:
        if self._ahead:
            with self._ahead_lock:
                self._ahead.pop(key, None)
