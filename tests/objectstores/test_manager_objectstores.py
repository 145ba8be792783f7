"""``CheckpointManager`` on object stores: S3 (moto), GCS (fake-gcs-server), Azure (azurite)
and fsspec's ``memory://``.

* the lifecycle: sync and async saves with retention, listing, exact restores, deletion, and a
  fresh manager seeing the same;
* interrupted saves (a step written in place without its ``commit_success.txt``, a temporary
  directory, and a real subprocess killed in the middle of a save): never listed by us (nor
  by Orbax's own manager on GCS), and removed by the cleanup of the next manager opened.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint import JsonItem
from ocdbt_py.checkpoint.manager import BestN, CheckpointManager, KeepAnyOf, LatestN
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.testing.faults import KILL_STATUS, WRITE_OPS, FaultyStore, InjectedFault

REPO = Path(__file__).resolve().parents[2]
BUCKET = "ocdbt-manager"
SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}
_n = itertools.count()
LOSSES = [3.0, 0.5, 2.0, 4.0, 1.0, 5.0]


def _params(step: int) -> dict[str, Any]:
    rng = np.random.default_rng(step)
    return {
        "w": rng.standard_normal((48, 40)).astype(np.float32),  # 7.5 KiB: out of line
        "b": np.arange(8, dtype=np.int64) * step,
        "layers": [np.full((3,), step + i, np.float64) for i in range(3)],
    }


def _items(step: int) -> dict[str, Any]:
    return {"params": _params(step), "config": JsonItem({"step": step, "name": f"s{step}"})}


def _assert_step(got: Any, step: int, *, metrics: bool = True) -> None:
    want = _params(step)
    assert set(got) == {"params", "config"} | ({"metrics"} if metrics else set())
    assert got["config"] == {"step": step, "name": f"s{step}"}
    if metrics:
        assert got["metrics"] == {"loss": LOSSES[step]}
    p = got["params"]
    for k in ("w", "b"):
        assert isinstance(p[k], np.ndarray) and p[k].dtype == want[k].dtype
        np.testing.assert_array_equal(p[k], want[k])
    assert len(p["layers"]) == 3
    for g, w in zip(p["layers"], want["layers"]):
        assert g.dtype == w.dtype and np.array_equal(g, w)


class Where:
    """A fresh root URL on one backend, and its storage options."""

    def __init__(self, kind: str, url: str, options: dict[str, Any] | None, server: Any = None):
        self.kind = kind
        self.url = url
        self.options = options
        self.server = server

    def kv(self) -> KvStore:
        return open_kvstore(self.url, self.options)

    def manager(self, **kw: Any) -> CheckpointManager:
        return CheckpointManager(self.url, storage_options=self.options, **kw)

    def list_keys(self, prefix: str = "") -> list[str]:
        return sorted(self.kv().list(prefix))

    def step_dirs(self) -> list[str]:
        dirs, _ = self.kv().list_dir("")
        return sorted(dirs)


@pytest.fixture(params=["s3", "gcs", "azure", "memory"])
def where(request: pytest.FixtureRequest) -> Where:
    kind = request.param
    if kind == "memory":
        return Where(kind, f"memory://manager-{os.getpid()}-{next(_n)}", None)
    srv: Any = request.getfixturevalue(f"{kind}_server")
    srv.make_bucket(BUCKET)
    return Where(kind, f"{SCHEMES[kind]}://{BUCKET}/mgr{next(_n)}", srv.storage_options(), srv)


def test_lifecycle_with_retention(where: Where) -> None:
    """Sync saves with LatestN(2) + BestN(1): the best step survives, the others go."""
    keep = KeepAnyOf(LatestN(2), BestN(1, "loss", "min"))
    with where.manager(preservation=keep, async_save=False) as mgr:
        for step in range(5):
            assert mgr.save(step, _items(step), metrics={"loss": LOSSES[step]})
            assert mgr.all_steps()[-1] == step  # sync: committed when save returns
        assert mgr.all_steps() == [1, 3, 4]
        assert mgr.latest_step() == 4 and mgr.best_step() == 1
        assert not mgr.save(2, _items(2))  # older than the latest step: skipped (as Orbax)
        for step in mgr.all_steps():
            _assert_step(mgr.restore(step), step)
            assert mgr.metrics(step) == {"loss": LOSSES[step]}
    assert where.step_dirs() == ["1", "3", "4"]  # deleted steps left no keys behind
    assert all(k.split("/", 1)[0] in {"1", "3", "4"} for k in where.list_keys())
    for step in (1, 3, 4):
        assert f"{step}/commit_success.txt" in where.list_keys(f"{step}/")
    with where.manager(preservation=keep) as mgr:  # a new manager sees the same
        assert mgr.all_steps() == [1, 3, 4] and mgr.best_step() == 1
        mgr.delete(3)
        assert mgr.all_steps() == [1, 4]
        _assert_step(mgr.restore(), 4)
        _assert_step({"params": mgr.restore(1, items="params"), "config": mgr.restore(1, items="config"),
                      "metrics": mgr.metrics(1)}, 1)
    assert where.step_dirs() == ["1", "4"]
    with where.manager(read_only=True) as mgr:
        assert mgr.all_steps() == [1, 4]
        md = mgr.item_metadata(4, "params")
        assert md is not None


def test_async_saves(where: Where) -> None:
    """Async saves return before their commit; wait_until_finished commits and prunes."""
    with where.manager(preservation=LatestN(2), step_prefix="ckpt", step_format_fixed_length=4) as mgr:
        for step in range(4):
            assert mgr.save(step, _items(step), metrics={"loss": LOSSES[step]})
        mgr.wait_until_finished()
        assert not mgr.is_saving_in_progress()
        assert mgr.all_steps() == [2, 3]
        for step in (2, 3):
            _assert_step(mgr.restore(step), step)
    assert where.step_dirs() == ["ckpt_0002", "ckpt_0003"]
    with where.manager(read_only=True, step_prefix="ckpt", step_format_fixed_length=4) as mgr:
        assert mgr.all_steps() == [2, 3]
        _assert_step(mgr.restore(), 3)


def _copy_without_marker(kv: KvStore, src: str, dst: str) -> None:
    """A save interrupted after writing everything but the step's commit marker."""
    for k in kv.list(src + "/"):
        if k != f"{src}/commit_success.txt":
            value = kv.get(k)
            assert value is not None
            kv.set(dst + k[len(src):], value)


def test_partial_steps_never_listed_and_cleaned_up(where: Where) -> None:
    with where.manager(async_save=False) as mgr:
        for step in (0, 1):
            mgr.save(step, _items(step), metrics={"loss": LOSSES[step]})
    kv = where.kv()
    _copy_without_marker(kv, "1", "2")  # everything but the marker
    kv.set("3/_CHECKPOINT_METADATA", b'{"item_handlers": {}}')  # just begun
    kv.set("3/params/ocdbt.process_0/d/abc", b"x" * 100)
    _copy_without_marker(kv, "1", "4.orbax-checkpoint-tmp")  # a temporary directory
    kv.set("notes/readme.txt", b"not a step")  # not ours: left alone
    assert where.step_dirs() == ["0", "1", "2", "3", "4.orbax-checkpoint-tmp", "notes"]
    with where.manager(read_only=True) as mgr:
        assert mgr.all_steps() == [0, 1] and mgr.latest_step() == 1
    with where.manager(cleanup=False) as mgr:
        assert mgr.all_steps() == [0, 1]
    assert "2" in where.step_dirs()  # cleanup=False: left alone
    with where.manager() as mgr:  # cleanup on open
        assert mgr.all_steps() == [0, 1]
        assert where.step_dirs() == ["0", "1", "notes"]
        assert where.list_keys("2/") == [] and where.list_keys("3/") == []
        assert mgr.save(2, _items(2), metrics={"loss": LOSSES[2]})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 1, 2]
        _assert_step(mgr.restore(2), 2)
    assert where.list_keys("notes/") == ["notes/readme.txt"]


def test_failed_save_leaves_nothing_listed(where: Where) -> None:
    """A save failing half-way (injected storage error) is reported and not listed."""
    with where.manager(async_save=False) as mgr:
        mgr.save(0, _items(0), metrics={"loss": LOSSES[0]})
    probe = FaultyStore(where.kv(), ops=WRITE_OPS)
    with CheckpointManager(probe, async_save=False) as mgr:
        mgr.save(1, _items(1))
    n = len(probe.log)
    assert n > 5
    with where.manager(async_save=False) as mgr:
        mgr.delete(1)
    for fail_at in sorted({1, n // 2, n - 1}):  # the last write is the step's commit marker
        faulty = FaultyStore(where.kv(), fail_at=fail_at, ops=WRITE_OPS)
        mgr = CheckpointManager(faulty, async_save=True)
        mgr.save(1, _items(1))
        with pytest.raises(InjectedFault):
            mgr.wait_until_finished()
        assert mgr.all_steps() == [0]
        mgr.close()
        with where.manager(read_only=True) as ro:
            assert ro.all_steps() == [0]
        with where.manager() as rw:
            assert rw.all_steps() == [0] and where.step_dirs() == ["0"]


_KILL_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from ocdbt_py.checkpoint import JsonItem
    from ocdbt_py.checkpoint.manager import CheckpointManager
    from ocdbt_py.testing.faults import FaultyStore, WRITE_OPS
    from ocdbt_py.kvstore import open_kvstore
    url, opts, fail_at = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    store = FaultyStore(open_kvstore(url, opts), fail_at=fail_at, action="kill", ops=WRITE_OPS)
    mgr = CheckpointManager(store, async_save=True)
    big = {"w": np.arange(600_000, dtype=np.float32), "c": JsonItem({"x": 1})}
    mgr.save(mgr.latest_step() + 1, {"params": {"w": big["w"]}, "config": big["c"]})
    mgr.wait_until_finished()
    print("finished")
    """
)


_ORBAX_LIST = textwrap.dedent(
    """
    import json, sys
    import orbax.checkpoint as ocp
    opts = {"read_only": True}
    if sys.argv[2] == "commit_file":  # Orbax's default needs this on S3 (only gs:// is commit-file by default)
        opts["atomicity_options"] = ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)
    with ocp.CheckpointManager(sys.argv[1], options=ocp.CheckpointManagerOptions(**opts)) as m:
        print(json.dumps(m.all_steps()))
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    env.update(extra)
    return env


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_killed_save_process(kind: str, request: pytest.FixtureRequest) -> None:
    """A process killed (``os._exit``) in the middle of an async save on an object store: the
    half-written step is never listed, and the next manager removes it."""
    srv: Any = request.getfixturevalue(f"{kind}_server")
    srv.make_bucket(BUCKET)
    where = Where(kind, f"{SCHEMES[kind]}://{BUCKET}/killed{next(_n)}", srv.storage_options(), srv)
    with where.manager(async_save=False) as mgr:
        mgr.save(0, _items(0), metrics={"loss": LOSSES[0]})
    opts = json.dumps(where.options)
    proc = subprocess.run([sys.executable, "-c", _KILL_CHILD, where.url, opts, "4"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == KILL_STATUS, proc.stderr[-3000:]
    assert "1" in where.step_dirs() and "1/commit_success.txt" not in where.list_keys("1/")
    with where.manager(read_only=True) as mgr:
        assert mgr.all_steps() == [0]
    if kind in ("gcs", "s3") and importlib.util.find_spec("orbax.checkpoint") is not None:
        env = _env(**srv.env())
        if kind == "gcs":
            env.update(TENSORSTORE_GCS_HTTP_URL=srv.endpoint, GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator")
        mode = "auto" if kind == "gcs" else "commit_file"
        p = subprocess.run([sys.executable, "-c", _ORBAX_LIST, where.url, mode], env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert json.loads(p.stdout.strip().splitlines()[-1]) == [0]  # Orbax ignores it too
    with where.manager() as mgr:
        assert mgr.all_steps() == [0] and where.step_dirs() == ["0"]
        assert mgr.save(1, _items(1), metrics={"loss": LOSSES[1]})
        mgr.wait_until_finished()
        _assert_step(mgr.restore(1), 1)


@pytest.mark.parametrize("root", ["memory_url", "memory_store", "wrapped"])
def test_interrupted_first_save_on_kvstore_root(root: str) -> None:
    """A root given as any KvStore (here fsspec's memory://, our MemoryStore, and a wrapped
    store) writes in place: a step without its marker is never listed, even when no other
    step exists to show that the root uses markers, and the step can be saved again."""
    from ocdbt_py.kvstore import MemoryStore
    from ocdbt_py.testing.latency import LatencyStore

    kv: KvStore
    if root == "memory_url":
        kv = open_kvstore(f"memory://first-{os.getpid()}-{next(_n)}")
    elif root == "memory_store":
        kv = MemoryStore()
    else:
        kv = LatencyStore(MemoryStore(), delay=0.0)
    mgr = CheckpointManager(FaultyStore(kv, fail_at=3, ops=WRITE_OPS), async_save=False)
    with pytest.raises(InjectedFault):
        mgr.save(0, _items(0), metrics={"loss": LOSSES[0]})
    assert any(k.startswith("0/") for k in kv.list())
    with CheckpointManager(kv) as fresh:
        assert fresh.all_steps() == [] and fresh.latest_step() is None
        assert fresh.save(0, _items(0), metrics={"loss": LOSSES[0]})
        fresh.wait_until_finished()
        assert fresh.all_steps() == [0]
        _assert_step(fresh.restore(), 0)
