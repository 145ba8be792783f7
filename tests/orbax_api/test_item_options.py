"""Handler options per item: each item of a step saved with its own ``use_ocdbt``,
``use_zarr3``, ``use_compression`` (Orbax gives each item its own handler), checked on disk and
restored by Orbax itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ocdbt_py
import ocdbt_py.orbax as ocp
from ocdbt_py.checkpoint import JsonItem, restore, save

STATE = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": {"x": np.full(5, 2, np.int16)}}
EMA = {"w": np.linspace(0, 1, 12, dtype=np.float64).reshape(3, 4), "step": np.int64(7)}


def _layout(item: Path) -> dict[str, Any]:
    """What the item directory holds: OCDBT or per-parameter files, Zarr version, compressor."""
    meta = json.loads((item / "_METADATA").read_text())
    out: dict[str, Any] = {"ocdbt": (item / "manifest.ocdbt").exists(), "use_ocdbt": meta["use_ocdbt"],
                           "use_zarr3": meta["use_zarr3"]}
    if not out["ocdbt"]:
        w = item / "w"
        out["zarr"] = 3 if (w / "zarr.json").exists() else 2 if (w / ".zarray").exists() else None
    return out


def _same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert sorted(got) == sorted(want)
        for k in want:
            _same(got[k], want[k])
    else:
        g, w = np.asarray(got), np.asarray(want)
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()


def _orbax_restores(step_dir: Path) -> None:
    """Orbax (the real one) reads each item back as saved."""
    real = pytest.importorskip("orbax.checkpoint")
    with real.PyTreeCheckpointer() as c:
        _same(c.restore(step_dir / "state"), STATE)
        _same(c.restore(step_dir / "ema"), EMA)


def test_native_item_options(tmp_path: Path) -> None:
    step = tmp_path / "run" / "5"
    save(step, {"state": STATE, "ema": EMA, "meta": JsonItem({"lr": 0.1})}, composite=True,
         item_options={"ema": {"use_ocdbt": False, "use_zarr3": True}, "state": {"use_compression": False}})
    assert _layout(step / "state") == {"ocdbt": True, "use_ocdbt": True, "use_zarr3": False}
    assert _layout(step / "ema") == {"ocdbt": False, "use_ocdbt": False, "use_zarr3": True, "zarr": 3}
    # the state item is uncompressed Zarr v2 inside OCDBT; the default stays compressed elsewhere
    with ocdbt_py.open(step / "state") as db:
        assert json.loads(db[b"w/.zarray"])["compressor"] is None
    save(tmp_path / "plain", {"state": STATE}, composite=True)
    with ocdbt_py.open(tmp_path / "plain" / "state") as db:
        assert json.loads(db[b"w/.zarray"])["compressor"]["id"] == "zstd"
    got = restore(tmp_path / "run")
    _same(got["state"], STATE)
    _same(got["ema"], EMA)
    assert got["meta"] == {"lr": 0.1}
    _orbax_restores(step)


def test_orbax_api_handlers_per_item(tmp_path: Path) -> None:
    """``ocdbt_py.orbax``: a manager whose items have different handler options, as in Orbax."""
    root = tmp_path / "run"
    with ocp.CheckpointManager(root, item_names=("state", "ema"), item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            "ema": ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=True)}) as mgr:
        mgr.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(STATE), ema=ocp.args.PyTreeSave(EMA)))
        mgr.wait_until_finished()
        back = mgr.restore(3)
    _same(back.state, STATE)
    _same(back.ema, EMA)
    assert _layout(root / "3" / "state")["ocdbt"] is True
    assert _layout(root / "3" / "ema") == {"ocdbt": False, "use_ocdbt": False, "use_zarr3": True, "zarr": 3}
    _orbax_restores(root / "3")


def test_pytree_checkpointer_without_ocdbt(tmp_path: Path) -> None:
    with ocp.PyTreeCheckpointer(use_ocdbt=False) as c:
        c.save(tmp_path / "ck", STATE)
    assert _layout(tmp_path / "ck") == {"ocdbt": False, "use_ocdbt": False, "use_zarr3": False, "zarr": 2}
    real = pytest.importorskip("orbax.checkpoint")
    with real.PyTreeCheckpointer() as rc:
        _same(rc.restore(tmp_path / "ck"), STATE)


@pytest.mark.parametrize("bad, match", [
    ({"nope": {"use_zarr3": True}}, "not an item"),
    ({"state": {"colour": "red"}}, "unknown item_options"),
    ({"meta": {"use_zarr3": True}}, "JSON item"),
    ({"state": {"checksum": True, "use_compression": False}}, "checksum"),
    ({"state": {"ocdbt_target_data_file_size": -1}}, "ocdbt_target_data_file_size"),
])
def test_bad_item_options(tmp_path: Path, bad: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        save(tmp_path / "ck", {"state": STATE, "meta": JsonItem({})}, composite=True, item_options=bad)
    assert not (tmp_path / "ck").exists()


def test_item_options_need_a_composite_save(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="composite"):
        save(tmp_path / "ck", STATE, item_options={"state": {"use_zarr3": True}})
    with pytest.raises(TypeError):
        save(tmp_path / "ck", {"state": STATE}, composite=True, item_options={"state": ["use_zarr3"]})  # type: ignore[dict-item]
