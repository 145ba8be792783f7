"""The fixed start of a checkpoint restore from S3, counted on the wire: the small files read
first (``_CHECKPOINT_METADATA``, ``_METADATA``, ``manifest.ocdbt``) arrive in one round trip
together with the directory listing, and the B+tree root is fetched while ``_METADATA`` is
parsed (``ObjectStore.read_ahead``).  A latency proxy in front of the S3 server counts every
request and how many were made one after another (``depth``)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.object_store import ObjectStore
from ocdbt_py.kvstore.obstore_store import ObstoreStore
from ocdbt_py.kvstore.prefixed import PrefixStore
from tests.objectstores import servers
from tests.objectstores.latency_proxy import ProxyHandle

BUCKET = "ocdbt-round-trips"
DELAY = 0.02
_n = itertools.count()


@pytest.fixture(scope="module")
def proxy(s3_server: servers.S3Server, s3_proxy: Any) -> ProxyHandle:
    s3_server.make_bucket(BUCKET)
    return s3_proxy(DELAY)  # type: ignore[no-any-return]


@pytest.fixture(autouse=True, params=["obstore", "fsspec"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both routes of ``s3://`` URLs."""
    monkeypatch.setenv("OCDBT_PY_BACKEND", request.param)
    return str(request.param)


def _s3(url: str, opts: dict[str, Any]) -> Any:
    store = open_kvstore(url, opts)
    assert isinstance(store, (ObjectStore, ObstoreStore))
    return store


def _opts(srv: servers.S3Server, proxy: ProxyHandle | None = None) -> dict[str, Any]:
    opts = srv.storage_options()
    return opts if proxy is None else dict(opts, endpoint_url=proxy.endpoint)


def _tree(n: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"params": {f"w{i:03d}": rng.standard_normal(300).astype(np.float32) for i in range(n)},
            "step": 7, "name": "run"}


def _equal(got: Any, want: Any) -> None:
    assert got["step"] == want["step"] and got["name"] == want["name"]
    assert set(got["params"]) == set(want["params"])
    for k, v in want["params"].items():
        np.testing.assert_array_equal(got["params"][k], v, err_msg=k)


# -- ObjectStore.read_ahead ------------------------------------------------------------------------

def test_read_ahead_answers_each_covered_read_once(s3_server: servers.S3Server, proxy: ProxyHandle) -> None:
    store = _s3(f"s3://{BUCKET}/ra{next(_n)}", _opts(s3_server, proxy))
    blob = bytes(range(256)) * 40  # 10240 bytes
    store.set("small", b"hello world")
    store.set("blob", blob)
    assert PrefixStore(store, "x").supports_read_ahead
    proxy.reset()
    store.start_read_ahead([("small", (0, 1 << 20)), ("absent", (0, 100)), ("blob", (1000, 3000))]).result(timeout=60)
    stats = proxy.stats()
    assert stats["requests"] == 3 and stats["depth"] == 1, stats  # all three at once
    proxy.reset()
    assert store.get("small", (2, 5)) == b"llo"  # whole object known: any range
    assert store.get("absent", (0, 10)) is None
    assert store.get("blob", (1500, 2500)) == blob[1500:2500]  # inside the range read ahead
    assert proxy.stats()["requests"] == 0
    # each read ahead answers once; later reads go to the server again
    assert store.get("small") == b"hello world"
    assert store.get("absent") is None
    assert proxy.stats()["requests"] == 2


def test_read_ahead_never_answers_what_it_does_not_cover(s3_server: servers.S3Server) -> None:
    store = _s3(f"s3://{BUCKET}/rb{next(_n)}", _opts(s3_server))
    blob = bytes(range(256)) * 40
    store.set("blob", blob)
    store.set("exact", b"0123456789")
    store.start_read_ahead([("blob", (1000, 3000)), ("exact", (0, 10))]).result(timeout=60)
    assert store.get("blob", (500, 1500)) == blob[500:1500]  # starts before: read from the server
    store.start_read_ahead([("blob", (1000, 3000))]).result(timeout=60)
    assert store.get("blob") == blob  # the whole object: not known from a middle range
    # exactly as long as the range read ahead: it may be longer, so only ranges inside count
    assert store.get("exact", (0, 20)) == b"0123456789"
    store.start_read_ahead([("exact", (0, 10))]).result(timeout=60)
    assert store.get("exact", (-3, None)) == b"789"
    store.start_read_ahead([("blob", (0, 1 << 20))]).result(timeout=60)
    assert store.get("blob", (-5, None)) == blob[-5:]  # whole: suffixes too
    with pytest.raises(ValueError):
        store.start_read_ahead([("blob", (10, 10))])


def test_writes_and_deletes_drop_what_was_read_ahead(s3_server: servers.S3Server,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = _s3(f"s3://{BUCKET}/rc{next(_n)}", _opts(s3_server))
    store.set("a", b"old")
    store.set("b", b"old")
    store.set("c", b"old")
    store.start_read_ahead([("a", (0, 100)), ("b", (0, 100))]).result(timeout=60)
    store.set("a", b"new")
    store.delete("b")
    assert store.get("a") == b"new" and store.get("b") is None
    monkeypatch.setattr(type(store), "ahead_seconds", -1.0)  # expired at once
    store.start_read_ahead([("c", (0, 100))]).result(timeout=60)
    store.set("c", b"newer")  # written by another client: the store cannot know
    assert store.get("c") == b"newer"  # expired: read again


def test_read_ahead_helper_sees_through_prefix_views(s3_server: servers.S3Server, proxy: ProxyHandle) -> None:
    store = open_kvstore(f"s3://{BUCKET}/rd{next(_n)}", _opts(s3_server, proxy))
    store.set("dir/f", b"x" * 50)
    view = PrefixStore(store, "dir")
    assert view.read_ahead([("f", (0, 100))])
    proxy.reset()
    assert view.get("f", (0, 100)) == b"x" * 50
    assert proxy.stats()["requests"] <= 1  # the read ahead itself, if it had not arrived yet
    assert not view.read_ahead([("../escape", (0, 10))])  # refused keys: nothing started
    from ocdbt_py.kvstore import MemoryStore

    assert not MemoryStore().read_ahead([("f", (0, 10))])


# -- restores ------------------------------------------------------------------------------------

def test_item_restore_takes_three_round_trips_before_its_data(s3_server: servers.S3Server,
                                                             proxy: ProxyHandle) -> None:
    """Listing + first files (1), B+tree root (2), chunks (3): was 6 one after another."""
    tree = _tree(300, 1)
    url = f"s3://{BUCKET}/item{next(_n)}"
    checkpoint.save(url, tree, storage_options=_opts(s3_server))
    proxy.reset()
    out = checkpoint.restore(url, storage_options=_opts(s3_server, proxy))
    stats = proxy.stats()
    _equal(out, tree)
    assert stats["depth"] <= 4, stats
    assert stats["requests"] <= 10, stats


def test_manager_root_restore_round_trips(s3_server: servers.S3Server, proxy: ProxyHandle) -> None:
    """A CheckpointManager root with two steps of two items: the item directories are listed
    (and their first files fetched) concurrently, not one after another."""
    root = f"s3://{BUCKET}/root{next(_n)}"
    trees = {s: {"state": _tree(40, s), "extra": _tree(5, 10 + s)} for s in (1, 2)}
    from ocdbt_py.checkpoint.manager import CheckpointManager

    with CheckpointManager(root, storage_options=_opts(s3_server), async_save=False) as mgr:
        for s, t in trees.items():
            mgr.save(s, t, force=True)
    proxy.reset()
    out = checkpoint.restore(root, storage_options=_opts(s3_server, proxy))
    stats = proxy.stats()
    assert set(out) == {"state", "extra"}
    _equal(out["state"], trees[2]["state"])
    _equal(out["extra"], trees[2]["extra"])
    # root listing + files (1), both commit markers at once (2), step listing + files (3),
    # both item listings + files (4), then per item (restored one after the other) B+tree
    # root and data: 8 (was 12, with the root listed twice and one request per marker); on a
    # loaded machine a listing thread can start after another request has finished, which
    # the proxy counts as one more level
    assert stats["depth"] <= 10, stats
    assert stats["by_method"].get("HEAD", 0) == 2, stats
