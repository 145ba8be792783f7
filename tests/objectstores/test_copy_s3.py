"""``checkpoint.copy`` / ``ocdbt cp`` to and from S3 (moto): commit-file mode on the way in,
and the copy brought back to disk is restored by Orbax."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import JsonItem, copy, restore, save
from ocdbt_py.kvstore import open_kvstore
from tests.objectstores import servers

BUCKET = "ocdbt-copy"
_n = itertools.count()


@pytest.fixture(scope="module")
def s3(s3_server: servers.S3Server) -> dict[str, Any]:
    s3_server.make_bucket(BUCKET)
    return s3_server.storage_options()


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    return {"w": rng.standard_normal((200, 96)).astype(np.float32), "b": np.arange(96, dtype=np.int64),
            "layers": [np.full((33,), i, np.float64) for i in range(3)], "step": 4, "name": "s3"}


def _same(got: Any, want: Any) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v)
        elif isinstance(v, list):
            for a, b in zip(got[k], v):
                assert np.array_equal(a, b)
        else:
            assert got[k] == v


def test_copy_to_s3_and_back(s3: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "root"
    for step in (1, 2):
        save(root / str(step), {"state": _tree(), "meta": JsonItem({"step": step})}, composite=True,
             use_ocdbt=False)
    url = f"s3://{BUCKET}/cp{next(_n)}"
    s = copy(root, url, use_ocdbt=True, use_zarr3=True, chunk_byte_size=8192, ocdbt_target_data_file_size=32768,
             dst_storage_options=s3, verify=True, workers=4)
    assert [u["status"] for u in s["units"]] == ["copied", "copied"]
    kv = open_kvstore(url, s3)
    keys = set(kv.list(""))
    assert {"1/commit_success.txt", "2/commit_success.txt", "2/state/commit_success.txt",
            "2/state/manifest.ocdbt", "2/meta/metadata", "2/_CHECKPOINT_METADATA"} <= keys
    assert not any(k.split("/")[1] == ".ocdbt-cp" for k in keys if k.count("/") >= 1)
    data = [k for k in keys if k.startswith("2/state/ocdbt.process_0/d/")]
    assert len(data) > 2  # 32 KiB data files
    got = restore(url, storage_options=s3)
    _same(got["state"], _tree())
    assert got["meta"] == {"step": 2}
    # resuming a finished copy skips every step
    again = copy(root, url, dst_storage_options=s3, resume=True)
    assert [u["status"] for u in again["units"]] == ["skipped", "skipped"]
    # and back to disk, into the per-parameter layout: Orbax restores it
    back = tmp_path / "back"
    copy(url, back, storage_options=s3, use_ocdbt=False, use_zarr3=False, steps=[2], verify=True)
    _same(restore(back / "2" / "state"), _tree())
    if all(importlib.util.find_spec(m) for m in ("jax", "orbax.checkpoint")):
        from tests.checkpoint_convert.conftest import run_worker

        report = run_worker([{"name": "back", "kind": "manager", "path": str(back), "steps": [2],
                              "src": str(root), "items": ["state", "meta"]}], tmp_path)
        assert report["back"]["errors"] == []


def test_cli_cp_to_s3(s3: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ocdbt_py.cli import main

    src = tmp_path / "src"
    save(src, _tree())
    url = f"s3://{BUCKET}/cli{next(_n)}"
    opts = [f"{k}={v}" if not isinstance(v, dict) else f'{k}={__import__("json").dumps(v)}' for k, v in s3.items()]
    argv = ["cp", str(src), url, "--no-ocdbt", "--quiet"]
    for o in opts:
        argv += ["--dst-storage-option", o]
    assert main(argv) == 0
    _same(restore(url, storage_options=s3), _tree())
    assert main(argv) == 1  # exists
    assert "--force" in capsys.readouterr().err
