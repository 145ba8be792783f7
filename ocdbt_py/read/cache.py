"""A thread-safe LRU cache bounded by total weight (bytes)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

V = TypeVar("V")


class LruCache(Generic[V]):
    """Keeps the most recently used entries while their total weight is at most ``capacity``.

    Weights are the caller's estimate of each entry's memory, so ``capacity`` bounds what
    the cache keeps alive.  An entry heavier than the whole capacity is not kept (it would
    have to evict everything else and still exceed the bound); a capacity of 0 caches nothing.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._data: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """Return the cached value or ``None``."""
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            self._data.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: V, weight: int) -> None:
        """Insert ``value`` as the most recently used entry, evicting the least recently used
        ones beyond the capacity; entries heavier than the whole capacity are not kept."""
        if weight > self.capacity:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._data[key] = (value, weight)
            self._weight += weight
            while self._weight > self.capacity:
                _, (_, w) = self._data.popitem(last=False)
                self._weight -= w

    @property
    def weight(self) -> int:
        """Total weight of the entries held now (at most ``capacity``)."""
        return self._weight

    def __len__(self) -> int:
        return len(self._data)

    def entries(self) -> list[tuple[Hashable, V, int]]:
        """A snapshot of ``(key, value, weight)``, least recently used first."""
        with self._lock:
            return [(k, v, w) for k, (v, w) in self._data.items()]

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()
            self._weight = 0
