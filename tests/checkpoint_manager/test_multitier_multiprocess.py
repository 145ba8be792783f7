"""Real ``jax.distributed`` jobs (127.0.0.1, gloo) using ``MultiTierCheckpointManager``.

Two processes with 4 CPU devices each form 2 data-parallel replicas of a ``("replica",
"model")`` mesh.  One job history is played in order, each phase a fresh start of both
processes (a restart), sharing the directories:

1. save steps 0-5 (local every step keeping 3, persistent every 2 steps by replica 0), then
   restore the newest step: from every process's own local tier;
2. restart on another topology (2 devices per process): local steps are refused, the
   persistent tier's newest step is restored, with the reason recorded;
3. restart with the replicas' order swapped in the mesh (same devices): refused as well;
4. process 1's local tier is deleted: the newest step comes from replica 0 through a
   collective; a new step is saved, then process 0's tier is deleted and replica 1 serves;
5. every local tier is deleted: the newest persistent step is restored;

and Orbax's plain ``CheckpointManager`` restores the persistent tier.  Every save carries
each process's own JSON state (a data iterator's position) and every restore must give each
process its own back, whichever tier it reads.  Separately, Orbax's own emergency
``CheckpointManager`` writes a job (local steps on replica 1 only) that ours restores from
the local tier.  Every restore compares
each addressable shard with the expected values bit for bit (``-0.0`` and NaN payloads
included).  A 4-process job (2 processes per replica) checks barriers among replica 0 only
and a replica that is incomplete although one of its processes has the step.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(job: dict[str, Any], workdir: Path, timeout: float = 240) -> list[dict[str, Any]]:
    """Run ``_mt_worker.py`` in ``job["processes"]`` processes; their JSON results."""
    workdir.mkdir(parents=True, exist_ok=True)
    job_file = workdir / f"job_{len(list(workdir.glob('job_*.json')))}.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop("XLA_FLAGS", None)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(HERE / "_mt_worker.py"), str(job_file), str(i), str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(job["processes"])]
    results = []
    problems = []
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                problems.append(f"a worker timed out:\n{err[-3000:]}")
                continue
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if not lines:
                problems.append(f"worker failed ({p.returncode}):\n{err[-5000:]}")
                continue
            res = json.loads(lines[-1])
            if "crash" in res:
                problems.append(f"process {res['process']} crashed:\n{res['crash']}")
            results.append(res)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if problems:
        pytest.fail("\n\n".join(problems))
    return results


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The phases above, in order; ``history[name]`` is the per-process results of a phase."""
    root = tmp_path_factory.mktemp("multitier")
    base = {"processes": 2, "devices": 4, "local": str(root / "local" / "p{process_index}"),
            "persistent": str(root / "persistent"), "timeout": 60,
            "local_every": 1, "local_keep": 3, "persistent_every": 2}
    out: dict[str, Any] = {"root": root}
    out["save"] = run_job({**base, "actions": [{"do": "save", "steps": list(range(6))}, {"do": "restore"}]}, root)
    out["listing_after_save"] = {p: sorted(os.listdir(root / "local" / p)) for p in ("p0", "p1")}
    shutil.copytree(root / "local" / "p1" / "5", root / "saved_p1_5")  # later phases delete it
    out["topology"] = run_job({**base, "devices": 2, "actions": [{"do": "restore"}]}, root)
    out["swapped"] = run_job({**base, "swap_replicas": True, "actions": [{"do": "restore"}]}, root)
    out["listing_after_topology"] = {p: sorted(os.listdir(root / "local" / p)) for p in ("p0", "p1")}
    shutil.rmtree(root / "local" / "p1")
    out["peer"] = run_job({**base, "actions": [{"do": "restore"}, {"do": "save", "steps": [7]},
                                               {"do": "restore"}]}, root)
    shutil.rmtree(root / "local" / "p0")
    out["peer_from_1"] = run_job({**base, "actions": [{"do": "restore"}, {"do": "restore", "step": 5}]}, root)
    shutil.rmtree(root / "local")
    out["persistent"] = run_job({**base, "actions": [{"do": "restore"}, {"do": "restore", "step": 2}]}, root)
    out["orbax"] = run_job({"processes": 1, "devices": 8, "persistent": str(root / "persistent"),
                            "actions": [{"do": "orbax"}]}, root)
    return out


def _own_states(results: list[dict[str, Any]], i: int) -> None:
    """Every process got its own JSON state of the restored step back."""
    for r in results:
        got = r["actions"][i]
        assert got["process_state"] == {"process": r["process"], "position": got["step"] * 1000 + r["process"],
                                        "shard": f"part-{r['process']}-of-{len(results)}"}, got


def _restores(results: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    return [r["actions"][i] for r in results]


def test_save_then_restore_from_local(history: dict[str, Any]) -> None:
    res = history["save"]
    assert [r["replica"] for r in res] == [0, 1]
    assert [r["actions"][0]["saved"] for r in res] == [list(range(6))] * 2
    for r in _restores(res, 1):
        assert (r["step"], r["source"], r["errors"]) == (5, "local", []), r
    assert [r["local_steps"] for r in res] == [[3, 4, 5]] * 2  # LatestN(3) per process
    assert [r["persistent_steps"] for r in res] == [[0, 2, 4]] * 2
    assert [r["all_steps"] for r in res] == [[0, 2, 3, 4, 5]] * 2
    _own_states(res, 1)
    assert history["listing_after_save"] == {"p0": ["3", "4", "5"], "p1": ["3", "4", "5"]}
    root = history["root"]
    # the local step layout: each process wrote only its own database; topology recorded
    step = root / "saved_p1_5"
    assert sorted(p.name for p in step.iterdir()) == ["_CHECKPOINT_METADATA", "commit_success.txt", "metrics",
                                                      "process_metadata", "process_state", "state"]
    # every process's JSON state is in every process's local step (a peer restore serves it)
    states = json.loads((step / "process_state" / "metadata").read_text())["states"]
    assert [s["position"] for s in states] == [5000, 5001]
    assert sorted(p.name for p in (step / "state").glob("ocdbt.process_*")) == ["ocdbt.process_1"]
    procs = json.loads((step / "process_metadata" / "global_process_metadata.json").read_text())
    mesh = json.loads((step / "process_metadata" / "mesh_metadata.json").read_text())
    assert len(procs) == 2 and all(len(p) == 4 for p in procs) and mesh == procs[0] + procs[1]
    handlers = json.loads((step / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    assert handlers["process_metadata"].endswith("ProcessMetadataCheckpointHandler")
    assert json.loads((step / "state" / "_METADATA").read_text())["use_zarr3"] is True
    # the persistent tier was written by replica 0 (process 0) alone
    pstep = root / "persistent" / "4"
    assert sorted(p.name for p in (pstep / "default").glob("ocdbt.process_*")) == ["ocdbt.process_0"]
    assert (pstep / "commit_success.txt").exists()
    assert [s["position"] for s in json.loads((pstep / "process_state" / "metadata").read_text())["states"]] == [
        4000, 4001]


def test_changed_topology_falls_back_to_persistent(history: dict[str, Any]) -> None:
    for name in ("topology", "swapped"):
        for r in _restores(history[name], 0):
            assert (r["step"], r["source"], r["errors"]) == (4, "persistent", []), (name, r)
            assert any("another topology" in n for n in r["notes"]), r["notes"]
        _own_states(history[name], 0)
    notes = " ".join(_restores(history["topology"], 0)[0]["notes"])
    assert "device ids" in notes or "processes" in notes
    # the refused local steps are left alone
    assert history["listing_after_topology"] == history["listing_after_save"]


def test_lost_local_tier_restored_from_peer(history: dict[str, Any]) -> None:
    res = history["peer"]
    assert [r["initial_steps"] for r in res] == [[0, 2, 3, 4, 5]] * 2  # process 0's steps count
    for r in _restores(res, 0):
        assert (r["step"], r["source"], r["replica"], r["errors"]) == (5, "peer", 0, []), r
        assert any("do not hold step 5 locally" in n for n in r["notes"])
    _own_states(res, 0)  # process 1 lost its tier: its state came from process 0's step
    _own_states(res, 2)
    assert [r["actions"][1]["saved"] for r in res] == [[7]] * 2
    for r in _restores(res, 2):  # both hold step 7 now
        assert (r["step"], r["source"], r["errors"]) == (7, "local", []), r
    assert [r["local_steps"] for r in res] == [[4, 5, 7], [7]]
    # both list the same steps: step 3, pruned from process 0's tier, is gone everywhere
    assert [r["all_steps"] for r in res] == [[0, 2, 4, 5, 7]] * 2
    # process 0 lost its tier too: replica 1 (process 1) serves step 7; step 5 only existed
    # in process 0's deleted tier, so asking for it fails everywhere with the same error
    res = history["peer_from_1"]
    for r in _restores(res, 0):
        assert (r["step"], r["source"], r["replica"], r["errors"]) == (7, "peer", 1, []), r
    _own_states(res, 0)
    assert [r["all_steps"] for r in res] == [[0, 2, 4, 7]] * 2
    errors = [r["error"] for r in _restores(res, 1)]
    assert errors[0] == errors[1] and "step 5" in errors[0] and "NotFoundError" in errors[0]


def test_all_local_tiers_lost_restores_persistent(history: dict[str, Any]) -> None:
    res = history["persistent"]
    assert [r["initial_steps"] for r in res] == [[0, 2, 4]] * 2
    for r in _restores(res, 0):
        assert (r["step"], r["source"], r["errors"]) == (4, "persistent", []), r
    for r in _restores(res, 1):
        assert (r["step"], r["source"], r["errors"]) == (2, "persistent", []), r
    _own_states(res, 0)
    _own_states(res, 1)


def test_orbax_restores_the_persistent_tier(history: dict[str, Any]) -> None:
    (r,) = history["orbax"]
    got = r["actions"][0]
    assert got["steps"] == [0, 2, 4] and got["step"] == 4
    assert got["errors"] == []


def test_four_processes_two_per_replica(tmp_path: Path) -> None:
    """Replica 0 is processes 0-1: the persistent save's barriers involve only them.  With
    process 3's local tier gone, replica 1 is incomplete although process 2 holds the step,
    so replica 0 serves it; a local tier holds only its process's chunks (the rest reads as
    fill values)."""
    base = {"processes": 4, "devices": 2, "local": str(tmp_path / "local" / "p{process_index}"),
            "persistent": str(tmp_path / "persistent"), "timeout": 60,
            "local_every": 1, "local_keep": 2, "persistent_every": 2}
    res = run_job({**base, "actions": [{"do": "save", "steps": [0, 1, 2, 3]}, {"do": "restore"}]}, tmp_path)
    assert [r["replica"] for r in res] == [0, 0, 1, 1]
    for r in _restores(res, 1):
        assert (r["step"], r["source"], r["errors"]) == (3, "local", []), r
    assert [r["persistent_steps"] for r in res] == [[0, 2]] * 4
    persistent = tmp_path / "persistent" / "2" / "default"
    assert sorted(p.name for p in persistent.glob("ocdbt.process_*")) == ["ocdbt.process_0", "ocdbt.process_1"]

    from ocdbt_py.checkpoint import restore
    from tests.checkpoint_manager._mt_values import values

    got = restore(tmp_path / "local" / "p1" / "3", item="state")  # NumPy, no target
    want = values(3)["w"]  # rows split over the 4 "model" devices, process 1 holds rows 8-15
    assert np.array_equal(got["w"][8:].view(np.uint32), want[8:].view(np.uint32))
    assert not got["w"][:8].any()  # chunks process 1 never wrote read as the fill value

    shutil.rmtree(tmp_path / "local" / "p3")
    res = run_job({**base, "actions": [{"do": "restore"}]}, tmp_path)
    for r in _restores(res, 0):
        assert (r["step"], r["source"], r["replica"], r["errors"]) == (3, "peer", 0, []), r


def test_orbax_written_local_steps_restore_from_local(tmp_path: Path) -> None:
    """Orbax's emergency manager keeps local steps on replica 1 only (replica 0 writes the
    persistent tier): ours restores the newest one from replica 1's local tier and copies it
    to replica 0, since the recorded mesh, tree and shardings match; on another mesh order
    it falls back to the persistent tier."""
    base = {"processes": 2, "devices": 4, "local": str(tmp_path / "local" / "p{process_index}"),
            "persistent": str(tmp_path / "persistent"), "timeout": 60,
            "local_every": 1, "local_keep": 2, "persistent_every": 2}
    res = run_job({**base, "actions": [{"do": "orbax_emergency_save", "steps": [0, 1, 2, 3]}]}, tmp_path)
    assert [r["actions"][0]["saved"] for r in res] == [[0, 1, 2, 3]] * 2
    assert sorted(os.listdir(tmp_path / "local" / "p1")) == ["2", "3"] and not os.listdir(tmp_path / "local" / "p0")
    meta = json.loads((tmp_path / "local" / "p1" / "3" / "_CHECKPOINT_METADATA").read_text())
    assert not meta.get("custom_metadata")  # no fingerprint of ours
    res = run_job({**base, "local_keep": 3, "actions": [{"do": "restore"}, {"do": "restore", "step": 2}]}, tmp_path)
    assert [r["initial_steps"] for r in res] == [[0, 2, 3]] * 2
    for i, step in ((0, 3), (1, 2)):
        for r in _restores(res, i):
            assert (r["step"], r["source"], r["replica"], r["errors"]) == (step, "peer", 1, []), r
            assert r["process_state"] is None  # Orbax saved no per-process JSON
    res = run_job({**base, "swap_replicas": True, "actions": [{"do": "restore"}]}, tmp_path)
    for r in _restores(res, 0):
        assert (r["step"], r["source"], r["errors"]) == (2, "persistent", []), r
        assert any("another topology" in n for n in r["notes"]), r["notes"]


def test_orbax_emergency_face(tmp_path: Path) -> None:
    """``ocdbt_py.orbax.emergency.CheckpointManager`` driven with Orbax's own ``args``: a
    per-process ``dataset`` JSON item comes back to each process; Orbax's emergency manager
    then restores what ours wrote (from replica 1's local tier, as it always reads; compared
    as numbers, since Orbax's own cross-replica copy is not bit-exact)."""
    base = {"processes": 2, "devices": 4, "local": str(tmp_path / "local" / "p{process_index}"),
            "persistent": str(tmp_path / "persistent"), "timeout": 60,
            "local_every": 1, "local_keep": 2, "persistent_every": 2}
    res = run_job({**base, "actions": [{"do": "face", "steps": [0, 1, 2, 3, 4, 5]}]}, tmp_path)
    for r in res:
        got = r["actions"][0]
        assert got["saved"] == [0, 1, 2, 3, 4, 5] and got["all_steps"] == [0, 2, 4, 5], got
        assert (got["step"], got["source"], got["errors"]) == (5, "local", []), got
        assert got["dataset"] == {"process": r["process"], "position": 5000 + r["process"], "shard":
                                  f"part-{r['process']}-of-2"}
    assert [r["actions"][0]["in_primary_slice"] for r in res] == [True, False]
    res = run_job({**base, "actions": [{"do": "orbax_emergency_restore"}]}, tmp_path)
    for r in res:
        got = r["actions"][0]
        assert (got["step"], got["errors"]) == (5, []), got
        assert got["all_steps"] == [0, 2, 4, 5]
