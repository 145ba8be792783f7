"""HTTP stores against a real local server (read-only), through obstore and through fsspec."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from ocdbt_py.errors import StorageError  # noqa: E402
from ocdbt_py.kvstore import KvStore, open_kvstore  # noqa: E402
from ocdbt_py.testing import ReadOnlyStoreTests  # noqa: E402
from tests.servers.http_server import serve_directory  # noqa: E402

_n = itertools.count()


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("http")
    with serve_directory(str(root)) as url:
        yield root, url


class TestHttp(ReadOnlyStoreTests):
    backend = "obstore"

    @pytest.fixture(autouse=True)
    def _srv(self, http_root: tuple[Path, str]) -> None:
        self.root, self.base = http_root

    def make_store(self, seed: dict[str, bytes]) -> KvStore:
        sub = f"s{next(_n)}"
        for k, v in seed.items():
            p = self.root / sub / k
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(v)
        store = open_kvstore(f"{self.base}/{sub}", {"backend": self.backend})
        assert type(store).__name__ == {"obstore": "ObstoreStore", "fsspec": "FsspecStore"}[self.backend]
        return store

    # HTTP servers return the raw directory listing; a "directory" has no value either way
    def test_list_dir(self, store: KvStore) -> None:
        dirs, files = store.list_dir("b/")
        assert dirs == ["d"] and files == ["c"]


class TestHttpFsspec(TestHttp):
    backend = "fsspec"


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_unreachable_server_is_storage_error(backend: str) -> None:
    s = open_kvstore("http://127.0.0.1:9/nothing", {"backend": backend})  # port 9: discard, nothing listens
    with pytest.raises(StorageError) as ei:
        s.get("key")
    assert "127.0.0.1:9" in str(ei.value)
