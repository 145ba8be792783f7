"""Checkpoints on object stores: ``checkpoint.save`` to S3, GCS and Azure URLs and
``checkpoint.restore`` back; restores of an Orbax-written checkpoint from each store; and a
4000-array restore behind 20 ms of injected latency that must stay within 50 round trips."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.testing.latency import LatencyStore
from tests.objectstores import servers

BUCKET = "ocdbt-ckpt"
_n = itertools.count()
SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "dense": {"kernel": rng.standard_normal((64, 32)).astype(np.float32), "bias": np.arange(32, dtype=np.int32)},
        "big": rng.standard_normal(300_000).astype(np.float32),  # > 1 MiB: spans data files
        "layers": [np.full((3,), i, np.float64) for i in range(20)],
        "step": 11,
    }


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want)
        for k in want:
            _assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    else:
        assert got == want


@pytest.fixture
def srv(request: pytest.FixtureRequest) -> Any:
    kind = request.param
    s: Any = request.getfixturevalue(f"{kind}_server")
    s.make_bucket(BUCKET)
    s.kind = kind
    return s


@pytest.mark.parametrize("srv", ["s3", "gcs", "azure"], indirect=True)
def test_save_and_restore(srv: Any) -> None:
    url = f"{SCHEMES[srv.kind]}://{BUCKET}/ck{next(_n)}"
    tree = _tree()
    checkpoint.save(url, tree, storage_options=srv.storage_options())
    _assert_same(checkpoint.restore(url, storage_options=srv.storage_options()), tree)
    md = checkpoint.metadata(url, storage_options=srv.storage_options())
    assert md is not None


@pytest.fixture(scope="module")
def orbax_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    ocp = pytest.importorskip("orbax.checkpoint")
    path = tmp_path_factory.mktemp("orbax") / "ck"
    tree = {f"w{i:03d}": np.arange(i, i + 50, dtype=np.float32) for i in range(40)}
    with ocp.StandardCheckpointer() as c:
        c.save(path, tree)
    return path, tree


@pytest.mark.parametrize("srv", ["s3", "gcs", "azure"], indirect=True)
def test_restore_orbax_checkpoint_from_store(srv: Any, orbax_checkpoint: tuple[Path, dict[str, Any]]) -> None:
    local, tree = orbax_checkpoint
    url = f"{SCHEMES[srv.kind]}://{BUCKET}/orbax{next(_n)}"
    store = open_kvstore(url, srv.storage_options())
    for f in sorted(local.rglob("*")):
        if f.is_file():
            store.set(f.relative_to(local).as_posix(), f.read_bytes())
    _assert_same(checkpoint.restore(url, storage_options=srv.storage_options()), tree)


@pytest.fixture(scope="module")
def ckpt_4000(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("c4000") / "ck"
    checkpoint.save(path, {f"layer{i:04d}": np.full(16, i, np.float32) for i in range(4000)})
    return path


def test_4000_array_restore_round_trips_over_latency(ckpt_4000: Path) -> None:
    """20 ms per request: the restore makes few requests, at most 50 of them in sequence."""
    from ocdbt_py.kvstore import LocalStore

    store = LatencyStore(LocalStore(ckpt_4000, read_only=True), delay=0.02)
    t = time.perf_counter()
    out = checkpoint.restore(store)
    elapsed = time.perf_counter() - t
    assert len(out) == 4000 and out["layer3999"][0] == 3999
    assert store.stats.depth <= 50, store.stats
    assert store.stats.requests <= 200, store.stats
    assert elapsed >= store.stats.depth * 0.02  # the delay really applied


def test_4000_array_restore_from_s3_behind_latency_proxy(s3_server: servers.S3Server, ckpt_4000: Path,
                                                        s3_proxy: Any) -> None:
    """The same on the wire: the S3 server behind a 20 ms proxy, every HTTP request counted."""
    s3_server.make_bucket(BUCKET)
    url = f"s3://{BUCKET}/c4000-{next(_n)}"
    store = open_kvstore(url, s3_server.storage_options())
    for f in sorted(ckpt_4000.rglob("*")):
        if f.is_file():
            store.set(f.relative_to(ckpt_4000).as_posix(), f.read_bytes())
    proxy = s3_proxy(0.02)
    opts = dict(s3_server.storage_options(), endpoint_url=proxy.endpoint)
    proxy.reset()
    out = checkpoint.restore(url, storage_options=opts)
    stats = proxy.stats()
    assert len(out) == 4000 and out["layer0007"][3] == 7
    assert stats["depth"] <= 50, stats
    assert stats["requests"] <= 200, stats
