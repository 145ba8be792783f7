"""Servers that do not enforce preconditions: refused with a clear error, or allowed with
``single_writer=True``.  The pure-Python GCS emulator is such a server (it accepts an
``ifGenerationMatch`` that does not match)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from ocdbt_py.errors import ConditionFailedError, UnsupportedError
from ocdbt_py.kvstore import KvStore, open_kvstore
from ocdbt_py.kvstore.gcs import GcsStore
from ocdbt_py.kvstore.single_writer import SingleWriterStore
from ocdbt_py.testing import StoreTests
from tests.objectstores import servers
from tests.objectstores.conftest import serve_with_bucket

_n = itertools.count()
BUCKET = "lax"


@pytest.fixture(scope="module")
def lax_gcs() -> Iterator[servers.GcsServer]:
    yield from serve_with_bucket(servers.start_gcs_python_emulator, BUCKET)


def test_server_really_ignores_preconditions(lax_gcs: servers.GcsServer) -> None:
    """Guards the premise: a forced conditional write that a real GCS would refuse succeeds."""
    store = open_kvstore(f"gs://{BUCKET}/premise", lax_gcs.storage_options())
    assert isinstance(store, GcsStore)
    bucket, name = store._locate("k")
    store._run(store._write_plain(bucket, name, b"v"))
    store._run(store._write_conditional(bucket, name, b"w", None))  # no 412 from this server
    assert store.get("k") == b"w"


def test_ignored_preconditions_are_refused(lax_gcs: servers.GcsServer) -> None:
    store = open_kvstore(f"gs://{BUCKET}/refuse{next(_n)}", lax_gcs.storage_options())
    with pytest.raises(UnsupportedError) as ei:
        store.set_if("manifest", b"x", if_generation=None)
    assert "single_writer" in str(ei.value) and f"gs://{BUCKET}/refuse" in str(ei.value)
    assert store.get("manifest") is None
    assert list(store.list()) == []  # the probe left nothing behind


def test_ocdbt_commit_refused_then_allowed_single_writer(lax_gcs: servers.GcsServer) -> None:
    import ocdbt_py

    url = f"gs://{BUCKET}/db{next(_n)}"
    with pytest.raises(UnsupportedError):
        db = ocdbt_py.open(url, mode="a", storage_options=lax_gcs.storage_options())
        db.put(b"k", b"v")
    opts = dict(lax_gcs.storage_options(), single_writer=True)
    db = ocdbt_py.open(url, mode="a", storage_options=opts)
    db.put(b"k", b"v")
    db.put(b"k2", b"v2")
    again = ocdbt_py.open(url, storage_options=lax_gcs.storage_options())
    assert again.get(b"k") == b"v" and again.get(b"k2") == b"v2"


class TestSingleWriterGcs(StoreTests):
    """single_writer=True on the lax server: the suite holds within one process."""

    @pytest.fixture(autouse=True)
    def _srv(self, lax_gcs: servers.GcsServer) -> None:
        self.srv = lax_gcs

    def make_empty(self) -> KvStore:
        opts = dict(self.srv.storage_options(), single_writer=True)
        return open_kvstore(f"gs://{BUCKET}/sw{next(_n)}", opts)


class TestSingleWriterFsspecMemory(StoreTests):
    def make_empty(self) -> KvStore:
        s = open_kvstore(f"memory://sw-{os.getpid()}-{next(_n)}", {"single_writer": True})
        assert isinstance(s, SingleWriterStore)
        return s


def test_generic_fsspec_without_opt_in_has_no_conditional_writes() -> None:
    s = open_kvstore(f"memory://plain-{next(_n)}")
    with pytest.raises(UnsupportedError):
        s.set_if("k", b"v", if_generation=None)


def test_single_writer_condition_still_checked() -> None:
    s = open_kvstore(f"memory://swc-{next(_n)}", {"single_writer": True})
    g = s.set_if("k", b"1", if_generation=None)
    with pytest.raises(ConditionFailedError):
        s.set_if("k", b"2", if_generation="bogus")
    assert s.set_if("k", b"2", if_generation=g) != g
