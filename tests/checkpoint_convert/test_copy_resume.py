"""``checkpoint.copy`` without the Orbax oracle: interrupted copies (nothing appears at the
destination, and ``resume=True`` finishes skipping the arrays and steps already written), the
CLI surface of ``ocdbt cp``, streamed large chunks (bytes, rewrap, transcode, slabs of a big
source chunk being re-chunked, with bounded memory), damaged input refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import JsonItem, copy, restore, save
from ocdbt_py.checkpoint.convert import item as item_mod
from ocdbt_py.errors import OcdbtError
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.testing.faults import FaultyStore, InjectedFault


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    return {f"layer{i}": {"w": rng.standard_normal((64, 40)).astype(np.float32), "b": np.arange(40) * i}
            for i in range(8)} | {"step": 9, "name": "t"}


def _same(a: Any, b: Any) -> None:
    if isinstance(b, dict):
        assert set(a) == set(b)
        for k in b:
            _same(a[k], b[k])
    elif isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


class _Stop(Exception):
    pass


def _stopper(after: int) -> Any:
    calls = [0]

    def progress(done: int, total: int, unit: str) -> None:
        calls[0] += 1
        if calls[0] > after:
            raise _Stop(f"interrupted after {after} progress reports")

    return progress


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_interrupted_copy_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_ocdbt: bool) -> None:
    monkeypatch.setattr(item_mod, "FLUSH_ARRAYS", 3)  # journal every 3 arrays
    src, dst = tmp_path / "src", tmp_path / "dst"
    tree = _tree()
    save(src, tree, use_ocdbt=not use_ocdbt)
    with pytest.raises(_Stop):
        copy(src, dst, use_ocdbt=use_ocdbt, use_zarr3=True, chunk_byte_size=2048, workers=2,
             progress=_stopper(8))
    assert not dst.exists()  # atomic: nothing until complete
    tmp = tmp_path / "dst.orbax-checkpoint-tmp"
    assert (tmp / ".ocdbt-cp" / "options.json").exists()
    with pytest.raises(OcdbtError, match="other options"):
        copy(src, dst, use_ocdbt=use_ocdbt, use_zarr3=True, chunk_byte_size=4096, resume=True)
    s = copy(src, dst, use_ocdbt=use_ocdbt, use_zarr3=True, chunk_byte_size=2048, workers=2, resume=True,
             verify=True)
    assert s["units"][0]["status"] == "resumed"
    assert 3 <= s["arrays_resumed"] < 17 and s["arrays_resumed"] + s["arrays"] == 17
    _same(restore(dst), tree)
    assert not tmp.exists() and not (dst / ".ocdbt-cp").exists()
    if use_ocdbt:  # data files of the interrupted batch that nothing references are gone
        import ocdbt_py

        db = ocdbt_py.open(str(dst / "ocdbt.process_0"))
        used = {e.location.file.relative_path.decode() for e in db.entries() if e.location is not None}
        files = {f"d/{p.name}" for p in (dst / "ocdbt.process_0" / "d").iterdir()}
        assert used <= files and len(files - used) <= 2  # B+tree node files of the database itself


def test_interrupted_in_place_copy_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit-file mode (object stores): an I/O failure leaves no commit marker; resuming in
    place finishes the copy."""
    monkeypatch.setattr(item_mod, "FLUSH_ARRAYS", 3)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tree = _tree()
    save(src, tree)
    with pytest.raises(InjectedFault):
        copy(src, FaultyStore(LocalStore(str(dst)), fail_at=30), use_ocdbt=False, workers=1)
    # in place, unfinished: no commit marker (Orbax's rule on object stores), no _METADATA yet
    assert dst.exists() and not (dst / "commit_success.txt").exists() and not (dst / "_METADATA").exists()
    s = copy(src, FaultyStore(LocalStore(str(dst))), use_ocdbt=False, workers=1, resume=True)
    assert s["units"][0]["status"] == "resumed" and s["arrays_resumed"] > 0
    assert (dst / "commit_success.txt").exists()
    # the journal is deleted (an object store has no directories; this wrapper's local one stays empty)
    assert not list((dst / ".ocdbt-cp").glob("*"))
    _same(restore(dst), tree)


def test_resume_skips_copied_steps(tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    for step in (1, 2, 3):
        save(root / str(step), {"state": _tree(), "meta": JsonItem({"step": step})}, composite=True)
    (root / "metadata").mkdir()
    (root / "metadata" / "_ROOT_METADATA").write_text('{"custom_metadata": {"run": 7}}')

    def progress(done: int, total: int, unit: str) -> None:
        if unit == "2" and done > 0:
            raise _Stop("step 2 interrupted")

    with pytest.raises(_Stop):
        copy(root, out, use_zarr3=True, progress=progress)
    assert sorted(p.name for p in out.iterdir()) == ["1", "2.orbax-checkpoint-tmp", "metadata"]
    s = copy(root, out, use_zarr3=True, resume=True)
    assert [u["status"] for u in s["units"]] == ["skipped", "resumed", "copied"]
    assert sorted(p.name for p in out.iterdir()) == ["1", "2", "3", "metadata"]
    assert (out / "metadata" / "_ROOT_METADATA").read_bytes() == (root / "metadata" / "_ROOT_METADATA").read_bytes()
    got = restore(out)  # the latest step, every item
    _same(got["state"], _tree())
    assert got["meta"] == {"step": 3}


def _cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from ocdbt_py.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_cp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    save(src, _tree(), use_ocdbt=False)
    rc, out, err = _cli("cp", str(src), str(tmp_path / "a"), "--ocdbt", "--zarr3", "--verify", "--json",
                        capsys=capsys)
    assert rc == 0 and err == ""
    summary = json.loads(out)
    assert summary["arrays"] == 17 and summary["chunks_rewrapped"] > 0 and summary["verified"] is True
    assert summary["units"] == [{"name": "", "kind": "pytree", "status": "copied"}]
    rc, out, err = _cli("cp", str(src), str(tmp_path / "a"), capsys=capsys)
    assert rc == 1 and "--force" in err and "--resume" in err
    rc, out, err = _cli("cp", str(src), str(tmp_path / "b"), "--compression", "lz4", capsys=capsys)
    assert rc == 2 and "zstd:LEVEL" in err
    rc, out, err = _cli("cp", str(src), str(tmp_path / "c"), "--quiet", "--chunk-byte-size", "1KiB",
                        "--exclude", "layer7.*", "--dtype", "bfloat16", "--compression", "none", capsys=capsys)
    assert rc == 0 and out.startswith("copied 15 arrays (") and err == ""  # the result on stdout, nothing else
    got = restore(tmp_path / "c")
    assert "layer7" not in got and got["layer0"]["w"].dtype.name == "bfloat16"
    zarray = json.loads((tmp_path / "c" / "layer0.w" / ".zarray").read_text())
    assert zarray["compressor"] is None and np.prod(zarray["chunks"]) * 2 <= 1024
    rc, out, err = _cli("cp", str(src), str(tmp_path / "i"), "--include", "layer1.*", "--include", "step",
                        "--quiet", capsys=capsys)
    assert rc == 0
    got = restore(tmp_path / "i")
    assert set(got) == {"layer1", "step", "name"} and got["step"] == 9 and got["name"] == "t"
    rc, out, err = _cli("cp", str(src), str(tmp_path / "d"), "--target-data-file-size", "12x", capsys=capsys)
    assert rc == 2
    rc, out, err = _cli("cp", str(src), str(tmp_path / "e"), capsys=capsys)
    assert rc == 0 and out.startswith("copied 17 arrays") and err == ""  # the result on stdout


def test_large_chunks_are_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks larger than a task's piece are copied in pieces (bytes and rewrapped), both ways
    between the layouts and Zarr versions, and verify."""
    from ocdbt_py.checkpoint.convert import arrays as arrays_mod

    monkeypatch.setattr(arrays_mod, "BATCH_BYTES", 1 << 15)
    tree = {"w": np.random.default_rng(1).standard_normal((300, 500)), "v": np.arange(100_000, dtype=np.int32)}
    save(tmp_path / "pp", tree, use_ocdbt=False)
    for name, src, kw, kind in [("a", "pp", {"use_ocdbt": True, "use_zarr3": True}, "chunks_rewrapped"),
                                ("b", "a", {"use_ocdbt": False, "use_zarr3": False}, "chunks_rewrapped"),
                                ("c", "a", {}, "chunks_bytes"), ("d", "b", {"use_ocdbt": True}, "chunks_bytes")]:
        s = copy(tmp_path / src, tmp_path / name, verify=True, **kw)
        assert s[kind] == 2 and s["chunks_encoded"] == 0
        _same(restore(tmp_path / name), tree)
    s = copy(tmp_path / "a", tmp_path / "t", compression="zstd:9", use_zarr3=False, verify=True)
    assert s["chunks_transcoded"] == 2 and s["chunks_encoded"] == 0
    _same(restore(tmp_path / "t"), tree)
    s = copy(tmp_path / "t", tmp_path / "u", compression="none", use_ocdbt=False, verify=True)
    assert s["chunks_transcoded"] == 2
    _same(restore(tmp_path / "u"), tree)
    # a damaged shard index is refused, not copied
    import ocdbt_py

    loc = next(e.location for e in ocdbt_py.open(str(tmp_path / "a" / "ocdbt.process_0")).entries()
               if e.key == b"w/c/0/0")
    chunk = tmp_path / "a" / "ocdbt.process_0" / loc.file.relative_path.decode()
    data = bytearray(chunk.read_bytes())
    data[loc.offset + loc.length - 1] ^= 0xFF  # the shard index's CRC-32C
    chunk.write_bytes(bytes(data))
    with pytest.raises(OcdbtError):
        copy(tmp_path / "a", tmp_path / "f", use_zarr3=False)


@pytest.mark.parametrize("zarr3", [False, True])
def test_large_source_chunks_are_split_as_a_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   zarr3: bool) -> None:
    """Re-chunking an array stored as one big chunk decodes it as a stream of slabs: the copy
    never holds the source chunk (nor a destination region of its size) in memory."""
    import tracemalloc

    from ocdbt_py.checkpoint.convert import arrays as arrays_mod
    from ocdbt_py.checkpoint.convert import encoding as encoding_mod

    # the memory constants scaled down 32x with the array
    monkeypatch.setattr(arrays_mod, "REGION_BYTES", 1 << 20)
    monkeypatch.setattr(arrays_mod, "BATCH_BYTES", 1 << 17)
    monkeypatch.setattr(arrays_mod, "RAW_PIECE", 1 << 17)
    monkeypatch.setattr(encoding_mod, "RAW_PIECE", 1 << 17)
    rng = np.random.default_rng(2)
    tree = {"w": rng.standard_normal((2048, 2048)), "z": np.zeros((2048, 512), np.float32), "s": np.arange(7)}
    save(tmp_path / "src", tree, use_ocdbt=False, use_zarr3=zarr3)  # one 32 MiB / 4 MiB chunk each
    tracemalloc.start()
    try:
        s = copy(tmp_path / "src", tmp_path / "dst", use_ocdbt=True, chunk_byte_size=64 << 10, dtype="float32",
                 verify=True, workers=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s["chunks_encoded"] > 100
    assert peak < 8 << 20, f"peak traced memory {peak} bytes"
    got = restore(tmp_path / "dst")
    assert got["w"].dtype == np.float32 and np.array_equal(got["w"], tree["w"].astype(np.float32))
    assert np.array_equal(got["z"], tree["z"]) and np.array_equal(got["s"], tree["s"])
    zarray = json.loads((tmp_path / "src" / "w" / (".zarray" if not zarr3 else "zarr.json")).read_text())
    assert zarray["chunks" if not zarr3 else "chunk_grid"] in ([2048, 2048], {"name": "regular", "configuration":
                                                                               {"chunk_shape": [2048, 2048]}})
