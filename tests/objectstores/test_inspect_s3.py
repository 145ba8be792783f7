"""``stats``, ``diff``, ``du`` and ``report`` on checkpoints in S3 (moto on 127.0.0.1), through
the Python API and the ``ocdbt`` command with ``-S`` storage options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.inspect import diff, du, report, stats
from tests.cli.conftest import cli  # noqa: F401  (the in-process ``ocdbt`` runner)
from tests.inspect.conftest import assert_stats_match, planted_tree
from tests.objectstores import servers

BUCKET = "ocdbt-inspect"


@pytest.fixture(scope="module")
def s3(s3_server: servers.S3Server) -> tuple[servers.S3Server, dict[str, Any]]:
    s3_server.make_bucket(BUCKET)
    return s3_server, s3_server.storage_options()


@pytest.fixture(scope="module")
def uploaded(s3: tuple[servers.S3Server, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, Path, Any]:
    """The same planted tree saved to S3 (zarr v3) and locally (zarr v2)."""
    _, opts = s3
    tree = planted_tree(seed=4)
    url = f"s3://{BUCKET}/planted"
    checkpoint.save(url, tree, chunk_byte_size=2048, use_zarr3=True, storage_options=opts)
    local = tmp_path_factory.mktemp("local") / "c"
    checkpoint.save(local, tree, chunk_byte_size=2048)
    return url, local, tree


def _opts_args(opts: dict[str, Any]) -> list[str]:
    return [a for k, v in opts.items() for a in ("-S", f"{k}={json.dumps(v)}")]


def test_stats_du_on_s3(s3: Any, uploaded: tuple[str, Path, Any]) -> None:
    _, opts = s3
    url, _, tree = uploaded
    assert_stats_match({k: v.to_json() for k, v in stats(url, storage_options=opts).items()}, tree)
    u = du(url, storage_options=opts)
    assert all(x.stored_bytes for x in u.tensors.values())
    assert u.data_files and sum(u.data_files.values()) >= u.total.stored_bytes  # type: ignore[operator]


def test_diff_across_stores_and_an_edit_on_s3(s3: Any, uploaded: tuple[str, Path, Any]) -> None:
    _, opts = s3
    url, local, tree = uploaded
    res = diff(local, url, storage_options_b=opts)
    assert res.equal, res.changed
    same = diff(url, url, storage_options_a=opts, storage_options_b=opts)
    assert same.equal
    edited = {"params": tree["params"], "clean": tree["clean"].copy(), "step": 6}
    edited["clean"][3, 3] = -100.0
    url2 = f"s3://{BUCKET}/edited"
    checkpoint.save(url2, edited, chunk_byte_size=2048, use_zarr3=True, storage_options=opts)
    res = diff(url, url2, storage_options_a=opts, storage_options_b=opts)
    assert set(res.changed) == {"clean", "step"}
    c = res.changed["clean"]
    assert c["n_diff"] == 1 and c["chunks"] - c["chunks_same_bytes"] == 1
    assert c["max_abs_diff"] == pytest.approx(abs(-100.0 - float(tree["clean"][3, 3])))


def test_cli_on_s3(cli: Any, s3: Any, uploaded: tuple[str, Path, Any], tmp_path: Path) -> None:  # noqa: F811
    _, opts = s3
    url, local, tree = uploaded
    o = _opts_args(opts)
    r = cli("stats", "--json", url, *o)
    assert r.status == 0, r.err
    assert_stats_match(json.loads(r.out), tree)
    r = cli("du", "--json", url, *o)
    assert r.status == 0 and json.loads(r.out)["clean"]["logical_bytes"] == tree["clean"].nbytes
    r = cli("diff", local, url, *o)  # -S applies to both; the local path ignores what it does not use
    assert r.status == 0, r.err
    out = tmp_path / "s3.html"
    r = cli("report", url, "-o", out, *o)
    assert r.status == 0, r.err
    page = out.read_text("utf-8")
    assert 'id="tree"' in page and "params.float32" in page


def test_report_api_on_s3(s3: Any, uploaded: tuple[str, Path, Any], tmp_path: Path) -> None:
    _, opts = s3
    url, _, tree = uploaded
    data = report(url, tmp_path / "r.html", storage_options=opts)
    assert data.stats["clean"].histogram is not None
    assert sum(data.stats["clean"].histogram) == tree["clean"].size
    assert np.isclose(data.stats["clean"].mean or 0.0, float(tree["clean"].astype(np.float64).mean()))
