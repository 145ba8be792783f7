"""Writes that stream files below a local root never follow a symbolic link out of it.

Data files (``open_sink``) and the files of a save's temporary directory
(``DeferredSyncStore``) are created with no link followed, the file itself included.  The
link may appear while a save runs (another process in a shared directory), so the tests
plant it after the save has prepared its temporary directory.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.saving import atomic
from ocdbt_py.errors import OcdbtError, StorageError
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.kvstore.prefixed import PrefixStore
from ocdbt_py.kvstore.sinks import DeferredSyncStore, open_sink
from tests.security.conftest import SECRET


def _untouched(outside: Path) -> None:
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_bytes() == SECRET


@pytest.mark.parametrize("store", ["local", "prefixed", "deferred"])
def test_sink_refuses_linked_directory(tmp_path: Path, outside: Path, store: str) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "link").symlink_to(outside, target_is_directory=True)
    kv: Any = {"local": LocalStore(root), "deferred": DeferredSyncStore(root),
               "prefixed": PrefixStore(LocalStore(root), "sub")}[store]
    key = "link/new" if store == "prefixed" else "sub/link/new"
    with pytest.raises(StorageError, match="symbolic link"):
        open_sink(kv, key)
    _untouched(outside)


def test_sink_refuses_linked_file(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "f").symlink_to(outside / "victim")
    with pytest.raises(StorageError, match="symbolic link"):
        open_sink(LocalStore(root), "f")
    _untouched(outside)
    assert os.path.islink(root / "f")


def test_sink_writes_and_aborts_below_root(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path / "root")
    s = open_sink(kv, "a/b/c")
    s.write(b"hello ")
    s.write(memoryview(b"world"))
    s.close()
    assert kv.get("a/b/c") == b"hello world"
    s = open_sink(kv, "a/b/d")
    s.write(b"partial")
    s.abort()
    assert kv.get("a/b/d") is None


def test_sink_abort_removes_only_its_own_file(tmp_path: Path, outside: Path) -> None:
    """The directory is swapped for a link to elsewhere while the file is written: abort
    removes the file it created, not a same-named file at the link's target."""
    root = tmp_path / "root"
    kv = LocalStore(root)
    s = open_sink(kv, "d/victim")
    s.write(b"x")
    (root / "d").rename(tmp_path / "moved")
    (root / "d").symlink_to(outside, target_is_directory=True)
    s.abort()
    _untouched(outside)
    assert not (tmp_path / "moved" / "victim").exists()


@pytest.mark.parametrize("what", ["set", "set_parts"])
def test_deferred_store_refuses_links(tmp_path: Path, outside: Path, what: str) -> None:
    root = tmp_path / "tmpdir"
    root.mkdir()
    (root / "dir").symlink_to(outside, target_is_directory=True)
    (root / "f").symlink_to(outside / "victim")
    kv = DeferredSyncStore(root)
    for key in ("dir/new", "f", "dir/victim"):
        with pytest.raises(StorageError, match="symbolic link"):
            if what == "set":
                kv.set(key, b"overwritten")
            else:
                kv.set_parts(key, [b"over", b"written"])
    _untouched(outside)
    kv.set_parts("ok/x", [b"a", b"b"])
    kv.sync_all()
    assert kv.get("ok/x") == b"ab"


def test_deferred_sync_skips_file_swapped_for_fifo(tmp_path: Path) -> None:
    """A written file replaced by a FIFO before the batch sync: the sync reports an error or
    passes, but never blocks on the FIFO's open."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    kv = DeferredSyncStore(tmp_path / "t")
    kv.set("a/x", b"1")
    os.unlink(tmp_path / "t" / "a" / "x")
    fifo = tmp_path / "t" / "a" / "x"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            kv.sync_all()
        except StorageError:
            pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    blocked = t.is_alive()
    if blocked:  # let the stuck open return (a writer appears), so the thread ends
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
    assert not blocked, "sync_all blocked opening a FIFO"
    assert not errors, errors


def test_deferred_sync_refuses_file_swapped_for_link(tmp_path: Path, outside: Path) -> None:
    kv = DeferredSyncStore(tmp_path / "t")
    kv.set("a/x", b"1")
    os.unlink(tmp_path / "t" / "a" / "x")
    (tmp_path / "t" / "a" / "x").symlink_to(outside / "victim")
    with pytest.raises(StorageError, match="symbolic link"):
        kv.sync_all()
    _untouched(outside)


def test_deferred_sync_follows_no_link_even_inside(tmp_path: Path) -> None:
    """Reads follow links that stay inside the root; a writer reopening its own files to sync
    them does not (the link is refused, as with any write)."""
    kv = DeferredSyncStore(tmp_path / "t")
    kv.set("a/x", b"1")
    kv.set("a/y", b"2")
    os.unlink(tmp_path / "t" / "a" / "x")
    (tmp_path / "t" / "a" / "x").symlink_to("y")
    with pytest.raises(StorageError, match="symbolic link"):
        kv.sync_all()


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_save_into_temp_dir_with_planted_link(tmp_path: Path, outside: Path, use_ocdbt: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A link planted in the save's temporary directory right after it was made (where the
    data files, or the parameter's directory, go): the save fails with our error, writes
    nothing outside, and commits nothing."""
    prepare = atomic.Destination.prepare
    target = "ocdbt.process_0" if use_ocdbt else "w"

    def prepare_and_plant(self: atomic.Destination, force: bool) -> None:
        prepare(self, force)
        assert self.tmp_dir is not None
        os.symlink(outside, os.path.join(self.tmp_dir, target), target_is_directory=True)

    monkeypatch.setattr(atomic.Destination, "prepare", prepare_and_plant)
    tree = {"w": np.arange(1 << 16, dtype=np.float32)}
    with pytest.raises(OcdbtError):
        checkpoint.save(tmp_path / "ck", tree, use_ocdbt=use_ocdbt)
    _untouched(outside)
    assert not (tmp_path / "ck").exists()
    monkeypatch.undo()
    checkpoint.save(tmp_path / "ck", tree, use_ocdbt=use_ocdbt)  # the next save replaces the temp dir
    np.testing.assert_array_equal(checkpoint.restore(tmp_path / "ck")["w"], tree["w"])
    _untouched(outside)
