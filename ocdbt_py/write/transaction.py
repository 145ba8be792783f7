"""Atomic multi-key transactions on a writable :class:`~ocdbt_py.store.OcdbtStore`.

>>> with db.transaction() as t:                       # doctest: +SKIP
...     t.put(b"a", b"1")
...     t.delete_range(b"tmp/", b"tmp0")
>>> t.generation                                       # doctest: +SKIP
7

Everything collected in a transaction becomes one new generation when it commits (on a
clean exit from the ``with`` block, or :meth:`Transaction.commit`), or nothing at all (on an
exception, or :meth:`Transaction.abort`).  Reads through the transaction see its own writes
and otherwise the latest version when the transaction first read (the manifest is re-read
then); keys it read (and ``if_equal`` conditions) must be unchanged when it commits, otherwise the
commit fails with :class:`~ocdbt_py.errors.ConditionFailedError` instead of silently
re-applying on top of a concurrent change.  Unconditional writes are simply re-applied to
the newest version when another writer commits first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ocdbt_py.errors import ConditionFailedError, OcdbtError
from ocdbt_py.format.btree import MAX_KEY_LENGTH
from ocdbt_py.kvstore.base import ByteRange, KvStore, check_range, slice_range
from ocdbt_py.read.snapshot import Snapshot, key_bounds
from ocdbt_py.write.commit import Condition
from ocdbt_py.write.mutations import ANY, ChunkedValue, MutationSet, as_key, as_value

__all__ = ["Transaction", "TransactionKvStore", "ANY", "Database"]


class Database(Protocol):
    """What a transaction needs of the database it writes (:class:`~ocdbt_py.store.OcdbtStore`)."""

    @property
    def url(self) -> str:
        """Where the database lives."""

    def refresh(self) -> None:
        """Re-read the manifest."""

    def snapshot(self) -> Snapshot:
        """The version the database currently reads."""

    def commit(self, mutations: Any = None) -> int:
        """Commit ``mutations`` as one generation; returns it."""


def _materialize(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, ChunkedValue):
        return b"".join(v.parts)
    return bytes(v)


class Transaction:
    """Collects writes, deletes and range deletes, then commits them as one generation."""

    def __init__(self, store: Database):
        self._store = store
        self._base: Snapshot | None = None  # taken at the first read, from a freshly read manifest
        self._muts = MutationSet()
        self._state = "open"
        #: The generation this transaction committed (set by :meth:`commit`).
        self.generation: int | None = None

    # -- state -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether the transaction was committed or aborted."""
        return self._state != "open"

    def _check_open(self) -> None:
        if self._state != "open":
            raise OcdbtError(f"transaction already {self._state}")

    def __len__(self) -> int:
        return len(self._muts)

    # -- reading -----------------------------------------------------------------------------
    def _snapshot(self) -> Snapshot:
        if self._base is None:
            self._store.refresh()
            self._base = self._store.snapshot()
        return self._base

    def _base_entry(self, key: bytes) -> Any:
        return self._snapshot().lookup(key)

    def get(self, key: Any) -> bytes | None:
        """The value as this transaction sees it; reading a key makes the commit conditional
        on that key being unchanged."""
        self._check_open()
        k = as_key(key)
        muts = self._muts
        if k in muts.writes:
            return _materialize(muts.writes[k])
        if muts.in_deleted_range(k):
            return None
        raw = self._base_entry(k)
        if k not in muts.conditions:
            muts.conditions[k] = Condition("entry", raw)
        if raw is None or isinstance(raw, bytes):
            return raw
        return self._snapshot().read(raw)

    def __getitem__(self, key: Any) -> bytes:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def _check_expected(self, k: bytes, expected: Any) -> None:
        """Check ``if_equal`` now if this transaction already decided the key, else record it."""
        if expected is ANY:
            return
        if expected is not None and not isinstance(expected, (bytes, bytearray, memoryview)):
            raise TypeError("if_equal must be bytes or None")
        want = None if expected is None else bytes(expected)
        muts = self._muts
        if k in muts.writes or muts.in_deleted_range(k) or k in muts.conditions:
            have = self.get(k)
            if have != want:
                raise ConditionFailedError(f"condition on key {k!r} failed within the transaction")
            return
        muts.conditions[k] = Condition("value", want)

    def list(self, prefix: Any = b"", start: Any = None, stop: Any = None) -> Iterator[bytes]:
        """Keys as this transaction sees them, in order (listing adds no commit condition)."""
        self._check_open()
        snap = self._snapshot()
        lo, hi = key_bounds(prefix, start, stop)
        muts = self._muts
        pending = [k for k in muts.sorted_keys() if k >= lo and (hi is None or k < hi)]
        w = muts.writes
        base = snap.keys(lo, hi)
        i = 0
        for k in base:
            while i < len(pending) and pending[i] < k:
                if w[pending[i]] is not None:
                    yield pending[i]
                i += 1
            if i < len(pending) and pending[i] == k:
                continue  # decided by the pending write
            if not muts.in_deleted_range(k):
                yield k
        for p in pending[i:]:
            if w[p] is not None:
                yield p

    def as_kvstore(self) -> KvStore:
        """This transaction as a :class:`KvStore` with ``str`` keys (e.g. to write a Zarr array
        into the database as one commit)."""
        return TransactionKvStore(self)

    # -- writing -----------------------------------------------------------------------------
    def put(self, key: Any, value: Any, *, if_equal: Any = ANY) -> None:
        """Set ``key`` to ``value`` (bytes-like or a binary file object).

        ``if_equal``: the commit fails unless the key's value is then exactly these bytes
        (``None``: unless the key is absent).
        """
        if self._state != "open":
            self._check_open()
        k = key if type(key) is bytes and len(key) <= MAX_KEY_LENGTH else as_key(key)
        v = value if type(value) is bytes else as_value(value)
        if if_equal is not ANY:
            self._check_expected(k, if_equal)
        muts = self._muts
        if muts._lo:  # pending range deletes: keep the normal form
            muts.set(k, v)
        else:
            muts.writes[k] = v

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def delete(self, key: Any, *, if_equal: Any = ANY) -> None:
        """Delete ``key`` (deleting an absent key is not an error)."""
        self._check_open()
        k = as_key(key)
        self._check_expected(k, if_equal)
        self._muts.set(k, None)

    def __delitem__(self, key: Any) -> None:
        self.delete(key)

    def delete_range(self, start: Any = b"", stop: Any = None) -> None:
        """Delete every key in ``[start, stop)`` (``stop=None``: to the end)."""
        self._check_open()
        lo = as_key(start)
        hi = None if stop is None else as_key(stop)
        self._muts.delete_range(lo, hi)

    # -- finishing ---------------------------------------------------------------------------
    def commit(self) -> int:
        """Commit atomically; returns the generation (unchanged if nothing changed)."""
        self._check_open()
        self._state = "committing"
        try:
            gen = self._store.commit(self._muts)
        except BaseException:
            self._state = "failed"
            raise
        self._state = "committed"
        self.generation = gen
        self._muts = MutationSet()
        return gen

    def abort(self) -> None:
        """Discard everything collected."""
        if self._state == "open":
            self._state = "aborted"
            self._muts = MutationSet()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.commit()

    def __repr__(self) -> str:
        return f"<Transaction {self._state} {len(self._muts)} mutation(s) on {self._store.url}>"


class TransactionKvStore(KvStore):
    """:class:`KvStore` view of an open :class:`Transaction` (UTF-8 ``str`` keys)."""

    def __init__(self, txn: Transaction):
        self.txn = txn

    @property
    def url(self) -> str:
        return f"{self.txn._store.url}|ocdbt:transaction"

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        check_range(byte_range)
        v = self.txn.get(key.encode("utf-8", "surrogateescape"))
        return None if v is None else slice_range(v, byte_range)

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        enc = lambda s: None if s is None else s.encode("utf-8", "surrogateescape")  # noqa: E731
        for k in self.txn.list(prefix.encode("utf-8", "surrogateescape"), enc(start), enc(stop)):
            yield k.decode("utf-8", "surrogateescape")

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        # copied unless immutable: a KvStore caller may reuse its buffer after set()
        self.txn.put(key.encode("utf-8", "surrogateescape"), value if type(value) is bytes else bytes(value))

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        chunks = tuple(bytes(p) if not isinstance(p, bytes) else p for p in parts)
        self.txn.put(key.encode("utf-8", "surrogateescape"), ChunkedValue(chunks) if len(chunks) > 1 else chunks[0])

    def delete(self, key: str) -> None:
        self.txn.delete(key.encode("utf-8", "surrogateescape"))
