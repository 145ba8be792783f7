"""Reusable behaviour tests every :class:`KvStore` backend subclasses (pytest classes).

A backend's test module defines a subclass of :class:`StoreTests` (writable backends:
implement ``make_empty``) or :class:`ReadOnlyStoreTests` (backends that can only be read:
implement ``make_store``, returning a store that holds exactly :data:`SEED`).  ocdbt-py's own
backends run the same classes; an outside backend imports them from :mod:`ocdbt_py.testing`.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from ocdbt_py.errors import ConditionFailedError, InvalidKeyError, ReadOnlyError, UnsupportedError
from ocdbt_py.kvstore import KvStore, ReadRequest

__all__ = ["StoreTests", "ReadOnlyStoreTests", "SEED", "BAD_KEYS"]

#: What a store under test holds (keys with nesting, an empty value, a non-ASCII key).
SEED: dict[str, bytes] = {
    "a": b"alpha",
    "b/c": b"",
    "b/d/e": bytes(range(256)) * 4,
    "b/d/f.bin": b"\x00\xff" * 10,
    "z": b"last",
    "\u00fcnicode key": b"u",
}

#: Keys every store must refuse with InvalidKeyError.
BAD_KEYS = ["", "/abs", "a/../b", "..", ".", "a//b", "a/", "a\x00b", "s3://bucket/x", "C:/x", "a\\b"]


class ReadOnlyStoreTests:
    """Reading, listing and range semantics; the store must hold exactly :data:`SEED`."""

    #: whether the backend rejects writes with ReadOnlyError
    expect_read_only: ClassVar[bool] = True

    def make_store(self, seed: dict[str, bytes]) -> KvStore:  # pragma: no cover - abstract
        """A store of the backend under test holding exactly ``seed``."""
        raise NotImplementedError

    @pytest.fixture
    def store(self) -> KvStore:
        return self.make_store(dict(SEED))

    def test_get(self, store: KvStore) -> None:
        for k, v in SEED.items():
            assert store.get(k) == v, k
        assert store.get("missing") is None
        assert store.get("b") is None  # a "directory" is not a key
        assert store.get("b/d/missing") is None

    def test_get_range(self, store: KvStore) -> None:
        v = SEED["b/d/e"]
        assert store.get("b/d/e", (10, 20)) == v[10:20]
        assert store.get("b/d/e", (1000, None)) == v[1000:]
        assert store.get("b/d/e", (-7, None)) == v[-7:]
        assert store.get("b/d/e", (5, 5)) == b""
        assert store.get("b/d/e", (len(v) - 3, len(v) + 100)) == v[-3:]
        assert store.get("missing", (0, 4)) is None
        with pytest.raises(ValueError):
            store.get("a", (5, 2))

    def test_get_many(self, store: KvStore) -> None:
        reqs: list[ReadRequest] = ["a", ("b/d/e", (3, 9)), "nope", ("z", None), ("b/c", None)] * 5
        got = store.get_many(reqs)
        want = [SEED["a"], SEED["b/d/e"][3:9], None, SEED["z"], b""] * 5
        assert got == want

    def test_exists(self, store: KvStore) -> None:
        assert store.exists("a") and store.exists("b/c")
        assert not store.exists("nope") and not store.exists("b")

    def test_list_all_sorted(self, store: KvStore) -> None:
        keys = list(store.list())
        assert keys == sorted(SEED, key=lambda k: k.encode())

    def test_list_prefix_and_range(self, store: KvStore) -> None:
        assert list(store.list("b/")) == ["b/c", "b/d/e", "b/d/f.bin"]
        assert list(store.list("b/d")) == ["b/d/e", "b/d/f.bin"]
        assert list(store.list("b/d/f")) == ["b/d/f.bin"]
        assert list(store.list("nothing/")) == []
        assert list(store.list(start="b/d", stop="z")) == ["b/d/e", "b/d/f.bin"]
        assert list(store.list("b/", start="b/d/f")) == ["b/d/f.bin"]

    def test_list_dir(self, store: KvStore) -> None:
        dirs, files = store.list_dir("")
        assert dirs == ["b"] and sorted(files) == sorted(["a", "z", "\u00fcnicode key"])
        dirs, files = store.list_dir("b/")
        assert dirs == ["d"] and files == ["c"]

    @pytest.mark.parametrize("bad", BAD_KEYS)
    def test_bad_keys_rejected(self, store: KvStore, bad: str) -> None:
        with pytest.raises(InvalidKeyError):
            store.get(bad)

    def test_non_str_key(self, store: KvStore) -> None:
        with pytest.raises((InvalidKeyError, TypeError)):
            store.get(b"a")  # type: ignore[arg-type]

    def test_writes_rejected(self, store: KvStore) -> None:
        if not self.expect_read_only:
            pytest.skip("writable backend")
        with pytest.raises(ReadOnlyError):
            store.set("new", b"x")
        with pytest.raises(ReadOnlyError):
            store.delete("a")


class StoreTests(ReadOnlyStoreTests):
    """Everything in :class:`ReadOnlyStoreTests` plus writing; ``make_store`` seeds via ``set``."""

    expect_read_only = False
    #: whether get_with_generation / set_if are atomic on this backend
    supports_conditional: ClassVar[bool] = True

    def make_empty(self) -> KvStore:  # pragma: no cover - abstract
        """A new, empty, writable store of the backend under test."""
        raise NotImplementedError

    def make_store(self, seed: dict[str, bytes]) -> KvStore:
        s = self.make_empty()
        for k, v in seed.items():
            s.set(k, v)
        return s

    def test_set_overwrite_delete(self, store: KvStore) -> None:
        store.set("new/key", b"1")
        assert store.get("new/key") == b"1"
        store.set("new/key", bytearray(b"22"))
        assert store.get("new/key") == b"22"
        store.set("new/mv", memoryview(b"abc"))
        assert store.get("new/mv") == b"abc"
        store.delete("new/key")
        assert store.get("new/key") is None
        store.delete("new/key")  # absent: no error
        assert "new/key" not in list(store.list())

    def test_large_value(self, store: KvStore) -> None:
        big = bytes(range(256)) * 8192  # 2 MiB
        store.set("big", big)
        assert store.get("big") == big
        assert store.get("big", (1 << 20, (1 << 20) + 5)) == big[1 << 20 : (1 << 20) + 5]

    def test_delete_prefix(self, store: KvStore) -> None:
        store.delete_prefix("b/")
        assert list(store.list("b/")) == []
        assert store.get("a") == SEED["a"]

    @pytest.mark.parametrize("bad", BAD_KEYS)
    def test_bad_keys_rejected_on_write(self, store: KvStore, bad: str) -> None:
        with pytest.raises(InvalidKeyError):
            store.set(bad, b"x")

    def test_conditional_writes(self, store: KvStore) -> None:
        if not self.supports_conditional:
            with pytest.raises(UnsupportedError):
                store.set_if("m", b"x", if_generation=None)
            return
        g1 = store.set_if("m", b"one", if_generation=None)
        with pytest.raises(ConditionFailedError):
            store.set_if("m", b"dup", if_generation=None)
        value, g = store.get_with_generation("m")
        assert value == b"one" and g == g1
        g2 = store.set_if("m", b"two", if_generation=g1)
        assert g2 != g1
        with pytest.raises(ConditionFailedError):
            store.set_if("m", b"stale", if_generation=g1)
        assert store.get("m") == b"two"
        assert store.get_with_generation("absent") == (None, None)

    def test_conditional_race(self, store: KvStore) -> None:
        """Concurrent increments through compare-and-swap lose no update."""
        if not self.supports_conditional:
            pytest.skip("no conditional writes")
        store.set_if("counter", b"0", if_generation=None)
        per_thread, threads = 20, 4

        def work() -> None:
            done = 0
            while done < per_thread:
                value, gen = store.get_with_generation("counter")
                assert value is not None
                try:
                    store.set_if("counter", str(int(value) + 1).encode(), if_generation=gen)
                    done += 1
                except ConditionFailedError:
                    pass

        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert store.get("counter") == str(per_thread * threads).encode()
