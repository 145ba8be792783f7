"""The Orbax/TensorStore/JAX side of the save tests, run once per session in a subprocess.

Usage: python _orbax_worker.py JOBS.json REPORT.json.  ``JOBS.json`` is a list of jobs; the
report maps each job's ``name`` to ``{"errors": [...], "info": {...}}``.  Job kinds:

* ``restore``: Orbax restores a checkpoint we wrote (``via``: ``pytree``, ``standard``,
  ``manager``) and compares it with the expected tree (``tree``: a builder in ``_trees``);
* ``tensorstore``: TensorStore opens our per-process and merged OCDBT databases and arrays;
* ``jax_layout``: save the sharded tree with ours and with Orbax, compare every metadata
  document, key and Zarr metadata byte for byte, then restore ours with Orbax and with
  ``ocdbt_py`` onto another mesh;
* ``jax_async``: async save, then the caller deletes its arrays before ``wait()``;
* ``chunk_shapes``: our chunk-shape choice vs Orbax's on many shapes;
* ``mp_restore``: Orbax restores a multi-process save onto this process's 8-device meshes.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import shutil  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import _trees  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ocdbt_py import checkpoint as ocpy  # noqa: E402

warnings.filterwarnings("ignore")


def _mesh42() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def _mesh24() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("y", "x"))


def _to_numpy(tree: Any) -> Any:
    def conv(x: Any) -> Any:
        if isinstance(x, jax.Array):
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                return ("key", str(jax.random.key_impl(x)), np.asarray(jax.random.key_data(x)))
            return np.asarray(x)
        return x

    return jax.tree.map(conv, tree, is_leaf=lambda x: x is None)


def job_restore(job: dict[str, Any]) -> dict[str, Any]:
    path = job["path"]
    via = job.get("via", "pytree")
    if via == "manager":
        mgr = ocp.CheckpointManager(path)
        steps = mgr.all_steps()
        errs = [] if steps == job["steps"] else [f"steps {steps} != {job['steps']}"]
        got = mgr.restore(job["step"])
        if list(job["items"]) == ["default"]:
            got = {"default": got}  # a single-item manager returns the item itself
        for item, exp in job["items"].items():
            want = exp["json"] if "json" in exp else _trees.expected_restore(getattr(_trees, exp["tree"])())
            errs += [f"{item}: {e}" for e in _trees.compare(_to_numpy(got[item]), want)]
        return {"errors": errs}
    want = _trees.expected_restore(getattr(_trees, job["tree"])())
    if via == "pytree":
        got = ocp.PyTreeCheckpointer().restore(path)
    elif via == "standard":
        got = ocp.StandardCheckpointer().restore(path)
    else:
        raise ValueError(via)
    return {"errors": _trees.compare(_to_numpy(got), want)}


def job_tensorstore(job: dict[str, Any]) -> dict[str, Any]:
    import tensorstore as ts

    errs: list[str] = []
    path = job["path"]
    vals = _trees.expected_restore(getattr(_trees, job["tree"])())
    for base in ("", "ocdbt.process_0/"):
        kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path}/{base}"}).result()
        keys = [k.decode() for k in kv.list().result()]
        if not keys:
            errs.append(f"{base or 'root'}: TensorStore lists no keys")
    for name in job["arrays"]:
        want = vals
        for part in name.split("."):
            want = want[part]
        spec = {"driver": "zarr3" if job.get("zarr3") else "zarr",
                "kvstore": {"driver": "ocdbt", "base": f"file://{path}/", "path": name + "/"}}
        arr = ts.open(spec, open=True).result().read().result()
        want = np.asarray(want, dtype=arr.dtype if not isinstance(want, np.ndarray) else None)
        if arr.dtype != want.dtype or arr.tobytes() != np.ascontiguousarray(want).tobytes():
            errs.append(f"{name}: TensorStore read {arr.dtype}{arr.shape} differs")
    return {"errors": errs}


def _sharded_tree() -> dict[str, Any]:
    mesh = _mesh42()
    out: dict[str, Any] = {}
    for name, v in _trees.sharded_values().items():
        spec = _trees.SHARDED_SPECS[name]
        sharding = SingleDeviceSharding(jax.devices()[1]) if spec == "single" else NamedSharding(mesh, P(*spec))
        out[name] = jax.device_put(v, sharding)
    out["key"] = jax.random.key(42)
    out["np_leaf"] = np.arange(5, dtype=np.uint16)
    out["count"] = 11
    out["label"] = "sharded"
    return out


def _targets(tree: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """Abstract targets on another mesh (shard along the first two axes where possible)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, jax.Array) and not jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key):
            spec = P(*(("y", "x")[: v.ndim])) if v.ndim and v.shape[0] % 2 == 0 else P()
            if v.ndim == 2 and v.shape[1] % 4:
                spec = P("y")
            if v.ndim == 1 and v.shape[0] % 2:
                spec = P()
            out[k] = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, spec))
        elif isinstance(v, jax.Array):
            out[k] = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
        else:
            out[k] = v
    return out


def _check_arrays(got: dict[str, Any], tree: dict[str, Any], target: dict[str, Any], who: str) -> list[str]:
    errs = []
    for k, t in target.items():
        g = got[k]
        want = tree[k]
        if isinstance(t, jax.ShapeDtypeStruct):
            if not isinstance(g, jax.Array):
                errs.append(f"{who}:{k}: not a jax.Array ({type(g).__name__})")
                continue
            if jax.dtypes.issubdtype(t.dtype, jax.dtypes.prng_key):
                if not np.array_equal(np.asarray(jax.random.key_data(g)), np.asarray(jax.random.key_data(want))):
                    errs.append(f"{who}:{k}: key data differs")
                continue
            if g.sharding != t.sharding:
                errs.append(f"{who}:{k}: sharding {g.sharding} != {t.sharding}")
            if g.dtype != want.dtype or not np.array_equal(np.asarray(g), np.asarray(want)):
                errs.append(f"{who}:{k}: values differ")
        elif isinstance(want, np.ndarray):
            if not np.array_equal(np.asarray(g), want):
                errs.append(f"{who}:{k}: values differ")
        elif g != want:
            errs.append(f"{who}:{k}: {g!r} != {want!r}")
    return errs


def _files_diff(ours: Path, theirs: Path) -> list[str]:
    """Per-parameter layout: the same files, equal Zarr metadata files."""
    fa = sorted(str(p.relative_to(ours)) for p in ours.rglob("*") if p.is_file())
    fb = sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*") if p.is_file())
    if fa != fb:
        return [f"files differ: only ours {sorted(set(fa) - set(fb))[:10]}, "
                f"only Orbax {sorted(set(fb) - set(fa))[:10]}"]
    return [f"{f}: zarr metadata differs" for f in fb if f.endswith((".zarray", "zarr.json"))
            and (ours / f).read_bytes() != (theirs / f).read_bytes()]


def _layout_diff(ours: Path, theirs: Path, use_ocdbt: bool = True) -> list[str]:
    import ocdbt_py

    errs = []
    for f in ("_METADATA", "_sharding", "_strings.json", "array_metadatas/process_0"):
        a, b = (ours / f), (theirs / f)
        if a.exists() != b.exists():
            errs.append(f"{f}: exists {a.exists()} vs Orbax {b.exists()}")
        elif a.exists() and a.read_bytes() != b.read_bytes():
            errs.append(f"{f}: differs from Orbax's\n ours:   {a.read_text()[:600]}\n theirs: {b.read_text()[:600]}")
    for sub in ("", "ocdbt.process_0") if use_ocdbt else ():
        A, B = ocdbt_py.open(str(ours / sub)), ocdbt_py.open(str(theirs / sub))
        ka, kb = list(A.list()), list(B.list())
        if ka != kb:
            errs.append(f"{sub or 'root'} keys differ: only ours {sorted(set(ka) - set(kb))[:10]}, "
                        f"only Orbax {sorted(set(kb) - set(ka))[:10]}")
        for k in kb:
            if (k.endswith(b".zarray") or k.endswith(b"zarr.json")) and A.get(k) != B.get(k):
                errs.append(f"{sub}:{k!r}: zarr metadata differs: {A.get(k)!r} vs {B.get(k)!r}")
        if A.config.to_json() | {"uuid": 0} != B.config.to_json() | {"uuid": 0}:
            errs.append(f"{sub}: OCDBT config {A.config} != {B.config}")
        va, vb = [v.generation for v in A.versions()], [v.generation for v in B.versions()]
        if sub == "" and (va != [1] or vb != [1]):
            errs.append(f"root versions {va} vs Orbax {vb}")
    ca = json.loads((ours / "_CHECKPOINT_METADATA").read_text())
    cb = json.loads((theirs / "_CHECKPOINT_METADATA").read_text())
    if list(ca) != list(cb) or ca["item_handlers"] != cb["item_handlers"]:
        errs.append(f"_CHECKPOINT_METADATA: {ca} vs {cb}")
    if not use_ocdbt:
        errs += _files_diff(ours, theirs)
    return errs


def job_jax_layout(job: dict[str, Any]) -> dict[str, Any]:
    root = Path(job["dir"])
    opts = job.get("options", {})
    tree = _sharded_tree()
    errs: list[str] = []
    ours, theirs = root / "ours", root / "theirs"
    ocpy.save(ours, tree, **opts)
    handler = ocp.PyTreeCheckpointHandler(use_zarr3=opts.get("use_zarr3", False),
                                          use_ocdbt=opts.get("use_ocdbt", True))
    save_args = None
    if "chunk_byte_size" in opts:
        save_args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=opts["chunk_byte_size"]), tree)
    args = ocp.args.PyTreeSave(tree, save_args=save_args,
                               ocdbt_target_data_file_size=opts.get("ocdbt_target_data_file_size"))
    ocp.Checkpointer(handler).save(theirs, args=args)
    errs += _layout_diff(ours, theirs, opts.get("use_ocdbt", True))
    # Orbax restores ours onto another mesh; so do we.
    mesh = _mesh24()
    target = _targets(tree, mesh)
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    got = ocp.Checkpointer(handler).restore(ours, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args))
    errs += _check_arrays(got, tree, target, "orbax")
    mine = ocpy.restore(ours, {k: v for k, v in target.items() if k != "key"})
    errs += _check_arrays(mine, tree, {k: v for k, v in target.items() if k != "key"}, "ocdbt_py")
    plain = ocp.Checkpointer(handler).restore(ours)  # no target: shardings from _sharding
    errs += [f"no-target: {e}" for e in _trees.compare(
        _to_numpy({k: v for k, v in plain.items() if k != "key"}),
        _to_numpy({k: v for k, v in tree.items() if k != "key"}))]
    return {"errors": errs}


def _pytree_zoo() -> dict[str, Any]:
    """Registered dataclasses, NamedTuples (optax-like states), empty nodes, nested sequences."""
    import dataclasses
    from typing import NamedTuple

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:
        kernel: Any
        bias: Any

    class AdamState(NamedTuple):
        count: Any
        mu: Any
        nu: Any

    class EmptyState(NamedTuple):
        pass

    mesh = _mesh42()
    w = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), NamedSharding(mesh, P("data")))
    b = jax.device_put(np.ones(4, np.float32), NamedSharding(mesh, P()))
    return {
        "layers": [Layer(w, b), Layer(w * 2, b * 2)],
        "opt": (AdamState(jax.numpy.zeros((), jax.numpy.int32), {"w": w}, {"w": w + 1}), EmptyState()),
        "misc": {"none": None, "empty": {}, "tup": (1, 2.5), "lst": [np.arange(3)]},
    }


def job_jax_pytrees(job: dict[str, Any]) -> dict[str, Any]:
    root = Path(job["dir"])
    tree = _pytree_zoo()
    ours, theirs = root / "ours", root / "theirs"
    ocpy.save(ours, tree, handler="pytree")
    ocp.PyTreeCheckpointer().save(theirs, tree)
    errs = _layout_diff(ours, theirs)
    got_ours = _to_numpy(ocp.PyTreeCheckpointer().restore(ours))
    got_theirs = _to_numpy(ocp.PyTreeCheckpointer().restore(theirs))
    errs += [f"restore differs: {e}" for e in _trees.compare(got_ours, _trees.expected_restore(got_theirs))]
    return {"errors": errs}


def job_jax_async(job: dict[str, Any]) -> dict[str, Any]:
    path = Path(job["path"])
    tree = _sharded_tree()
    expected = _to_numpy(tree)
    h = ocpy.save(path, tree, blocking=False)
    for v in tree.values():  # the caller frees (or donates) its buffers right away
        if isinstance(v, jax.Array):
            v.delete()
    h.wait()
    got = _to_numpy(ocp.PyTreeCheckpointer().restore(path))
    errs = []
    for k, v in expected.items():
        g = got[k]
        if isinstance(v, tuple):
            if not np.array_equal(g[2], v[2]) or g[1] != v[1]:
                errs.append(f"{k}: key differs")
        elif isinstance(v, np.ndarray):
            if not np.array_equal(g, v) or g.dtype != v.dtype:
                errs.append(f"{k}: differs")
        elif g != v:
            errs.append(f"{k}: {g!r} != {v!r}")
    return {"errors": errs}


def job_jax_repeat(job: dict[str, Any]) -> dict[str, Any]:
    """A training loop's saves: the same shardings saved again and again (the per-sharding
    layout is worked out once), each followed at once by a donated in-place update; every
    checkpoint holds the values at its save() call, as Orbax restores them."""
    root = Path(job["dir"])
    # one jitted update needs one device set: every array on the mesh (not "single")
    tree = {k: v for k, v in _sharded_tree().items() if isinstance(v, jax.Array) and k != "single"}
    def bump(x: Any) -> Any:
        if x.ndim == 0 or x.dtype == bool or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return x
        return x.at[0].add(1)

    step = jax.jit(lambda t: jax.tree.map(bump, t), donate_argnums=0)
    errs: list[str] = []
    saved = []
    for i in range(3):
        expected = _to_numpy(tree)
        h = ocpy.save(root / str(i), tree, blocking=False)
        tree = step(tree)  # donates the arrays save() just planned
        saved.append((h, root / str(i), expected))
    for h, path, expected in saved:
        h.wait()
        got = _to_numpy(ocp.PyTreeCheckpointer().restore(path))
        for k, v in expected.items():
            g = got[k]
            same = (np.array_equal(g[2], v[2]) and g[1] == v[1]) if isinstance(v, tuple) else (
                np.array_equal(g, v) and g.dtype == v.dtype)
            if not same:
                errs.append(f"{path.name}/{k}: differs from the values at save()")
    if not errs and np.array_equal(saved[0][2]["bias"], saved[1][2]["bias"]):
        errs.append("the update did not change the values between saves (the test checks nothing)")
    return {"errors": errs}


def job_chunk_shapes(job: dict[str, Any]) -> dict[str, Any]:
    from orbax.checkpoint._src.arrays import subchunking
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu

    from ocdbt_py.checkpoint.saving.chunking import choose_chunk_shape, chunk_byte_limit

    rng = np.random.default_rng(7)
    errs = []
    n = 0
    for _ in range(job.get("count", 400)):
        rank = int(rng.integers(1, 4))
        write = tuple(int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 30, 64, 100, 128])) for _ in range(rank))
        glob = tuple(w * int(rng.integers(1, 4)) for w in write)
        dtype = np.dtype(rng.choice(["float32", "int8", "float64", "int16"]))
        cbs = None if rng.random() < 0.3 else int(rng.choice([1, 7, 64, 100, 1000, 4096, 65536]))
        tfs = None if rng.random() < 0.5 else int(rng.choice([0, 256, 4096, 1 << 20]))
        if cbs is not None and cbs < dtype.itemsize:
            cbs = dtype.itemsize
        theirs_limit = tsu.calculate_chunk_byte_size(write, dtype, chunk_byte_size=cbs,
                                                     ocdbt_target_data_file_size=tfs)
        ours_limit = chunk_byte_limit(write, dtype.itemsize, cbs, tfs)
        if theirs_limit is not None and theirs_limit < dtype.itemsize:
            continue
        theirs = tuple(subchunking.choose_chunk_shape(glob, write, dtype, theirs_limit))
        ours = choose_chunk_shape(glob, write, dtype.itemsize, ours_limit)
        n += 1
        if ours_limit != theirs_limit or ours != theirs:
            errs.append(f"global={glob} write={write} {dtype} cbs={cbs} tfs={tfs}: ours {ours} "
                        f"({ours_limit}) vs Orbax {theirs} ({theirs_limit})")
    return {"errors": errs[:20], "info": {"cases": n}}


def job_mp_restore(job: dict[str, Any]) -> dict[str, Any]:
    from _mp_values import SPECS, global_values

    vals = global_values()
    errs: list[str] = []
    for sub, zarr3, *rest in job["paths"]:
        path = Path(job["root"]) / sub
        handler = ocp.PyTreeCheckpointHandler(use_zarr3=zarr3, use_ocdbt=rest[0] if rest else True)
        for mesh in (_mesh42(), _mesh24()):
            target = {}
            for name in SPECS:
                v = vals[name]
                axes = mesh.axis_names
                spec = P(axes[0], axes[1]) if v.ndim == 2 and v.shape[1] % mesh.shape[axes[1]] == 0 else P(axes[0])
                target[name] = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, spec))
            target["np_leaf"] = vals["np_leaf"]
            target["step"] = 0
            target["note"] = ""
            rargs = ocp.checkpoint_utils.construct_restore_args(target)
            got = ocp.Checkpointer(handler).restore(path, args=ocp.args.PyTreeRestore(item=target,
                                                                                      restore_args=rargs))
            for name in SPECS:
                g = got[name]
                if g.sharding != target[name].sharding or g.dtype != vals[name].dtype or not np.array_equal(
                        np.asarray(g), vals[name]):
                    errs.append(f"{sub}:{name} on {mesh.axis_names}: differs")
            if not np.array_equal(got["np_leaf"], vals["np_leaf"]) or got["step"] != 7 or got["note"] != "multi":
                errs.append(f"{sub}: non-array leaves differ: {got['np_leaf']} {got['step']} {got['note']}")
            mine = ocpy.restore(path, {name: target[name] for name in SPECS})  # ours, onto the same meshes
            for name in SPECS:
                g = mine[name]
                if g.sharding != target[name].sharding or g.dtype != vals[name].dtype or not np.array_equal(
                        np.asarray(g), vals[name]):
                    errs.append(f"{sub}:{name} on {mesh.axis_names}: ocdbt_py restore differs")
    if job.get("manager"):
        root = Path(job["root"]) / "steps"
        mgr = ocp.CheckpointManager(root, item_names=("state", "meta"))
        if mgr.all_steps() != [1]:
            errs.append(f"manager steps {mgr.all_steps()}")
        meta = ocp.PyTreeCheckpointer().metadata(root / "1" / "state")
        names = list(SPECS) + ["np_leaf", "step", "note"]
        as_numpy = {k: ocp.RestoreArgs(restore_type=np.ndarray) if k in SPECS or k == "np_leaf" else ocp.RestoreArgs()
                    for k in names}
        r = mgr.restore(1, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(restore_args=as_numpy), meta=ocp.args.JsonRestore()))
        if r["meta"] != {"n": job["processes"]}:
            errs.append(f"manager meta {r['meta']}")
        for name in SPECS:
            if not np.array_equal(np.asarray(r["state"][name]), vals[name]):
                errs.append(f"manager state {name} differs")
        del meta
    return {"errors": errs}


def job_crash_check(job: dict[str, Any]) -> dict[str, Any]:
    """A manager root after a killed save: Orbax lists only complete steps and restores them."""
    root = Path(job["root"])
    options = ocp.CheckpointManagerOptions()
    if job["commit_file"]:
        from orbax.checkpoint import options as ocp_options

        options = ocp.CheckpointManagerOptions(atomicity_options=ocp_options.AtomicityOptions(
            mode=ocp_options.AtomicityMode.COMMIT_FILE))
    mgr = ocp.CheckpointManager(root, options=options)
    steps = mgr.all_steps()
    errs = [] if steps == job["steps"] else [f"Orbax lists steps {steps}, expected {job['steps']}"]
    allowed = {0: [_trees.crash_old()], 1: [_trees.crash_old(), _trees.crash_new_big()]}
    for step in steps:
        got = ocp.PyTreeCheckpointer().restore(root / str(step))
        if not any(_trees.compare(got, _trees.expected_restore(t)) == [] for t in allowed[step]):
            errs.append(f"step {step} restored by Orbax is neither the old nor the new checkpoint")
    return {"errors": errs}


def job_orbax_save(job: dict[str, Any]) -> dict[str, Any]:
    """Orbax saves a NumPy tree (the reference our own save of the same tree is compared to)."""
    tree = getattr(_trees, job["tree"])()
    handler = ocp.PyTreeCheckpointHandler(use_zarr3=job.get("use_zarr3", False), use_ocdbt=job.get("use_ocdbt", True))
    save_args = None
    if job.get("chunk_byte_size"):
        save_args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=job["chunk_byte_size"]), tree)
    ocp.Checkpointer(handler).save(job["path"], args=ocp.args.PyTreeSave(tree, save_args=save_args))
    return {"errors": []}


JOBS = {
    "jax_pytrees": job_jax_pytrees,
    "orbax_save": job_orbax_save,
    "crash_check": job_crash_check,
    "restore": job_restore,
    "tensorstore": job_tensorstore,
    "jax_layout": job_jax_layout,
    "jax_async": job_jax_async,
    "jax_repeat": job_jax_repeat,
    "chunk_shapes": job_chunk_shapes,
    "mp_restore": job_mp_restore,
}


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    report: dict[str, Any] = {}
    for job in jobs:
        try:
            if job.get("clean"):
                shutil.rmtree(job["clean"], ignore_errors=True)
            report[job["name"]] = JOBS[job["kind"]](job)
        except Exception:  # noqa: BLE001 - reported to the test
            report[job["name"]] = {"errors": ["exception:\n" + traceback.format_exc()[-4000:]]}
    Path(sys.argv[2]).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
