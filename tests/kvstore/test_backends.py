"""The shared store suite run against every local backend."""

from __future__ import annotations

import itertools
import os
import zipfile
from pathlib import Path

import pytest

from ocdbt_py.errors import UnsupportedError
from ocdbt_py.kvstore import KvStore, LocalStore, MemoryStore, PrefixStore, open_kvstore
from ocdbt_py.kvstore.fsspec_store import FsspecStore
from ocdbt_py.testing import SEED, ReadOnlyStoreTests, StoreTests

_counter = itertools.count()


class TestMemoryStore(StoreTests):
    def make_empty(self) -> KvStore:
        return MemoryStore()


class TestLocalStore(StoreTests):
    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path: Path) -> None:
        self.tmp = tmp_path

    def make_empty(self) -> KvStore:
        return LocalStore(self.tmp / f"s{next(_counter)}")

    def test_no_temp_or_lock_files_listed(self, store: KvStore) -> None:
        store.set_if("m", b"x", if_generation=None)
        assert "m" in list(store.list())
        assert all("__lock" not in k and "__tmp" not in k for k in store.list())

    def test_symlink_escape_not_followed_for_keys(self, tmp_path: Path) -> None:
        # keys are validated, so a key can never name a path outside the root
        s = LocalStore(tmp_path / "root")
        (tmp_path / "secret").write_bytes(b"s")
        from ocdbt_py.errors import InvalidKeyError

        with pytest.raises(InvalidKeyError):
            s.get("../secret")


class TestPrefixStore(StoreTests):
    def make_empty(self) -> KvStore:
        base = MemoryStore()
        base.set("outside", b"o")
        return PrefixStore(base, "inner/dir")

    def test_prefix_isolated(self) -> None:
        base = MemoryStore()
        base.set("outside", b"o")
        p = PrefixStore(base, "x")
        p.set("k", b"v")
        assert base.get("x/k") == b"v"
        assert list(p.list()) == ["k"]


class TestFsspecLocal(StoreTests):
    supports_conditional = False

    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path: Path) -> None:
        self.tmp = tmp_path

    def make_empty(self) -> KvStore:
        d = self.tmp / f"f{next(_counter)}"
        d.mkdir()
        return FsspecStore.from_url(d.as_uri())


class TestFsspecMemory(StoreTests):
    supports_conditional = False

    def make_empty(self) -> KvStore:
        return FsspecStore.from_url(f"memory://ocdbt-test-{os.getpid()}-{next(_counter)}")


class TestFsspecZip(ReadOnlyStoreTests):
    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path: Path) -> None:
        self.tmp = tmp_path

    def make_store(self, seed: dict[str, bytes]) -> KvStore:
        path = self.tmp / f"z{next(_counter)}.zip"
        with zipfile.ZipFile(path, "w") as z:
            for k, v in seed.items():
                z.writestr(k, v)
        return open_kvstore(f"zip://::{path.as_uri()}")


def test_open_kvstore_dispatch(tmp_path: Path) -> None:
    assert isinstance(open_kvstore(str(tmp_path)), LocalStore)
    assert isinstance(open_kvstore(tmp_path.as_uri()), LocalStore)
    assert isinstance(open_kvstore(tmp_path), LocalStore)
    assert isinstance(open_kvstore("memory://x"), FsspecStore)
    m = MemoryStore()
    assert open_kvstore(m) is m
    with pytest.raises(TypeError):
        open_kvstore(42)  # type: ignore[arg-type]


def test_fsspec_conditional_unsupported() -> None:
    s = FsspecStore.from_url("memory://cond")
    with pytest.raises(UnsupportedError):
        s.set_if("k", b"v", if_generation=None)


def test_seed_has_expected_shape() -> None:
    # guards the suite itself: nested keys, an empty value, a non-ASCII key
    assert any("/" in k for k in SEED) and b"" in SEED.values()
    assert any(not k.isascii() for k in SEED)
