"""Issue 32, holes 5 and 6: ``ocdbt cp --resume`` trusting what it finds.

5. A link planted at ``DST.orbax-checkpoint-tmp`` made ``cp --resume`` write the whole copy
   into the link's target (a victim's ``_METADATA`` overwritten) and leave DST a link to it.
   The temporary directory is now opened from its parent with no link followed: a link there
   is refused (with or without ``--resume``, on purpose), and one swapped in while the copy
   runs gets an error, never the files.
6. ``cp --resume`` trusted the journal of the interrupted copy without checking the source:
   a source re-saved in between gave a committed copy mixing old and new arrays, exit 0.
   The journal now records the source's identity (the generation of every file that commits
   a save) and resuming after it changed is refused; a change during the copy is refused
   before the commit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import copy, restore, save
from ocdbt_py.checkpoint.convert import item as item_mod
from ocdbt_py.checkpoint.convert.journal import SourceChangedError
from ocdbt_py.errors import StorageError
from tests.security.conftest import SECRET


def _tree(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {f"a{i}": rng.standard_normal((64, 40)).astype(np.float32) for i in range(6)}


def _cp(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ocdbt_py.cli", "cp", *map(os.fspath, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("resume", [True, False])
def test_planted_tmp_link_is_refused(tmp_path: Path, outside: Path, resume: bool) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    save(src, _tree(0))
    (outside / "_METADATA").write_bytes(SECRET)
    os.symlink(outside, tmp_path / "dst.orbax-checkpoint-tmp")
    r = _cp(*(["--resume"] if resume else []), src, dst)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "dst.orbax-checkpoint-tmp is a symbolic link" in r.stderr
    assert (outside / "_METADATA").read_bytes() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == ["_METADATA", "victim"]
    assert not os.path.lexists(dst)


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_tmp_swapped_for_a_link_mid_copy(tmp_path: Path, outside: Path, use_ocdbt: bool) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    save(src, _tree(0))
    tmp = tmp_path / "dst.orbax-checkpoint-tmp"
    swapped: list[bool] = []

    def progress(done: int, total: int, unit: str) -> None:
        if not swapped:  # the journal is started: move the directory away, plant a link
            swapped.append(True)
            tmp.rename(tmp_path / "elsewhere")
            os.symlink(outside, tmp)

    with pytest.raises(StorageError, match="symbolic link"):
        copy(src, dst, use_ocdbt=use_ocdbt, workers=1, progress=progress)
    assert swapped and sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == SECRET
    assert not os.path.lexists(dst)


def _interrupted_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_ocdbt: bool) -> tuple[Path, Path]:
    monkeypatch.setattr(item_mod, "FLUSH_ARRAYS", 1)  # journal every array
    src, dst = tmp_path / "src", tmp_path / "dst"
    save(src, _tree(0), use_ocdbt=use_ocdbt)
    calls = [0]

    class Stop(Exception):
        pass

    def progress(done: int, total: int, unit: str) -> None:
        calls[0] += 1
        if calls[0] > 3:
            raise Stop

    with pytest.raises(Stop):
        copy(src, dst, workers=1, progress=progress)
    assert (tmp_path / "dst.orbax-checkpoint-tmp" / ".ocdbt-cp" / "source.json").exists()
    return src, dst


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_resume_after_the_source_was_resaved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             use_ocdbt: bool) -> None:
    src, dst = _interrupted_copy(tmp_path, monkeypatch, use_ocdbt)
    save(src, _tree(1), use_ocdbt=use_ocdbt, force=True)  # re-saved: same names, shapes and sizes
    with pytest.raises(SourceChangedError, match="source changed since the interrupted copy"):
        copy(src, dst, workers=1, resume=True)
    assert not dst.exists()
    r = _cp("--resume", src, dst)
    assert r.returncode == 1 and "source changed" in r.stderr, (r.stdout, r.stderr)
    copy(src, dst, workers=1, force=True)  # starting over is fine and gives the new arrays only
    got = restore(dst)
    for k, v in _tree(1).items():
        np.testing.assert_array_equal(got[k], v)


def test_resume_of_an_unchanged_source_still_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst = _interrupted_copy(tmp_path, monkeypatch, True)
    s = copy(src, dst, workers=1, resume=True)
    assert s["units"][0]["status"] == "resumed" and s["arrays_resumed"] > 0
    got = restore(dst)
    for k, v in _tree(0).items():
        np.testing.assert_array_equal(got[k], v)


def test_source_changed_during_the_copy(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    save(src, _tree(0), use_ocdbt=False)
    done: list[bool] = []

    def progress(n: int, total: int, unit: str) -> None:
        if n and not done:
            done.append(True)
            shutil.copy(src / "_METADATA", tmp_path / "m")
            os.replace(tmp_path / "m", src / "_METADATA")  # what a re-save does: a new file

    with pytest.raises(SourceChangedError, match="while it was being copied"):
        copy(src, dst, workers=1, progress=progress)
    assert done and not dst.exists()
