"""Hole 1: symbolic links never take a read or a write outside the store's root.

A checkpoint or database made by someone else may hold links to files or directories
outside it.  Reads resolve keys beneath the root as ``openat2(RESOLVE_BENEATH)`` does: links
that stay inside are followed (OME-Zarr stores link chunks between arrays of one store), a link
that leads out (absolute, climbing above the root, or reached through such a link) is refused,
and the target's bytes are never returned or quoted.  Writes follow no link at all (the
commit's lock file, data files under ``d/``: ``test_symlink_writes.py`` too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ocdbt_py
from ocdbt_py import checkpoint
from ocdbt_py.errors import OcdbtError, StorageError
from ocdbt_py.kvstore import LocalStore, open_kvstore
from ocdbt_py.kvstore import local as local_module
from tests.security.conftest import SECRET


def dirs_checkpoint(path: Path) -> Path:
    """A per-parameter-directory item (Zarr v2 files, no OCDBT) with one array ``w``."""
    path.mkdir()
    (path / "_METADATA").write_text(json.dumps({"tree_metadata": {"('w',)": {
        "key_metadata": [{"key": "w", "key_type": 2}],
        "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}}, "use_ocdbt": False}))
    (path / "w").mkdir()
    (path / "w" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [6], "chunks": [6], "dtype": "<f4", "compressor": None,
        "fill_value": 0, "order": "C", "filters": None}))
    (path / "w" / "0").write_bytes(np.arange(6, dtype="<f4").tobytes())
    return path


def _assert_no_leak(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    text = str(excinfo.value) + repr(excinfo.value.__cause__) + repr(excinfo.value.__context__)
    assert SECRET.decode() not in text
    assert isinstance(excinfo.value, OcdbtError), type(excinfo.value)


def test_dirs_checkpoint_restores(tmp_path: Path) -> None:
    got = checkpoint.restore(dirs_checkpoint(tmp_path / "ck"))
    np.testing.assert_array_equal(got["w"], np.arange(6, dtype=np.float32))


@pytest.mark.parametrize("name", ["w/.zarray", "_METADATA", "w/0", "w"])
def test_symlinked_checkpoint_file_is_not_read(tmp_path: Path, outside: Path, name: str) -> None:
    """A link in place of the metadata, a chunk or a parameter directory: our error, and the
    target's bytes appear nowhere in it."""
    ck = dirs_checkpoint(tmp_path / "ck")
    target = ck / name
    if target.is_dir():
        (outside / "w").mkdir()
        for f in target.iterdir():
            (outside / "w" / f.name).write_bytes(SECRET + f.read_bytes())
        for f in target.iterdir():
            f.unlink()
        target.rmdir()
        target.symlink_to(outside / "w", target_is_directory=True)
    else:
        (outside / "victim").write_bytes(SECRET + b" " + target.read_bytes())
        target.unlink()
        target.symlink_to(outside / "victim")
    with pytest.raises(OcdbtError) as ei:
        checkpoint.restore(ck)
    _assert_no_leak(ei)


def test_store_reads_refuse_links(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "file").symlink_to(outside / "victim")
    (root / "dirlink").symlink_to(outside, target_is_directory=True)
    (root / "sub" / "ok").write_bytes(b"fine")
    kv = LocalStore(root)
    assert kv.get("sub/ok") == b"fine"
    for key in ("file", "dirlink/victim"):
        for op in (kv.get, kv.size, kv.get_with_generation):
            with pytest.raises(StorageError, match="symbolic link") as ei:
                op(key)
            _assert_no_leak(ei)
    assert list(kv.list()) == ["file", "sub/ok"]  # a directory link is not descended into
    with pytest.raises(StorageError, match="symbolic link"):
        list(kv.list("dirlink/"))
    # a link to a directory is not a directory of the store
    assert "dirlink" not in kv.list_dir("")[0]


def test_lock_file_link_does_not_overwrite_victim(tmp_path: Path, outside: Path) -> None:
    db = tmp_path / "db"
    with ocdbt_py.open(db, mode="a") as s:
        s[b"a"] = b"1"
    (db / "manifest.ocdbt.__lock").symlink_to(outside / "victim")
    with pytest.raises(OcdbtError), ocdbt_py.open(db, mode="a") as s:
        s[b"b"] = b"2"
    assert (outside / "victim").read_bytes() == SECRET
    assert os.path.islink(db / "manifest.ocdbt.__lock")
    # the database is intact and still readable
    assert ocdbt_py.open(db)[b"a"] == b"1"


def test_lock_file_hard_link_is_refused(tmp_path: Path, outside: Path) -> None:
    db = tmp_path / "db"
    with ocdbt_py.open(db, mode="a") as s:
        s[b"a"] = b"1"
    os.link(outside / "victim", db / "manifest.ocdbt.__lock")
    with pytest.raises(OcdbtError, match="hard link"), ocdbt_py.open(db, mode="a") as s:
        s[b"b"] = b"2"
    assert (outside / "victim").read_bytes() == SECRET


def test_symlinked_data_dir_gets_no_writes(tmp_path: Path, outside: Path) -> None:
    db = tmp_path / "db"
    with ocdbt_py.open(db, mode="a", config={"max_inline_value_bytes": 0}) as s:
        s[b"a"] = b"x" * 100
    data = db / "d"
    moved = tmp_path / "real_d"
    data.rename(moved)
    empty = outside / "d"
    empty.mkdir()
    data.symlink_to(empty, target_is_directory=True)
    before = sorted(os.listdir(empty))
    with pytest.raises(OcdbtError), ocdbt_py.open(db, mode="a") as s:
        s[b"b"] = b"y" * 100
    assert sorted(os.listdir(empty)) == before == []
    # nor are values read through the link
    (empty / next(iter(os.listdir(moved)))).write_bytes((moved / os.listdir(moved)[0]).read_bytes())
    with pytest.raises(OcdbtError):
        ocdbt_py.open(db)[b"a"]


def test_zarr3_local_fetch_refuses_links(tmp_path: Path, outside: Path) -> None:
    """zarr3's fast local fetcher (used for plain directories) opens chunks with no link
    followed, like LocalStore."""
    import zarr3

    a = zarr3.create(LocalStore(tmp_path / "z"), "a", shape=(4,), dtype="float32", chunks=(4,))
    a[...] = np.arange(4, dtype=np.float32)
    chunk = next(p for p in (tmp_path / "z" / "a").rglob("*") if p.is_file() and p.name != "zarr.json")
    # a valid chunk outside the root: following the link would read it without any error
    (outside / "victim").write_bytes(np.full(4, 7, dtype="<f4").tobytes())
    chunk.unlink()
    chunk.symlink_to(outside / "victim")
    with pytest.raises(StorageError, match="symbolic link"):
        zarr3.open(LocalStore(tmp_path / "z"), "a")[...]


# -- local directories reached through fsspec URLs ------------------------------------------
#: URL forms of a local directory: ``local://`` becomes a LocalStore; the caching and ``dir::``
#: chains stay fsspec stores whose innermost filesystem is local, and refuse links the same way.
LOCAL_URLS = ["local://{}", "simplecache::file://{}", "filecache::file://{}", "blockcache::file://{}",
              "dir::file://{}"]


def _linked_root(tmp_path: Path, outside: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok").write_bytes(b"fine")
    (root / "file").symlink_to(outside / "victim")
    (root / "dirlink").symlink_to(outside, target_is_directory=True)
    return root


@pytest.mark.parametrize("url", LOCAL_URLS)
@pytest.mark.parametrize("walk", [False, True], ids=["openat2", "walk"])
def test_fsspec_local_reads_refuse_links(
    tmp_path: Path, outside: Path, url: str, walk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A linked file and a file below a linked directory: our error naming the link, for every
    way of reading (with ``openat2`` and with the ``O_NOFOLLOW`` walk used where it is
    unavailable); the target's bytes appear nowhere."""
    if walk:
        monkeypatch.setattr(local_module, "_openat2", False)
    kv = open_kvstore(url.format(_linked_root(tmp_path, outside)))
    assert kv.get("sub/ok") == b"fine"
    reads: list[Callable[[str], object]] = [
        kv.get, lambda k: kv.get(k, (0, 4)), lambda k: kv.get(k, (-4, None)), lambda k: kv.get(k, (0, 0)),
        kv.size, kv.exists, lambda k: kv.get_many([k, (k, (1, 3)), "sub/ok"])]
    if kv.fsspec_location() is not None:  # streaming readers get the path only after the same check
        reads.append(kv.fsspec_location)
    for key, link in (("file", "file"), ("dirlink/victim", "dirlink")):
        for op in reads:
            with pytest.raises(StorageError, match=f"/{link} is a symbolic link") as ei:
                op(key)
            _assert_no_leak(ei)


@pytest.mark.parametrize("url", LOCAL_URLS)
def test_fsspec_local_writes_refuse_links(tmp_path: Path, outside: Path, url: str) -> None:
    """Nothing is written, created or removed through a link: ``outside`` is left as it was."""
    kv = open_kvstore(url.format(_linked_root(tmp_path, outside)))
    for write in (lambda k: kv.set(k, b"x"), lambda k: kv.set_parts(k, [b"x", b"y"]), kv.delete):
        for key in ("dirlink/victim", "dirlink/new", "dirlink/deeper/new"):
            with pytest.raises(StorageError, match="/dirlink is a symbolic link") as ei:
                write(key)
            _assert_no_leak(ei)
    if kv.fsspec_location() is not None:  # a streaming writer is refused before it opens anything
        from ocdbt_py.kvstore.sinks import open_sink

        for key in ("dirlink/new", "file"):
            with pytest.raises(StorageError, match="symbolic link"):
                open_sink(kv, key).close()
    # a linked file is never written through (LocalStore replaces the link; fsspec refuses)
    try:
        kv.set("file", b"x")
    except StorageError as e:
        assert "symbolic link" in str(e)
    assert sorted(os.listdir(outside)) == ["victim"]
    assert (outside / "victim").read_bytes() == SECRET


@pytest.mark.parametrize("url", LOCAL_URLS)
def test_fsspec_local_listing_skips_linked_dirs(tmp_path: Path, outside: Path, url: str) -> None:
    """Listings match LocalStore's: a linked directory is not descended into (and is no
    directory of the store), a linked file is listed by name only (reading it is refused),
    listing below a linked directory is refused."""
    kv = open_kvstore(url.format(_linked_root(tmp_path, outside)))
    assert list(kv.list()) == ["file", "sub/ok"]
    assert [k for k, _ in kv.list_sized()] == ["file", "sub/ok"]
    assert list(kv.list("d")) == []
    assert list(kv.list("", start="f", stop="z")) == ["file", "sub/ok"]
    dirs, files = kv.list_dir("")
    assert dirs == ["sub"] and "file" in files  # (LocalStore.list_dir lists "dirlink" as a file)
    for prefix in ("dirlink/", "dirlink/v"):
        with pytest.raises(StorageError, match="/dirlink is a symbolic link") as ei:
            list(kv.list(prefix))
        _assert_no_leak(ei)


@pytest.mark.parametrize("url", LOCAL_URLS)
@pytest.mark.parametrize("linked_root", [False, True])
def test_fsspec_local_store_works(tmp_path: Path, url: str, linked_root: bool) -> None:
    """The same URLs over a plain directory read, write and list as before (the root itself
    may be a link: the caller chose it)."""
    real = tmp_path / "real"
    real.mkdir()
    root = real
    if linked_root:
        root = tmp_path / "alias"
        root.symlink_to(real, target_is_directory=True)
    kv = open_kvstore(url.format(root))
    kv.set("a", b"0123456789")
    kv.set_parts("d/e/f", [b"ab", b"cd"])
    assert (real / "d" / "e" / "f").read_bytes() == b"abcd"
    assert kv.get("a") == b"0123456789"
    assert kv.get("a", (2, 5)) == b"234"
    assert kv.get("a", (-3, None)) == b"789"
    assert kv.get("a", (3, 3)) == b""
    assert kv.get("missing") is None and kv.get("missing/deeper") is None and kv.get("a/b") is None
    assert kv.size("a") == 10 and kv.size("missing") is None
    assert kv.exists("d/e/f") and not kv.exists("d/e")
    assert kv.get_many(["a", ("d/e/f", (1, 3)), "missing"]) == [b"0123456789", b"bc", None]
    assert list(kv.list()) == ["a", "d/e/f"]
    assert list(kv.list("d/")) == ["d/e/f"]
    assert list(kv.list("missing/")) == []
    assert kv.list_dir("") == (["d"], ["a"])
    if kv.fsspec_location() is not None:
        from ocdbt_py.kvstore.sinks import open_sink

        sink = open_sink(kv, "s/t")
        sink.write(b"streamed")
        sink.close()
        assert kv.get("s/t") == b"streamed"
    kv.delete("a")
    kv.delete("a")
    assert not (real / "a").exists()  # (the caching filesystems may still serve their copy)
    assert sorted(os.listdir(real)) == ["d"] + (["s"] if kv.fsspec_location() is not None else [])


@pytest.mark.parametrize("opts", [None, {"auto_mkdir": True}])
def test_plain_local_urls_open_a_local_store(tmp_path: Path, opts: dict[str, object] | None) -> None:
    """``local://`` and ``file://`` (with fsspec storage options too) are plain local
    directories: the LocalStore, with its link refusal and atomic conditional writes."""
    for url in (f"local://{tmp_path}", f"file://{tmp_path}"):
        kv = open_kvstore(url, opts)
        assert isinstance(kv, LocalStore) and kv.root == str(tmp_path), (url, kv)


def test_archive_members_are_unaffected(tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Archive filesystems over a local file hold data, not links: they keep working (member
    paths are not checked against the local directory, even where it holds a link of the
    same name)."""
    import zipfile

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").symlink_to(outside, target_is_directory=True)
    zpath = tmp_path / "a.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        z.writestr("x/y", b"member")
        z.writestr("top", b"t")
    kv = open_kvstore(f"zip::file://{zpath}")
    assert kv.get("x/y") == b"member" and kv.get("top", (0, 1)) == b"t"
    assert list(kv.list()) == ["top", "x/y"]


# -- links that stay beneath the root are followed by reads ------------------------------------
def _root_with_inner_links(tmp_path: Path, outside: Path) -> Path:
    root = tmp_path / "root"
    (root / "base" / "sub").mkdir(parents=True)
    (root / "deep").mkdir()
    (root / "base" / "a").write_bytes(b"A-data")
    (root / "base" / "sub" / "b").write_bytes(b"B")
    os.symlink("base/a", root / "same")                  # a file link
    os.symlink("same", root / "chain")                   # a link to a link
    os.symlink("base", root / "dlink")                   # a directory link
    os.symlink("../base/a", root / "deep" / "x")         # '..' that stays inside
    os.symlink("../root/base/a", root / "up")            # climbs above the root (and back): refused
    os.symlink("../outside/victim", root / "rel_out")    # relative, out of the root
    os.symlink("dlink/../../outside/victim", root / "via")  # out through an inner link
    os.symlink(str(root / "base" / "a"), root / "abs_in")   # absolute, even to inside: refused
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    return root


INNER = {"same": b"A-data", "chain": b"A-data", "dlink/a": b"A-data", "dlink/sub/b": b"B", "deep/x": b"A-data"}
OUT = {"up": "up", "rel_out": "rel_out", "via": "via", "abs_in": "abs_in", "loop1": "loop"}


@pytest.mark.parametrize("url", ["{}", *LOCAL_URLS])
@pytest.mark.parametrize("walk", [False, True], ids=["openat2", "walk"])
def test_reads_follow_links_beneath_the_root(
    tmp_path: Path, outside: Path, url: str, walk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if walk:
        monkeypatch.setattr(local_module, "_openat2", False)
    kv = open_kvstore(url.format(_root_with_inner_links(tmp_path, outside)))
    for key, want in INNER.items():
        assert kv.get(key) == want, key
        assert kv.get(key, (1, 3)) == want[1:3] and kv.get(key, (-1, None)) == want[-1:]
        assert kv.size(key) == len(want) and kv.exists(key)
        assert kv.get_many([key, (key, (0, 1))]) == [want, want[:1]]
    for key, link in OUT.items():
        for op in (kv.get, kv.size, lambda k: kv.get_many([k])):
            with pytest.raises(StorageError, match="symbolic link") as ei:
                op(key)
            assert f"/{link}" in str(ei.value)
            _assert_no_leak(ei)
    assert (outside / "victim").read_bytes() == SECRET
    # writes still follow no link, not even one that stays inside
    root = tmp_path / "root"
    with pytest.raises(StorageError, match="/dlink is a symbolic link"):
        kv.set("dlink/a", b"overwritten")
    try:
        kv.set("same", b"overwritten")  # LocalStore replaces the link itself; fsspec refuses
    except StorageError as e:
        assert "symbolic link" in str(e)
    assert (root / "base" / "a").read_bytes() == b"A-data"


def test_checkpoint_chunk_linked_inside_restores(tmp_path: Path) -> None:
    """A per-parameter checkpoint whose chunk is a relative link to a copy in the same
    checkpoint restores (as zarr-python and TensorStore read it)."""
    ck = dirs_checkpoint(tmp_path / "ck")
    (ck / "copy").mkdir()
    (ck / "w" / "0").rename(ck / "copy" / "0")
    os.symlink("../copy/0", ck / "w" / "0")
    np.testing.assert_array_equal(checkpoint.restore(ck)["w"], np.arange(6, dtype=np.float32))
    (ck / "w" / "0").unlink()
    os.symlink("../../outside_ck", ck / "w" / "0")
    (tmp_path / "outside_ck").write_bytes(np.full(6, 9, dtype="<f4").tobytes())
    with pytest.raises(OcdbtError, match="symbolic link"):
        checkpoint.restore(ck)
