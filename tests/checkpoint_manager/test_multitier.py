"""Single-process tests of the multi-tier manager: its shared decisions (restore planning,
topology comparison, replica layout, the key-value exchange, subset coordinators), and a
one-replica manager in this process (local and persistent tiers, fallbacks)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint.manager.exchange import CoordinationTimeoutError, Exchange
from ocdbt_py.checkpoint.manager.mesh_metadata import ReplicaLayout, Topology
from ocdbt_py.checkpoint.manager.preservation import EveryNSteps, LatestN, StepInfo
from ocdbt_py.checkpoint.manager.tier_plan import (
    LOCAL,
    PEER,
    PERSISTENT,
    RestorePlan,
    complete_per_replica,
    plan_restore,
    restorable_steps,
)
from ocdbt_py.checkpoint.saving.distributed import Coordinator
from ocdbt_py.errors import CorruptionError, NotFoundError
from ocdbt_py.kvstore import MemoryStore

# ---- restore planning ---------------------------------------------------------------------

TWO = [[0], [1]]  # two replicas of one process each
FOUR = [[0, 1], [2, 3]]  # two replicas of two processes each


def test_plan_prefers_local_when_every_replica_has_the_step() -> None:
    local = {0: {3, 4, 5}, 1: {3, 4, 5}}
    assert plan_restore(None, local, TWO, {0, 2, 4}) == RestorePlan(5, LOCAL)
    assert plan_restore(4, local, TWO, {0, 2, 4}) == RestorePlan(4, LOCAL)  # local beats persistent


def test_plan_peer_when_one_replica_lost_its_tier() -> None:
    assert plan_restore(None, {0: {3, 4, 5}, 1: set()}, TWO, {4}) == RestorePlan(5, PEER, 0)
    assert plan_restore(None, {0: set(), 1: {5}}, TWO, {4}) == RestorePlan(5, PEER, 1)
    assert plan_restore(None, {1: {5}}, TWO, {4}) == RestorePlan(5, PEER, 1)  # a silent process: none
    # both replicas complete for older steps, only one for the newest: the newest wins
    assert plan_restore(None, {0: {4, 5}, 1: {4}}, TWO, set()) == RestorePlan(5, PEER, 0)
    assert plan_restore(4, {0: {4, 5}, 1: {4}}, TWO, set()) == RestorePlan(4, LOCAL)


def test_plan_replica_complete_only_when_all_its_processes_have_the_step() -> None:
    local = {0: {3}, 1: {3}, 2: {3}, 3: set()}
    assert complete_per_replica(local, FOUR) == [{3}, set()]
    assert plan_restore(None, local, FOUR, set()) == RestorePlan(3, PEER, 0)
    local = {0: {3}, 1: set(), 2: {3}, 3: set()}  # no replica complete
    assert plan_restore(None, local, FOUR, {2}) == RestorePlan(2, PERSISTENT)
    assert restorable_steps(local, FOUR, {2}) == {2}


def test_plan_persistent_and_errors() -> None:
    assert plan_restore(None, {0: set(), 1: set()}, TWO, {0, 2, 4}) == RestorePlan(4, PERSISTENT)
    assert plan_restore(2, {0: {5}, 1: {5}}, TWO, {0, 2, 4}) == RestorePlan(2, PERSISTENT)
    with pytest.raises(NotFoundError, match="no step is complete"):
        plan_restore(None, {0: set(), 1: set()}, TWO, set())
    with pytest.raises(NotFoundError, match="step 3 is not complete"):
        plan_restore(3, {0: {3}, 1: set()}, FOUR, {2})


def test_plan_without_peer_restore() -> None:
    # the state is sharded over the replica axis: one replica cannot serve the others
    local = {0: {5}, 1: set()}
    assert plan_restore(None, local, TWO, {4}, peer_ok=False) == RestorePlan(4, PERSISTENT)
    with pytest.raises(NotFoundError, match="not replicated across replicas"):
        plan_restore(5, local, TWO, {4}, peer_ok=False)
    assert plan_restore(None, {0: {5}, 1: {5}}, TWO, {4}, peer_ok=False) == RestorePlan(5, LOCAL)


def test_latest_n_keeps_everything_below_n() -> None:
    """Regression: with fewer steps than ``n`` a negative slice kept only the newest."""
    infos = [StepInfo(s, float(s)) for s in (0, 1)]
    assert LatestN(3).keep(infos) == {0, 1}
    assert EveryNSteps(1, max_to_keep=5).keep(infos) == {0, 1}


# ---- topology -----------------------------------------------------------------------------


def test_topology_files_round_trip_and_mismatch() -> None:
    t = Topology(((0, 1, 2, 3), (2048, 2049, 2050, 2051)), (0, 1, 2, 3, 2048, 2049, 2050, 2051))
    files = t.files()
    assert json.loads(files["global_process_metadata.json"]) == [[0, 1, 2, 3], [2048, 2049, 2050, 2051]]
    assert json.loads(files["mesh_metadata.json"]) == [0, 1, 2, 3, 2048, 2049, 2050, 2051]
    kv = MemoryStore()
    assert Topology.read(kv) is None
    t.write(kv)
    assert Topology.read(kv) == t
    assert t.mismatch(t, 1) is None
    fewer = Topology(((0, 1),), (0, 1))
    assert "2 processes" in (t.mismatch(fewer, 0) or "")
    swapped = Topology(t.process_devices, t.mesh_devices[4:] + t.mesh_devices[:4])
    assert "mesh's device ids" in (t.mismatch(swapped, 0) or "")
    moved = Topology(((0, 1, 2, 3), (9, 10, 11, 12)), t.mesh_devices)
    assert "process 1 had devices" in (t.mismatch(moved, 1) or "")
    assert t.mismatch(moved, 0) is None  # process 0 itself is unchanged
    kv.set("mesh_metadata.json", b'["x"]')
    with pytest.raises(CorruptionError):
        Topology.read(kv)
    kv.set("mesh_metadata.json", b"{not json")
    with pytest.raises(CorruptionError):
        Topology.read(kv)


def _fake_mesh(process_of: list[list[int]], names: tuple[str, str] = ("replica", "model")) -> Any:
    devices = np.empty((len(process_of), len(process_of[0])), dtype=object)
    n = 0
    for r, row in enumerate(process_of):
        for c, p in enumerate(row):
            devices[r, c] = types.SimpleNamespace(id=n, process_index=p)
            n += 1
    return types.SimpleNamespace(devices=devices, axis_names=names)


def test_replica_layout() -> None:
    lay = ReplicaLayout.of(_fake_mesh([[0, 0, 1, 1], [2, 2, 3, 3]]), 0)
    assert lay.replicas == ((0, 1), (2, 3)) and lay.count == 2 and lay.axis_name == "replica"
    assert lay.replica_devices == (frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7}))
    assert [lay.replica_of(p) for p in range(5)] == [0, 0, 1, 1, None]
    # the replica axis second: columns are replicas
    lay = ReplicaLayout.of(_fake_mesh([[0, 1], [0, 1]], ("model", "data")), 1)
    assert lay.replicas == ((0,), (1,)) and lay.axis_name == "data"
    with pytest.raises(ValueError, match="replicas 0 and 1"):
        ReplicaLayout.of(_fake_mesh([[0, 1], [1, 2]]), 0)
    with pytest.raises(ValueError, match="out of range"):
        ReplicaLayout.of(_fake_mesh([[0], [1]]), 2)


# ---- the key-value exchange and subset coordinators ---------------------------------------


class FakeClient:
    """The parts of ``jax.distributed``'s client the manager uses, in memory."""

    def __init__(self) -> None:
        self.kv: dict[str, str] = {}
        self.cond = threading.Condition()
        self.barriers: list[tuple[str, Any]] = []

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        with self.cond:
            if key in self.kv and not allow_overwrite:
                raise RuntimeError(f"ALREADY_EXISTS: {key}")
            self.kv[key] = value
            self.cond.notify_all()

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.kv, timeout_in_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
            return self.kv[key]

    def wait_at_barrier(self, barrier_id: str, timeout_in_ms: int, process_ids: Any = None) -> None:
        self.barriers.append((barrier_id, process_ids))


def test_exchange_allgather_between_threads() -> None:
    client = FakeClient()
    results: dict[int, Any] = {}

    def run(i: int) -> None:
        ex = Exchange("t", i, 3, client, timeout_s=10)
        results[i] = ex.allgather("round1", {"me": i})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: [{"me": 0}, {"me": 1}, {"me": 2}] for i in range(3)}


def test_exchange_times_out_with_our_error() -> None:
    ex = Exchange("t", 0, 2, FakeClient(), timeout_s=0.2)
    with pytest.raises(CoordinationTimeoutError, match="process 1 did not publish 'r'"):
        ex.allgather("r", [1])
    assert Exchange("t", 0, 1, None, 1).allgather("r", {"a": 1}) == [{"a": 1}]
    with pytest.raises(Exception, match="jax.distributed"):
        Exchange("t", 0, 2, None, 1)


def test_exchange_from_process() -> None:
    client = FakeClient()
    assert Exchange("t", 0, 2, client, 5).from_process("d", 0, [True, False]) == [True, False]
    assert Exchange("t", 1, 2, client, 5).from_process("d", 0) == [True, False]


def test_subset_coordinator_barriers_and_status() -> None:
    client = FakeClient()
    c = Coordinator(3, 4, client=client, participants=[2, 3], key_prefix="mt_p1", timeout_s=5)
    assert not c.is_primary and c.participants == (2, 3)
    client.key_value_set("mt_p1_written_status/2", "ok")
    c.sync("written", None)  # reads only process 2's status, barrier among 2 and 3 only
    assert client.barriers == [("mt_p1_written", [2, 3])]
    client.key_value_set("mt_p1_committed_status/2", "OSError: disk full")
    with pytest.raises(RuntimeError, match="disk full"):
        c.sync("committed", None)
    assert Coordinator(2, 4, participants=[2, 3]).is_primary
    alone = Coordinator(1, 2, client=client, participants=[1])
    alone.sync("x", None)  # one participant: no barrier at all
    assert len(client.barriers) == 2
    with pytest.raises(ValueError, match="not among the participants"):
        Coordinator(0, 2, participants=[1])


def test_writer_devices_own_each_region_once() -> None:
    from ocdbt_py.checkpoint.saving.jax_arrays import _owned_by

    class Dev:
        def __init__(self, i: int):
            self.id = i

    def dev(i: int) -> Any:
        return Dev(i)

    rows = [slice(0, 4), slice(4, 8)]
    # devices 0-3: replica 0 (0,1 hold rows 0-3 twice, 2,3 rows 4-7); 4-7 the same again
    index = {dev(i): (rows[(i // 2) % 2], slice(None)) for i in range(8)}
    sharding = types.SimpleNamespace(devices_indices_map=lambda shape: index)
    assert _owned_by(sharding, (8, 3), frozenset(range(4))) == {0, 2}
    assert _owned_by(sharding, (8, 3), frozenset({5, 6, 7})) == {5, 6}
    assert _owned_by(sharding, (8, 3), frozenset({9})) == set()


# ---- a one-replica manager in this process ------------------------------------------------


@pytest.fixture()
def jx() -> Any:
    return pytest.importorskip("jax")


def _state(jax: Any, mesh: Any, step: int, *, rows: int = 8) -> dict[str, Any]:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    w = (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + step)
    w[0, 0] = -0.0
    n = np.arange(6, dtype=np.int32) * step
    return {"w": jax.device_put(w, NamedSharding(mesh, P("model"))),
            "n": jax.device_put(n, NamedSharding(mesh, P()))}


def _abstract(jax: Any, tree: dict[str, Any]) -> dict[str, Any]:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in tree.items()}


def _same(a: Any, b: Any) -> bool:
    return all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in b)


def _source(mgr: Any) -> str:
    info = mgr.last_restore
    assert info is not None
    return str(info.source)


def _mesh(jax: Any) -> Any:
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("replica", "model"))


def test_single_replica_manager_tiers_and_fallbacks(jx: Any, tmp_path: Path) -> None:
    from ocdbt_py.checkpoint import restore
    from ocdbt_py.checkpoint.manager import FixedInterval, MultiTierCheckpointManager

    jax = jx
    mesh = _mesh(jax)
    abstract = _abstract(jax, _state(jax, mesh, 0))
    local, persistent = tmp_path / "local", tmp_path / "persistent"

    def manager(**kw: Any) -> MultiTierCheckpointManager:
        opts: dict[str, Any] = {"global_mesh": mesh, "abstract_state": abstract,
                                "local_policy": FixedInterval(1), "local_preservation": LatestN(2),
                                "persistent_policy": FixedInterval(3), **kw}
        return MultiTierCheckpointManager(str(local) + "/{process_index}", persistent, **opts)

    with manager() as mgr:
        assert mgr.latest_step() is None and mgr.replica == 0 and mgr.in_persistent_group
        with pytest.raises(NotFoundError):
            mgr.restore()
        saved = [s for s in range(5) if mgr.save(s, _state(jax, mesh, s), metrics={"loss": s * 0.5})]
        assert saved == [0, 1, 2, 3, 4]
        mgr.wait_until_finished()
        assert mgr.local_steps() == [3, 4] and mgr.persistent_steps() == [0, 3]
        assert mgr.all_steps() == [0, 3, 4] and mgr.latest_step() == 4
        assert mgr.save(4, _state(jax, mesh, 4), force=True)  # force: the persistent tier lacks 4
        assert not mgr.save(4, _state(jax, mesh, 4), force=True)  # now no tier lacks it
        mgr.wait_until_finished()
        assert mgr.local_steps() == [3, 4] and mgr.persistent_steps() == [0, 3, 4]
        got = mgr.restore()
        assert mgr.last_restore is not None and (mgr.last_restore.step, _source(mgr)) == (4, LOCAL)
        assert _same(got, _state(jax, mesh, 4)) and got["w"].sharding == abstract["w"].sharding
        assert _same(mgr.restore(3), _state(jax, mesh, 3)) and _source(mgr) == LOCAL
        assert _same(mgr.restore(0), _state(jax, mesh, 0)) and _source(mgr) == PERSISTENT
        assert mgr.save(5, _state(jax, mesh, 5), force=True)  # force: both tiers
        mgr.wait_until_finished()
        assert mgr.persistent_steps() == [0, 3, 4, 5]
    step_dir = local / "0" / "4"
    assert sorted(os.listdir(local / "0")) == ["4", "5"]
    assert json.loads((step_dir / "metrics" / "metrics").read_text()) == {"loss": 2.0}
    assert json.loads((step_dir / "state" / "_METADATA").read_text())["store_array_data_equal_to_fill_value"] is False
    assert _same(restore(persistent / "3", item="default"), {k: np.asarray(v) for k, v in _state(jax, mesh, 3).items()})

    # the target's sharding changed: local steps are refused, the persistent tier is used
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    other = dict(abstract, w=jax.ShapeDtypeStruct((8, 4), np.float32, sharding=NamedSharding(mesh, P(None, "model"))))
    with manager() as mgr:
        assert mgr.all_steps() == [0, 3, 4, 5]
        got = mgr.restore(target=other)
        info = mgr.last_restore
        assert info is not None and (info.step, info.source) == (5, PERSISTENT)
        assert any("differ from the restore target" in n for n in info.notes)
        assert _same(got, _state(jax, mesh, 5))

    # local tier lost (a fresh host): the persistent tier
    shutil.rmtree(local)
    with manager() as mgr:
        assert mgr.all_steps() == [0, 3, 4, 5]
        assert _same(mgr.restore(), _state(jax, mesh, 5)) and _source(mgr) == PERSISTENT


def test_interrupted_local_save_is_cleaned_and_ignored(jx: Any, tmp_path: Path) -> None:
    from ocdbt_py.checkpoint.manager import FixedInterval, MultiTierCheckpointManager

    jax = jx
    mesh = _mesh(jax)
    abstract = _abstract(jax, _state(jax, mesh, 0))
    kw: dict[str, Any] = {"global_mesh": mesh, "abstract_state": abstract, "local_policy": FixedInterval(1),
                          "persistent_policy": FixedInterval(100), "async_save": False}
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", **kw) as mgr:
        mgr.save(1, _state(jax, mesh, 1))
    (tmp_path / "l" / "2.orbax-checkpoint-tmp-multitier").mkdir()  # staging of a crashed save
    (tmp_path / "l" / "3").mkdir()  # a step directory without metadata
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", **kw) as mgr:
        assert not (tmp_path / "l" / "2.orbax-checkpoint-tmp-multitier").exists()
        assert mgr.all_steps() == [1]
        assert _same(mgr.restore(), _state(jax, mesh, 1)) and _source(mgr) == LOCAL


def test_a_local_step_without_process_metadata_is_not_used(jx: Any, tmp_path: Path) -> None:
    from ocdbt_py.checkpoint.manager import FixedInterval, MultiTierCheckpointManager

    jax = jx
    mesh = _mesh(jax)
    abstract = _abstract(jax, _state(jax, mesh, 0))
    kw: dict[str, Any] = {"global_mesh": mesh, "abstract_state": abstract, "local_policy": FixedInterval(1),
                          "persistent_policy": FixedInterval(2), "async_save": False}
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", **kw) as mgr:
        for s in range(4):
            mgr.save(s, _state(jax, mesh, s))
    shutil.rmtree(tmp_path / "l" / "3" / "process_metadata")
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", **kw) as mgr:
        got = mgr.restore()
        info = mgr.last_restore
        assert info is not None and (info.step, info.source) == (2, LOCAL)
        assert _same(got, _state(jax, mesh, 2))
        with pytest.raises(NotFoundError, match="step 3"):
            mgr.restore(3)


def test_clock_policy_and_argument_checks(jx: Any, tmp_path: Path) -> None:
    from ocdbt_py.checkpoint.manager import MultiTierCheckpointManager, SaveEveryNSeconds

    jax = jx
    mesh = _mesh(jax)
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", global_mesh=mesh,
                                    local_policy=SaveEveryNSeconds(3600),
                                    persistent_policy=SaveEveryNSeconds(3600)) as mgr:
        assert mgr.save(0, _state(jax, mesh, 0))  # the first save
        assert not mgr.save(1, _state(jax, mesh, 1))  # an hour has not passed
        with pytest.raises(ValueError, match="needs a target"):
            mgr.restore()
        with pytest.raises(TypeError, match="ShapeDtypeStruct"):
            mgr.restore(target={"w": np.zeros((8, 4), np.float32)})
        with pytest.raises(ValueError, match="non-negative"):
            mgr.save(-1, {})
    with pytest.raises(ValueError, match="closed"):
        mgr.save(2, _state(jax, mesh, 2))
    with pytest.raises(TypeError, match="save policy"):
        MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", global_mesh=mesh, local_policy=3)  # type: ignore
    with pytest.raises(TypeError, match="unknown save_options"):
        MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", global_mesh=mesh, save_options={"x": 1})


def test_process_state_is_part_of_each_step(jx: Any, tmp_path: Path) -> None:
    """A step saved with ``process_state`` carries it in both tiers; a local step whose JSON
    part is missing is not complete (the next source is used), and a restore gives the
    process its own document back wherever the step comes from."""
    from ocdbt_py.checkpoint.manager import FixedInterval, MultiTierCheckpointManager

    jax = jx
    mesh = _mesh(jax)
    abstract = _abstract(jax, _state(jax, mesh, 0))
    kw: dict[str, Any] = {"global_mesh": mesh, "abstract_state": abstract, "local_policy": FixedInterval(1),
                          "local_preservation": LatestN(3), "persistent_policy": FixedInterval(2),
                          "async_save": True}
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", **kw) as mgr:
        for s in range(4):
            mgr.save(s, _state(jax, mesh, s), process_state={"position": s * 100, "epoch": [s, "a"]})
        with pytest.raises(ValueError, match="not JSON-serializable"):
            mgr.save(10, _state(jax, mesh, 10), process_state={"bad": object()})
        mgr.wait_until_finished()
        got, doc = mgr.restore(with_process_state=True)
        assert _same(got, _state(jax, mesh, 3)) and _source(mgr) == LOCAL
        assert doc == {"position": 300, "epoch": [3, "a"]}
        assert mgr.last_restore is not None and mgr.last_restore.process_state == doc
        assert mgr.restore(2, with_process_state=True)[1] == {"position": 200, "epoch": [2, "a"]}
    saved = json.loads((tmp_path / "l" / "3" / "process_state" / "metadata").read_text())
    assert saved == {"format": "ocdbt_py.process_state/1", "process_count": 1,
                     "states": [{"position": 300, "epoch": [3, "a"]}]}
    assert json.loads((tmp_path / "p" / "2" / "process_state" / "metadata").read_text())["states"] == [
        {"position": 200, "epoch": [2, "a"]}]
    # the JSON part of local step 3 is lost: the step is incomplete; 2 is read locally
    (tmp_path / "l" / "3" / "process_state" / "metadata").unlink()
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", **kw) as mgr:
        assert mgr.all_steps() == [0, 1, 2]
        got, doc = mgr.restore(with_process_state=True)
        info = mgr.last_restore
        assert info is not None and (info.step, info.source) == (2, LOCAL) and doc["position"] == 200
        with pytest.raises(NotFoundError, match="step 3"):
            mgr.restore(3)
    # no local tier: the persistent step gives the document back
    shutil.rmtree(tmp_path / "l")
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", **kw) as mgr:
        got, doc = mgr.restore(with_process_state=True)
        assert _source(mgr) == PERSISTENT and doc == {"position": 200, "epoch": [2, "a"]}
        assert _same(got, _state(jax, mesh, 2))
        assert mgr.restore(0, with_process_state=True)[1]["position"] == 0


def test_a_local_step_orbax_wrote_is_used_when_its_metadata_matches(jx: Any, tmp_path: Path) -> None:
    """A local step without our fingerprint (as Orbax's emergency manager writes it: the
    ``state`` item by Orbax's PyTree handler, ``process_metadata/``, no custom metadata) is
    restored locally when its tree, shapes, dtypes and recorded shardings equal the target's,
    and refused with the reason otherwise."""
    ocp = pytest.importorskip("orbax.checkpoint")
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ocdbt_py.checkpoint.manager import FixedInterval, MultiTierCheckpointManager
    from ocdbt_py.kvstore import open_kvstore

    jax = jx
    mesh = _mesh(jax)
    state = _state(jax, mesh, 3)
    abstract = _abstract(jax, state)
    step_dir = tmp_path / "l" / "3"
    with ocp.PyTreeCheckpointer() as ckptr:
        ckptr.save(step_dir / "state", args=ocp.args.PyTreeSave(state))
    Topology.current(mesh).write(open_kvstore(str(step_dir / "process_metadata")))
    (step_dir / "_CHECKPOINT_METADATA").write_text(json.dumps({"item_handlers": {}, "custom_metadata": {}}))
    (step_dir / "commit_success.txt").write_text("done")
    kw: dict[str, Any] = {"global_mesh": mesh, "local_policy": FixedInterval(1),
                          "persistent_policy": FixedInterval(100), "async_save": False}
    with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", abstract_state=abstract, **kw) as mgr:
        assert mgr.all_steps() == [3]
        got = mgr.restore()
        assert _source(mgr) == LOCAL and _same(got, state)
    other = dict(abstract, w=jax.ShapeDtypeStruct((8, 4), np.float32, sharding=NamedSharding(mesh, P(None, "model"))))
    bigger = dict(abstract, n=jax.ShapeDtypeStruct((7,), np.int32, sharding=abstract["n"].sharding))
    fewer = {"w": abstract["w"]}
    for target, why in ((other, "another sharding"), (bigger, "int32[6], the target int32[7]"),
                        (fewer, "its tree differs")):
        with MultiTierCheckpointManager(tmp_path / "l", tmp_path / "p", abstract_state=target, **kw) as mgr:
            assert mgr.all_steps() == []
            with pytest.raises(NotFoundError):
                mgr.restore()
            with pytest.raises(NotFoundError):
                mgr.restore(3)
            reason = mgr._local_report(None, target)[1][3]
            assert "written without a fingerprint" in reason and why in reason, reason
