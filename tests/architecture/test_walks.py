"""Issue 28's walks, measured by ``bench/walk.py`` (a call trace with ``sys.setprofile``), kept
from growing: how many functions a restore's path and a save's tree pass through, and how
often they come back to a file already left.  Saving starts threads one way only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import walk  # noqa: E402  (the measuring script)

#: (stops, returns) at most, per walk.  Before issue 28 (same measure): restore of an item
#: 30 / 7, of a step 35 / 15, of a manager root 39 / 18; save 16 / 2 (blocking, async) and
#: 19 / 2 (CheckpointManager).  Issue 28 asks for at most 30 stops and 15 returns for every
#: walk; these are the figures its restore (settled once by ``restore/location.locate``) reached.
#: Lower them when a change lowers the figures.
LIMITS = {
    "restore item": (20, 3),
    "restore step": (26, 8),
    "restore root": (29, 11),
    "save blocking": (16, 2),
    "save async": (16, 2),
    "save manager": (19, 2),
}


@pytest.fixture(scope="module")
def figures() -> dict[str, dict[str, Any]]:
    return walk.measure()


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_walk_stays_short(figures: dict[str, dict[str, Any]], name: str) -> None:
    stops, returns = LIMITS[name]
    got = figures[name]
    assert got["stops"] <= stops and got["returns"] <= returns, (
        f"{name}: {got['stops']} stops, {got['returns']} returns "
        f"(limits {stops}, {returns}); stops in order:\n" + "\n".join(got["stop_list"]))


def test_the_tracer_sees_a_path_handed_around(tmp_path: Path) -> None:
    """The measure can fail: a function handed a store under the path is a stop, a return
    to a file is counted."""
    from ocdbt_py.kvstore import open_kvstore

    kv = open_kvstore(str(tmp_path))
    match = walk._is_location(str(tmp_path), None)
    assert match(kv, "ocdbt_py/checkpoint/x.py") and match(str(tmp_path / "a"), "ocdbt_py/checkpoint/x.py")
    assert not match(str(tmp_path / "a"), "ocdbt_py/kvstore/local.py") and not match("params", "x.py")
    f = walk.figures([("a.py", 1, "f"), ("b.py", 1, "g"), ("a.py", 2, "h"), ("a.py", 3, "i"), ("b.py", 1, "g")])
    assert f["returns"] == 2


def test_saving_starts_threads_one_way() -> None:
    """``threading.Thread`` is started in one module of ``checkpoint/saving`` and
    ``checkpoint/manager`` (async_save's ``Background``: a non-blocking save, the fsync of the
    data files, a manager's wait for a commit and its retention)."""
    starters = []
    for sub in ("saving", "manager"):
        for path in sorted((ROOT / "ocdbt_py" / "checkpoint" / sub).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("threading.Thread", "Timer")):
                    starters.append(path.name)
    assert sorted(set(starters)) == ["async_save.py"]
