"""Checkpoints written by older Orbax releases (committed fixtures) restore as those releases did.

The fixtures were written by ``gen_legacy_fixtures.py`` with Orbax 0.5.10 (msgpack
``checkpoint`` file with placeholders and inline aggregated values, shards with several inner
chunks, no commit markers), 0.9.1 and 0.11.5, each with the JAX of its time; the expected
values are those releases' own restores.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from ocdbt_py import checkpoint

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _expected import compare, load_expected  # noqa: E402

FIXTURES = HERE.parent / "fixtures" / "checkpoint"
VERSIONS = sorted(p.name for p in FIXTURES.glob("orbax-*") if (p / "corpus.json").exists())


def _cases() -> list[tuple[str, str]]:
    out = []
    for v in VERSIONS:
        info = json.loads((FIXTURES / v / "corpus.json").read_text())
        out += [(v, name) for name in info["cases"]]
    return out


def test_fixture_versions_present() -> None:
    assert {"orbax-0.5.10", "orbax-0.9.1", "orbax-0.11.5"} <= set(VERSIONS)


@pytest.mark.parametrize(("version", "case"), _cases())
def test_restore_matches_that_orbax(version: str, case: str) -> None:
    root = FIXTURES / version
    info = json.loads((root / "corpus.json").read_text())["cases"][case]
    expected = load_expected(str(root / info["expected"]))["tree"]
    got = checkpoint.restore(root / info["path"])
    assert compare(expected, got) == []
    lazy = checkpoint.restore(root / info["path"], lazy=True)
    md = checkpoint.metadata(root / info["path"])
    assert isinstance(md, dict) and isinstance(lazy, dict)


def test_orbax05_msgpack_inline_values() -> None:
    root = FIXTURES / "orbax-0.5.10" / "ckpt"
    agg = checkpoint.restore(root / "aggregate")
    # aggregated leaves come from the msgpack file, with the types Orbax 0.5 gave them
    assert agg["step"] == 7 and type(agg["step"]) is int
    assert agg["name"] == "legacy"
    assert isinstance(agg["np_arr"], np.ndarray) and agg["np_arr"].tolist() == [0.0, 1.0, 2.0]
    md = checkpoint.metadata(root / "aggregate")
    assert md["step"].kind == "inline" and md["step"].value == 7
    assert md["params"]["kernel"].kind == "array"
    no_meta = checkpoint.restore(root / "aggregate_no_metadata")
    assert set(no_meta) == set(agg)


def test_orbax05_inner_chunks_smaller_than_shards() -> None:
    md = checkpoint.metadata(FIXTURES / "orbax-0.5.10" / "ckpt" / "pytree_zarr3")
    kernel = md["params"]["kernel"]
    assert kernel.chunks == (1, 2)  # inner chunk; the shard (grid chunk) is (1, 4)
    got = checkpoint.restore(FIXTURES / "orbax-0.5.10" / "ckpt" / "pytree_zarr3", lazy=True)
    np.testing.assert_array_equal(got["params"]["kernel"][1:3, 3:6],
                                  (np.arange(32, dtype=np.float32).reshape(4, 8) / 4)[1:3, 3:6])


def test_orbax05_manager_without_commit_markers() -> None:
    root = FIXTURES / "orbax-0.5.10" / "ckpt" / "manager"
    assert not any(p.name == "commit_success.txt" for p in root.rglob("*"))
    steps = checkpoint.list_steps(root)
    assert [s.step for s in steps] == [2, 3] and not any(s.committed for s in steps)
    assert os.path.isdir(root / "3" / "state")
