"""Issue 32, hole 7: the low items, each cleaned up, refused clearly or documented.

* leftovers of interrupted deletions (``*.orbax-checkpoint-tmp-deleting-*``) are removed when
  a writing manager opens the root, whatever ``cleanup_tmp_directories`` says;
* a second writing manager on one local root (another process) is refused with
  :class:`RootInUseError` at once, instead of racing the first one;
* step names are parsed whole (``"12\\n"`` is no step) and a step number several names give
  is settled by the root's own format, so a planted ``0012`` or ``x_12`` cannot shadow ``12``;
* a step emptied by a concurrent delete is :class:`NotFoundError`, not a ``ValueError``;
* a safetensors header naming a tensor twice is refused;
* tensor names the per-parameter layout cannot hold (``_CHECKPOINT_METADATA``, absolute
  paths, NUL...) are refused at import, and ``cp`` to that layout refuses them clearly;
* ``OcdbtFileSystem.get("", dst, recursive=True)`` copies every key;
* a header of 200,000 tensors costs memory proportional to it (measured bound).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import ocdbt_py
import ocdbt_py.orbax as ob
from ocdbt_py import checkpoint
from ocdbt_py.bridges.fsspec_ocdbt import OcdbtFileSystem
from ocdbt_py.bridges.safetensors_import import import_safetensors, list_source
from ocdbt_py.checkpoint.layout import parse_step_name
from ocdbt_py.checkpoint.manager import CheckpointManager
from ocdbt_py.errors import CorruptionError, NotFoundError, UnsupportedError
from tests.security.childproc import run_child

SYNC = ob.CheckpointManagerOptions(enable_async_checkpointing=False)


def _safetensors(path: Path, names: list[str], *, raw_header: str | None = None) -> Path:
    """A safetensors file of float32 ``[3]`` tensors named ``names`` (``raw_header``: as given)."""
    header = raw_header or json.dumps(
        {n: {"dtype": "F32", "shape": [3], "data_offsets": [12 * i, 12 * i + 12]} for i, n in enumerate(names)})
    raw = header.encode() + b" " * (-len(header.encode()) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + np.arange(3 * len(names), dtype="<f4").tobytes())
    return path


# -- leftovers of interrupted deletions -------------------------------------------------------

def test_interrupted_deletions_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with ob.CheckpointManager(root, options=SYNC) as m:
        m.save(1, args=ob.args.StandardSave({"w": np.ones(2)}))
    (root / "0.orbax-checkpoint-tmp-deleting-1a2b3c4d" / "default").mkdir(parents=True)
    (root / "5.orbax-checkpoint-tmp").mkdir()  # an interrupted save: kept (Orbax's default)
    with ob.CheckpointManager(root, options=SYNC) as m:  # cleanup_tmp_directories=False
        assert list(m.all_steps()) == [1]
    assert sorted(p.name for p in root.iterdir()) == ["1", "5.orbax-checkpoint-tmp"]
    (root / "0.orbax-checkpoint-tmp-deleting-1a2b3c4d").mkdir()
    with ob.CheckpointManager(root, options=ob.CheckpointManagerOptions(read_only=True)):
        pass  # a read-only manager removes nothing
    assert (root / "0.orbax-checkpoint-tmp-deleting-1a2b3c4d").exists()


# -- two managers on one root ---------------------------------------------------------------

_OTHER = """
import sys
from ocdbt_py.checkpoint.manager import CheckpointManager
from ocdbt_py.checkpoint.manager.rootlock import RootInUseError
try:
    CheckpointManager(sys.argv[1], async_save=False)
    print("OPENED")
except RootInUseError as e:
    print("REFUSED", e)
m = CheckpointManager(sys.argv[1], read_only=True)
print("READ", m.all_steps())
"""


def _other_process(root: Path) -> str:
    r = subprocess.run([sys.executable, "-c", _OTHER, str(root)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_a_second_writing_manager_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "run"
    m = CheckpointManager(root, async_save=False)
    m.save(1, {"p": {"w": np.ones(2)}})
    out = _other_process(root)
    assert "REFUSED" in out and "in use by another process" in out and "READ [1]" in out
    same = CheckpointManager(root, async_save=False)  # the same process: shares the hold
    same.close()
    out = _other_process(root)
    assert "REFUSED" in out  # still held by m
    m.close()
    assert "OPENED" in _other_process(root)
    assert sorted(p.name for p in root.iterdir()) == ["1"]  # no file of its own in the root


# -- step names ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,step", [("12", 12), ("0012", 12), ("ckpt_12", 12), ("ckpt_0012", 12),
                                       ("12\n", None), ("\n12", None), ("1\u0662", None), ("12 ", None),
                                       ("12.orbax-checkpoint-tmp", None)])
def test_step_names_parse_whole(name: str, step: int | None) -> None:
    assert parse_step_name(name) == step


def test_planted_names_do_not_shadow_a_step(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with CheckpointManager(root, async_save=False) as m:
        for s in (11, 12):
            m.save(s, {"params": {"w": np.full(3, s)}})
    for bad in ("0012", "x_12", "12\n"):
        shutil.copytree(root / "11", root / bad)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert [(e.step, e.name) for e in checkpoint.list_steps(root)] == [(11, "11"), (12, "12")]
        np.testing.assert_array_equal(checkpoint.restore(root, step=12)["params"]["w"], np.full(3, 12))


# -- concurrent delete ------------------------------------------------------------------------

def test_step_emptied_while_read_is_not_found(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with ob.CheckpointManager(root, options=SYNC) as m:
        for s in (1, 2):
            m.save(s, args=ob.args.StandardSave({"w": np.ones(2) * s}))
    reader = ob.CheckpointManager(root, options=ob.CheckpointManagerOptions(read_only=True))
    shutil.rmtree(root / "2" / "default")  # what a concurrent delete leaves for an instant
    for call in (lambda: reader.restore(2, args=ob.args.StandardRestore()), lambda: reader.restore(2),
                 lambda: reader.metadata(2)):
        with pytest.raises(NotFoundError, match="step 2 .* holds no items"):
            call()
    shutil.rmtree(root / "2")
    with pytest.raises(FileNotFoundError):
        reader.restore(2, args=ob.args.StandardRestore())


# -- safetensors names ---------------------------------------------------------------------------

def test_duplicate_tensor_names_are_refused(tmp_path: Path) -> None:
    def e(a: int) -> str:
        return json.dumps({"dtype": "F32", "shape": [3], "data_offsets": [a, a + 12]})

    header = f'{{"a": {e(0)}, "b": {e(12)}, "a": {e(24)}}}'
    f = _safetensors(tmp_path / "dup.safetensors", ["a", "b", "c"], raw_header=header)
    with pytest.raises(CorruptionError, match="names 'a' twice"):
        list_source(f)
    with pytest.raises(CorruptionError, match="names 'a' twice"):
        import_safetensors(f, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("name", ["_CHECKPOINT_METADATA", "_METADATA", "commit_success.txt", "/etc/passwd",
                                  "a/b", "a\x00b", "a\nb", "manifest.ocdbt", "ocdbt.process_0.w"])
def test_unstorable_tensor_names_are_refused_at_import(tmp_path: Path, name: str) -> None:
    f = _safetensors(tmp_path / "x.safetensors", [name, "w"])
    with pytest.raises(ValueError, match="rename it"):
        import_safetensors(f, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
    import_safetensors(f, tmp_path / "ck", rename={name: "renamed"})  # renaming makes it importable
    got = checkpoint.restore(tmp_path / "ck")
    np.testing.assert_array_equal(got["renamed"], np.arange(3, dtype=np.float32))


def test_cp_to_directories_refuses_unstorable_names(tmp_path: Path) -> None:
    """An OCDBT item holding such a name (written by anyone): copying it to the per-parameter
    layout is refused clearly instead of losing the item's own files."""
    src = tmp_path / "src"
    checkpoint.save(src, {"_CHECKPOINT_METADATA": np.ones(2), "w": np.zeros(2)})
    with pytest.raises(UnsupportedError, match="'_CHECKPOINT_METADATA' cannot be written in the per-parameter"):
        checkpoint.copy(src, tmp_path / "dst", use_ocdbt=False)
    assert not (tmp_path / "dst").exists()
    checkpoint.copy(src, tmp_path / "dst", use_ocdbt=False, exclude=["_CHECKPOINT_METADATA"])
    assert sorted(checkpoint.restore(tmp_path / "dst")) == ["w"]
    checkpoint.copy(src, tmp_path / "dst2")  # OCDBT keeps it: keys, not directories
    np.testing.assert_array_equal(checkpoint.restore(tmp_path / "dst2")["_CHECKPOINT_METADATA"], np.ones(2))


# -- OcdbtFileSystem.get of the whole database ------------------------------------------------------

@pytest.mark.parametrize("dst_exists", [True, False])
def test_fsspec_get_of_the_root(tmp_path: Path, dst_exists: bool) -> None:
    db = ocdbt_py.open(str(tmp_path / "db"), mode="a")
    for k in (b"c.txt", b"a/b.txt", b"a/b/c.txt"):
        db[k] = k
    db.close()
    dst = tmp_path / "out"
    if dst_exists:
        dst.mkdir()
    OcdbtFileSystem(str(tmp_path / "db")).get("", str(dst), recursive=True)
    got = sorted(os.path.relpath(os.path.join(d, f), dst) for d, _, fs in os.walk(dst) for f in fs)
    assert got == ["a/b.txt", "a/b/c.txt", "c.txt"]
    assert (dst / "a" / "b.txt").read_bytes() == b"a/b.txt"


# -- many tensors -----------------------------------------------------------------------------------

def test_many_tensors_cost_memory_in_proportion(tmp_path: Path) -> None:
    """50,000 tensors (a 3.5 MB header): listing costs well under 30x the header, not a
    multiple of the tensor count beyond it (spec/security.md quotes the 200,000-tensor run)."""
    n = 50_000
    header = json.dumps({f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                         for i in range(n)}, separators=(",", ":"))
    f = _safetensors(tmp_path / "many.safetensors", [], raw_header=header)
    with open(f, "r+b") as fh:  # the data: n floats after the header
        fh.seek(0, 2)
        fh.write(np.zeros(n, "<f4").tobytes())
    got = run_child(f"""
        from ocdbt_py.bridges.safetensors_import import list_source
        def listing():
            return len(list_source({str(f)!r})[1])
        measure(listing)
    """)
    mib, _secs, outcome = got["listing"]
    assert outcome == f"ok {n}", outcome
    assert mib < 30 * len(header) / 2**20, (mib, len(header))


def test_a_root_made_by_the_first_save_is_locked_then(tmp_path: Path) -> None:
    root = tmp_path / "later"
    m = CheckpointManager(root, async_save=False)
    assert not root.exists()  # opening a manager makes no directory
    m.save(1, {"p": {"w": np.ones(2)}})
    out = _other_process(root)
    assert "REFUSED" in out and "READ [1]" in out  # the first save took the hold
    m.close()
    assert "OPENED" in _other_process(root)
