"""The Orbax side of the copy tests, run in a subprocess (8 forced CPU devices).

Usage: python _cp_worker.py JOBS.json REPORT.json.  Job kinds:

* ``save``: Orbax 0.12 writes the source checkpoints (sharded JAX + NumPy trees, per-parameter
  and OCDBT, Zarr v2 and v3, and a CheckpointManager root of composite steps with JSON items);
* ``restore``: Orbax restores a copy (no target) and compares it with ``ocdbt_py``'s restore
  of the source (floats cast when the copy casts them);
* ``restore_mesh``: Orbax restores a copy of the sharded tree onto another mesh;
* ``manager``: Orbax's CheckpointManager lists and restores every step of a copied root;
* ``chunk_shapes``: Orbax's chunk-shape choice for each array equals the copy's.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import _cp_trees  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ocdbt_py import checkpoint as ocpy  # noqa: E402

warnings.filterwarnings("ignore")


def _mesh(shape: tuple[int, int]) -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(shape), ("x", "y"))


def _tree() -> dict[str, Any]:
    mesh = _mesh((4, 2))
    vals = _cp_trees.values()
    tree: dict[str, Any] = {"params": {}}
    for name, (_, _, spec) in _cp_trees.SHARDED.items():
        arr = jax.make_array_from_callback(vals[name].shape, NamedSharding(mesh, P(*spec)),
                                           lambda idx, v=vals[name]: v[idx])
        if name.startswith("params."):
            tree["params"][name.split(".", 1)[1]] = arr
        else:
            tree[name] = arr
    tree["np_big"] = vals["np_big"]
    tree["step"] = 12
    tree["note"] = "hello"
    return tree


def _to_numpy(tree: Any) -> Any:
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


def job_save(job: dict[str, Any]) -> dict[str, Any]:
    root = Path(job["root"])
    tree = _tree()
    for name, kw in [("pp2", {"use_ocdbt": False}), ("pp3", {"use_ocdbt": False, "use_zarr3": True}),
                     ("oc2", {}), ("oc3", {"use_zarr3": True})]:
        ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**kw)).save(root / name, args=ocp.args.PyTreeSave(tree))
    mgr = ocp.CheckpointManager(root / "mgr", item_names=("state", "meta"),
                                item_handlers={"state": ocp.PyTreeCheckpointHandler(use_ocdbt=False),
                                               "meta": ocp.JsonCheckpointHandler()})
    for step in (1, 2):
        mgr.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(tree),
                                               meta=ocp.args.JsonSave({"step": step, "lr": [0.1, 0.01]})))
    mgr.wait_until_finished()
    mgr.close()
    return {"errors": []}


def _want(src: str, cast: str | None, exclude: list[str]) -> dict[str, Any]:
    want = _cp_trees.flatten(ocpy.restore(src))
    if cast:
        from ocdbt_py.checkpoint.convert.encoding import cast_dtype, is_float

        dt = cast_dtype(cast)
        want = {k: v.astype(dt) if isinstance(v, np.ndarray) and is_float(v.dtype) else v for k, v in want.items()}
    for k in exclude:
        want.pop(k, None)
    return want


def job_restore(job: dict[str, Any]) -> dict[str, Any]:
    got = _cp_trees.flatten(_to_numpy(ocp.PyTreeCheckpointer().restore(job["path"])))
    return {"errors": _cp_trees.compare(got, _want(job["src"], job.get("dtype"), job.get("exclude", [])))}


def job_restore_mesh(job: dict[str, Any]) -> dict[str, Any]:
    mesh = _mesh((2, 4))
    vals = _cp_trees.values()
    target: dict[str, Any] = {"params": {}}
    for name, (shape, _, spec) in _cp_trees.SHARDED.items():
        sds = jax.ShapeDtypeStruct(shape, vals[name].dtype, sharding=NamedSharding(mesh, P(*reversed(spec))))
        if name.startswith("params."):
            target["params"][name.split(".", 1)[1]] = sds
        else:
            target[name] = sds
    target.update(np_big=vals["np_big"], step=0, note="")
    handler = ocp.PyTreeCheckpointHandler()
    got = ocp.Checkpointer(handler).restore(job["path"], args=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)))
    errs = []
    for name in _cp_trees.SHARDED:
        g = got["params"][name.split(".", 1)[1]] if name.startswith("params.") else got[name]
        t = target["params"][name.split(".", 1)[1]] if name.startswith("params.") else target[name]
        if g.sharding != t.sharding or not np.array_equal(np.asarray(g), vals[name]):
            errs.append(f"{name}: restored onto the (2, 4) mesh differs")
    return {"errors": errs}


def job_manager(job: dict[str, Any]) -> dict[str, Any]:
    mgr = ocp.CheckpointManager(job["path"])
    steps = mgr.all_steps()
    errs = [] if steps == job["steps"] else [f"steps {steps} != {job['steps']}"]
    for step in steps:
        got = mgr.restore(step)
        for item in job["items"]:
            src = f"{job['src']}/{step}/{item}"
            if item == "meta":
                want = json.loads(Path(src, "metadata").read_text())
                if got[item] != want:
                    errs.append(f"step {step} {item}: {got[item]} != {want}")
                continue
            errs += [f"step {step} {item}: {e}" for e in _cp_trees.compare(
                _cp_trees.flatten(_to_numpy(got[item])), _cp_trees.flatten(ocpy.restore(src)))]
    mgr.close()
    return {"errors": errs}


def job_chunk_shapes(job: dict[str, Any]) -> dict[str, Any]:
    from orbax.checkpoint._src.arrays import subchunking
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    errs = []
    for name, shape, write_shape, itemsize, chunk, cbs, tfs, use_ocdbt in job["arrays"]:
        dt = np.dtype(f"V{itemsize}")  # only the item size matters to the choice
        if use_ocdbt:
            cbs = tsu.calculate_chunk_byte_size(tuple(write_shape), dt, chunk_byte_size=cbs,
                                                ocdbt_target_data_file_size=tfs)
        theirs = subchunking.choose_chunk_shape(tuple(shape), tuple(write_shape), dt, cbs)
        if tuple(theirs) != tuple(chunk):
            errs.append(f"{name}: Orbax chooses {tuple(theirs)}, the copy has {tuple(chunk)}")
    return {"errors": errs, "info": {"arrays": len(job["arrays"])}}


JOBS = {"save": job_save, "restore": job_restore, "restore_mesh": job_restore_mesh, "manager": job_manager,
        "chunk_shapes": job_chunk_shapes}


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    report: dict[str, Any] = {}
    for job in jobs:
        try:
            report[job["name"]] = JOBS[job["kind"]](job)
        except Exception:  # noqa: BLE001 - reported to the test
            report[job["name"]] = {"errors": ["exception:\n" + traceback.format_exc()[-4000:]]}
    Path(sys.argv[2]).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
