"""Write a corpus of real Orbax checkpoints, plus what Orbax's own restore returns for each.

Usage::

    python conformance/checkpoint/gen_orbax_corpus.py OUT_DIR [--only a,b] [--no-multiprocess]

Run it with the project venv (orbax-checkpoint 0.12.x, jax on CPU).  It forces 8 host CPU
devices before importing JAX.  Layout of ``OUT_DIR``:

* ``ckpt/<case>/...``           the checkpoints (item dirs, step dirs, manager roots)
* ``expected/<case>.json``      Orbax's restore of each case (see ``_expected.py``)
* ``corpus.json``               one record per case: where it is, what it is, how it was made

Cases cover the layouts Orbax writes today (OCDBT merged root with zarr2 and zarr3, the
per-parameter directory layout, composite and JSON items, CheckpointManager roots with
retention, prefixes, tmp dirs and commit markers, the v1 API, ArrayCheckpointHandler),
dtypes (f32 f16 bf16 f64 int4 int8 uint32 float8 complex bool, 0-d, PRNG keys), shardings
(replicated, 1-D and 2-D NamedSharding on 8 devices), and a real 2-process save with
``jax.distributed`` on 127.0.0.1 (gloo collectives).  Synthesized variants (a merged root
removed, a chunk deleted) are recorded against the restore of the intact original.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _setup_jax(devices: int) -> None:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


class AdamState(NamedTuple):
    """An optax-like optimizer state (a NamedTuple of trees)."""

    count: Any
    mu: Any
    nu: Any


class Pair(NamedTuple):
    """A small NamedTuple leaf container."""

    a: Any
    b: Any


# -- trees -----------------------------------------------------------------------------------


def _mesh():
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def _put(x, spec):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return jax.device_put(x, NamedSharding(_mesh(), P(*spec)))


def array_tree() -> dict:
    """jax/numpy arrays and scalars of many dtypes and shardings (StandardSave-compatible)."""
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    return {
        "params": {
            "layer0": {
                "kernel": _put(jnp.arange(128, dtype=jnp.float32).reshape(8, 16) / 7, ("data", "model")),
                "bias": _put(jnp.linspace(-1, 1, 16, dtype=jnp.float32), ()),
            },
            "embed": _put((jnp.arange(128, dtype=jnp.float32).reshape(32, 4) - 60).astype(jnp.bfloat16),
                          ("data",)),
            "half": _put(jnp.arange(64, dtype=jnp.float16).reshape(8, 8) / 3, (None, "model")),
            "cplx": _put(jnp.arange(8, dtype=jnp.complex64) * (1 - 2j), ("model",)),
            "f8": _put(jnp.arange(16, dtype=jnp.float8_e4m3fn), ("data",)),
            "f8b": _put(jnp.linspace(-2, 2, 8).astype(jnp.float8_e5m2), ()),
            "i4": _put(jnp.arange(-4, 4, dtype=jnp.int4), ("data",)),
        },
        "ints": {
            "i8": _put(jnp.arange(-3, 3, dtype=jnp.int8).reshape(2, 3), ()),
            "u32": _put(jnp.arange(8, dtype=jnp.uint32) * 1000003, ("data",)),
        },
        "flags": _put(jnp.arange(16).reshape(4, 4) % 3 == 0, ("data", "model")),
        "s0_f32": jnp.float32(1.5),
        "s0_i32": jnp.int32(-7),
        "np_f64": np.arange(6.0).reshape(2, 3) / 3,
        "np_i64": np.arange(-2, 3, dtype=np.int64) * (1 << 40),
        "np_bf16": np.arange(5, dtype=np.float32).astype(ml_dtypes.bfloat16),
        "np_bool": np.array([True, False, True]),
        "np_scalar": np.float32(2.5),
        "np_int": np.int16(-12),
        "py_int": 3,
        "py_float": 0.25,
        "py_big": 1 << 40,
    }


def rich_tree() -> dict:
    """array_tree plus strings, None, empty containers, lists, tuples and a NamedTuple."""
    import jax.numpy as jnp
    import numpy as np

    t = array_tree()
    t.update(
        {
            "name": "hello world",
            "nothing": None,
            "empty_dict": {},
            "empty_list": [],
            "empty_tuple": (),
            "lst": [jnp.ones(3, jnp.float32), 5, "in a list", [np.arange(2), 2.5]],
            "tup": (np.arange(3, dtype=np.int32), 1.0),
            "nt": Pair(a=_put(jnp.arange(8.0, dtype=jnp.float32), ("data",)), b=np.float64(0.5)),
        }
    )
    return t


def exotic_tree() -> dict:
    """Awkward keys, PRNG keys and more dtypes."""
    import jax
    import jax.numpy as jnp

    return {
        "a.b": jnp.ones(3, jnp.float32),
        "x/y": jnp.arange(2.0, dtype=jnp.float32),
        "sp ace": jnp.arange(4, dtype=jnp.int32),
        "ünï": jnp.ones(1, jnp.float32),
        "int_keys": {3: jnp.full(2, 3.0), 10: jnp.full(2, 10.0)},
        "key": jax.random.key(0),
        "rawkey": jax.random.PRNGKey(1),
        "as_bf16": jnp.linspace(0, 1, 6, dtype=jnp.float32),
        "f8fn": _put(jnp.linspace(-3, 3, 8).astype(jnp.float8_e4m3fn), ("data",)),
        "c128_as_c64": jnp.arange(3, dtype=jnp.complex64) + 1j,
        "u8": _put(jnp.arange(16, dtype=jnp.uint8), ("data",)),
        "s": "a string",
    }


def big_tree() -> dict:
    """Arrays split into several chunks per shard and many OCDBT data files."""
    import jax.numpy as jnp

    return {
        "big": _put(jnp.arange(256 * 512, dtype=jnp.float32).reshape(256, 512) % 977, ("data", "model")),
        "rep": _put(jnp.arange(128 * 64, dtype=jnp.float32).reshape(128, 64), ()),
        "tiny": jnp.arange(4.0, dtype=jnp.float32),
    }


# -- helpers ---------------------------------------------------------------------------------


class Corpus:
    """Collects case records and writes expected values."""

    def __init__(self, out: str):
        self.out = os.path.abspath(out)
        self.ckpt = os.path.join(self.out, "ckpt")
        self.exp = os.path.join(self.out, "expected")
        os.makedirs(self.ckpt, exist_ok=True)
        os.makedirs(self.exp, exist_ok=True)
        self.cases: dict[str, dict] = {}
        self.failures: dict[str, str] = {}

    def path(self, name: str) -> str:
        return os.path.join(self.ckpt, name)

    def record(self, name: str, tree: Any, *, kind: str, rel: str | None = None, **info: Any) -> None:
        from _expected import Encoder

        Encoder(self.exp, name).write(tree, **info.pop("extra", {}))
        self.cases[name] = {"kind": kind, "path": f"ckpt/{rel or name}", "expected": f"expected/{name}.json",
                            **info}

    def finish(self) -> None:
        import jax
        import orbax.checkpoint as ocp

        with open(os.path.join(self.out, "corpus.json"), "w") as f:
            json.dump({"orbax_version": ocp.__version__ if hasattr(ocp, "__version__") else "?",
                       "jax_version": jax.__version__, "cases": self.cases, "failures": self.failures},
                      f, indent=1, ensure_ascii=False)


def _pytree_restore(path: str, **handler_kw: Any) -> Any:
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**handler_kw)) as c:
        return c.restore(path)


def _pytree_save(path: str, tree: Any, save_args: Any = None, *, target_file_size: int | None = None,
                 **handler_kw: Any) -> None:
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**handler_kw)) as c:
        c.save(path, args=ocp.args.PyTreeSave(tree, save_args=save_args,
                                               ocdbt_target_data_file_size=target_file_size))


# -- cases -----------------------------------------------------------------------------------


def case_std_zarr2_ocdbt(c: Corpus) -> None:
    import orbax.checkpoint as ocp

    p = c.path("std_zarr2_ocdbt")
    with ocp.StandardCheckpointer() as ck:
        ck.save(p, array_tree())
    c.record("std_zarr2_ocdbt", _pytree_restore(p), kind="item", layout="ocdbt", zarr=2)


def case_pytree_zarr3_ocdbt(c: Corpus) -> None:
    p = c.path("pytree_zarr3_ocdbt")
    _pytree_save(p, rich_tree(), use_zarr3=True)
    c.record("pytree_zarr3_ocdbt", _pytree_restore(p), kind="item", layout="ocdbt", zarr=3)


def case_pytree_zarr2_ocdbt(c: Corpus) -> None:
    p = c.path("pytree_zarr2_ocdbt")
    _pytree_save(p, rich_tree())
    c.record("pytree_zarr2_ocdbt", _pytree_restore(p), kind="item", layout="ocdbt", zarr=2)


def case_perparam_zarr2(c: Corpus) -> None:
    p = c.path("perparam_zarr2")
    _pytree_save(p, rich_tree(), use_ocdbt=False)
    c.record("perparam_zarr2", _pytree_restore(p, use_ocdbt=False), kind="item", layout="dirs", zarr=2)


def case_perparam_zarr3(c: Corpus) -> None:
    p = c.path("perparam_zarr3")
    _pytree_save(p, rich_tree(), use_ocdbt=False, use_zarr3=True)
    c.record("perparam_zarr3", _pytree_restore(p, use_ocdbt=False, use_zarr3=True), kind="item",
             layout="dirs", zarr=3)


def case_exotic_zarr3(c: Corpus) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    tree = exotic_tree()
    save_args = jax.tree_util.tree_map(lambda _: ocp.SaveArgs(), tree)
    save_args["as_bf16"] = ocp.SaveArgs(dtype=np.dtype(jnp.bfloat16))
    p = c.path("exotic_zarr3_nocompress")
    _pytree_save(p, tree, save_args=save_args, use_zarr3=True, use_compression=False)
    c.record("exotic_zarr3_nocompress", _pytree_restore(p, use_zarr3=True), kind="item", layout="ocdbt",
             zarr=3)


def case_exotic_zarr2_dirs(c: Corpus) -> None:
    p = c.path("exotic_zarr2_dirs")
    tree = exotic_tree()
    _pytree_save(p, tree, use_ocdbt=False)
    c.record("exotic_zarr2_dirs", _pytree_restore(p, use_ocdbt=False), kind="item", layout="dirs", zarr=2)


def case_chunked(c: Corpus) -> None:
    import jax
    import orbax.checkpoint as ocp

    tree = big_tree()
    save_args = jax.tree_util.tree_map(lambda _: ocp.SaveArgs(chunk_byte_size=16384), tree)
    save_args["rep"] = ocp.SaveArgs(chunk_byte_size=4096)
    for zarr3 in (False, True):
        name = f"chunked_zarr{3 if zarr3 else 2}"
        p = c.path(name)
        _pytree_save(p, tree, save_args=save_args, use_zarr3=zarr3, target_file_size=20480)
        c.record(name, _pytree_restore(p, use_zarr3=zarr3), kind="item", layout="ocdbt", zarr=3 if zarr3 else 2)


def case_no_replica_parallel(c: Corpus) -> None:
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.serialization import type_handler_registry, type_handlers

    registry = type_handler_registry.create_type_handler_registry(
        (__import__("jax").Array, type_handlers.ArrayHandler(use_replica_parallel=False)),
    )
    p = c.path("no_replica_parallel")
    h = ocp.PyTreeCheckpointHandler(type_handler_registry=registry)
    with ocp.Checkpointer(h) as ck:
        ck.save(p, args=ocp.args.PyTreeSave({k: v for k, v in array_tree()["params"].items()}))
    c.record("no_replica_parallel", _pytree_restore(p), kind="item", layout="ocdbt", zarr=2)


def case_array_handler(c: Corpus) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    p = c.path("array_handler")
    with ocp.Checkpointer(ocp.ArrayCheckpointHandler()) as ck:
        ck.save(p, args=ocp.args.ArraySave(_put(jnp.arange(24.0, dtype=jnp.float32).reshape(4, 6), ("data",))))
        restored = ck.restore(p)
    c.record("array_handler", restored, kind="item", layout="dirs", zarr=2)


def case_manager(c: Corpus) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    root = c.path("manager")
    opts = ocp.CheckpointManagerOptions(
        max_to_keep=2, keep_period=4, best_fn=lambda m: m["loss"], best_mode="min",
        step_prefix="ckpt", step_format_fixed_length=6, todelete_subdir="trash",
        enable_async_checkpointing=True,
    )
    losses = {0: 5.0, 1: 4.0, 2: 1.0, 3: 3.0, 4: 2.5, 5: 2.0}
    with ocp.CheckpointManager(root, options=opts, item_names=("params", "opt_state", "meta"),
                               metadata={"model": "tiny", "version": 2}) as m:
        for step, loss in losses.items():
            params = {"w": _put(jnp.full((8, 4), float(step), jnp.float32), ("data",)),
                      "b": jnp.arange(4, dtype=jnp.bfloat16) + step}
            opt = AdamState(count=jnp.int32(step), mu={"w": jnp.zeros((8, 4)) + step},
                            nu={"w": jnp.ones((8, 4)) * step})
            m.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt),
                meta=ocp.args.JsonSave({"step": step, "lr": 0.1 / (step + 1), "tags": ["a", "b"]})),
                metrics={"loss": loss})
        m.wait_until_finished()
        steps = list(m.all_steps())
        latest = m.latest_step()
        restored = m.restore(latest)
        best = m.best_step()
        restored_best = m.restore(best)
    items = {k: restored[k] for k in restored.keys()}  # noqa: SIM118 - a Composite
    items_best = {k: restored_best[k] for k in restored_best.keys()}  # noqa: SIM118
    # A save that was interrupted: a tmp step dir with a higher step number must be ignored.
    step_dir = os.path.join(root, f"ckpt_{latest:06d}")
    shutil.copytree(step_dir, os.path.join(root, "ckpt_000099.orbax-checkpoint-tmp"))
    c.record("manager", items, kind="root", steps=steps, latest=latest,
             step_dir=f"ckpt_{latest:06d}")
    c.record("manager_best", items_best, kind="step", rel=f"manager/ckpt_{best:06d}", step=best)


def case_manager_commit_file(c: Corpus) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from orbax.checkpoint import options as ocp_options

    root = c.path("manager_commit_file")
    atom = ocp_options.AtomicityOptions(mode=ocp_options.AtomicityMode.COMMIT_FILE)
    opts = ocp.CheckpointManagerOptions(atomicity_options=atom, enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=opts) as m:
        for step in (1, 2, 3):
            m.save(step, args=ocp.args.StandardSave({"x": jnp.full(4, step, jnp.float32), "step": step}))
        restored2 = m.restore(2)
    # Step 3 loses its commit marker: readers must skip it.
    os.remove(os.path.join(root, "3", "commit_success.txt"))
    with ocp.CheckpointManager(root, options=opts) as m:
        steps = list(m.all_steps())
    c.record("manager_commit_file", restored2, kind="root", steps=steps, latest=2, step_dir="2",
             uncommitted=[3])


def case_v1(c: Corpus) -> None:
    from orbax.checkpoint.experimental import v1 as ocp_v1

    p = c.path("v1_pytree")
    tree = array_tree()
    for k in ("np_int", "np_scalar"):  # numpy scalars have no v1 leaf handler
        tree.pop(k)
    ocp_v1.save_pytree(p, tree)
    c.record("v1_pytree", ocp_v1.load_pytree(p), kind="step", single_item="pytree")
    p2 = c.path("v1_checkpointables")
    ocp_v1.save_checkpointables(p2, {"params": {"w": _put(__import__("jax").numpy.ones((4, 2)), ("data",))},
                                     "extra": {"note": "json", "n": 3}})
    restored = ocp_v1.load_checkpointables(p2)
    c.record("v1_checkpointables", dict(restored), kind="step")


def case_no_merge(c: Corpus) -> None:
    """The merged root removed: only ocdbt.process_0/ remains (compared with the intact restore)."""
    p = c.path("no_merged_root")
    tree = rich_tree()
    _pytree_save(p, tree, use_zarr3=True)
    restored = _pytree_restore(p, use_zarr3=True)
    os.remove(os.path.join(p, "manifest.ocdbt"))
    shutil.rmtree(os.path.join(p, "d"))
    c.record("no_merged_root", restored, kind="item", layout="ocdbt-per-process", zarr=3, synthesized=True)


def case_missing_chunk(c: Corpus) -> None:
    """A chunk deleted: an error for modern checkpoints; fill value when the flag is absent."""
    import jax.numpy as jnp
    import numpy as np

    tree = {"w": _put(jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4) + 1, ("data",)),
            "v": np.arange(1, 5, dtype=np.int32)}
    p = c.path("missing_chunk_modern")
    _pytree_save(p, tree, use_ocdbt=False)
    os.remove(os.path.join(p, "w", "1.0"))
    p2 = c.path("missing_chunk_legacy")
    _pytree_save(p2, tree, use_ocdbt=False)
    os.remove(os.path.join(p2, "w", "1.0"))
    with open(os.path.join(p2, "_METADATA")) as f:
        meta = json.load(f)
    for k in ("store_array_data_equal_to_fill_value", "use_ocdbt"):
        meta.pop(k, None)
    for entry in meta["tree_metadata"].values():
        entry["value_metadata"].pop("write_shape", None)
    with open(os.path.join(p2, "_METADATA"), "w") as f:
        json.dump(meta, f)
    try:
        _pytree_restore(p, use_ocdbt=False)
        modern_error = None
    except Exception as e:  # noqa: BLE001 - we record what Orbax did
        modern_error = type(e).__name__
    restored = _pytree_restore(p2, use_ocdbt=False)
    c.record("missing_chunk_legacy", restored, kind="item", layout="dirs", zarr=2)
    c.cases["missing_chunk_modern"] = {"kind": "item", "path": "ckpt/missing_chunk_modern",
                                       "expect_error": True, "orbax_error": modern_error}


def case_legacy_msgpack_crafted(c: Corpus) -> None:
    """Per-param zarr2 dirs with a hand-written msgpack ``checkpoint`` file (Orbax 0.5 style)."""
    import jax.numpy as jnp
    import msgpack
    import numpy as np
    import orbax.checkpoint as ocp

    p = c.path("legacy_msgpack_crafted")
    _pytree_save(p, {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3), "b": np.arange(3, dtype=np.int32)},
                 use_ocdbt=False)
    for name in ("_METADATA", "_sharding", "_CHECKPOINT_METADATA", "commit_success.txt"):
        if os.path.exists(os.path.join(p, name)):
            os.remove(os.path.join(p, name))
    shutil.rmtree(os.path.join(p, "array_metadatas"), ignore_errors=True)

    def ext_array(a: np.ndarray, code: int) -> msgpack.ExtType:
        return msgpack.ExtType(code, msgpack.packb((a.shape, a.dtype.name, a.tobytes())))

    doc = {
        "w": "PLACEHOLDER://w",
        "b": "PLACEHOLDER://b",
        "step": 12,
        "lr": ext_array(np.asarray(np.float32(0.1)), 3),
        "hist": ext_array(np.arange(3, dtype=np.int64), 1),
        "name": "run-7",
        "nested": {"flag": True, "vals": [1, 2.5]},
        "cplx": msgpack.ExtType(2, msgpack.packb((1.5, -2.0))),
    }
    with open(os.path.join(p, "checkpoint"), "wb") as f:
        f.write(msgpack.packb(doc))
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)) as ck:
        restored = ck.restore(p)
    c.record("legacy_msgpack_crafted", restored, kind="item", layout="dirs", zarr=2)


CASES = {
    "std_zarr2_ocdbt": case_std_zarr2_ocdbt,
    "pytree_zarr3_ocdbt": case_pytree_zarr3_ocdbt,
    "pytree_zarr2_ocdbt": case_pytree_zarr2_ocdbt,
    "perparam_zarr2": case_perparam_zarr2,
    "perparam_zarr3": case_perparam_zarr3,
    "exotic_zarr3": case_exotic_zarr3,
    "exotic_zarr2_dirs": case_exotic_zarr2_dirs,
    "chunked": case_chunked,
    "no_replica_parallel": case_no_replica_parallel,
    "array_handler": case_array_handler,
    "manager": case_manager,
    "manager_commit_file": case_manager_commit_file,
    "v1": case_v1,
    "no_merge": case_no_merge,
    "missing_chunk": case_missing_chunk,
    "legacy_msgpack_crafted": case_legacy_msgpack_crafted,
}


# -- multi-process ----------------------------------------------------------------------------


def mp_tree(process_devices: int = 4) -> dict:
    """The tree the 2-process run saves (built identically in every process)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))

    def put(x, *spec):
        s = NamedSharding(mesh, P(*spec))
        return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])

    return {
        "kernel": put(np.arange(128, dtype=np.float32).reshape(8, 16), "data", "model"),
        "bias": put(np.linspace(-1, 1, 16).astype(np.float32)),
        "embed": put((np.arange(64, dtype=np.float32).reshape(16, 4) - 30).astype(jnp.bfloat16), "data"),
        "step": 42,
        "np_arr": np.arange(4, dtype=np.int32),
    }


def emergency_state(step: int):
    """The state the emergency manager saves at ``step`` on a (replica=2, model=4) mesh."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("replica", "model"))

    def put(x, *spec):
        s = NamedSharding(mesh, P(*spec))
        return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])

    state = {"w": put(np.arange(32, dtype=np.float32).reshape(4, 8) + step, None, "model"),
             "b": put(np.full(8, step, np.float32), "model")}
    return mesh, state


def mp_worker(out: str, pid: int, port: int) -> None:
    _setup_jax(4)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import orbax.checkpoint as ocp

    tree = mp_tree()
    for name, kw in (("multiprocess_zarr3", {"use_zarr3": True}), ("multiprocess_zarr2", {})):
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**kw)) as ck:
            ck.save(os.path.join(out, "ckpt", name), args=ocp.args.PyTreeSave(tree))
    try:
        emergency_worker(out, pid)
    except Exception:  # noqa: BLE001 - recorded; the other cases stay usable
        with open(os.path.join(out, f"emergency_failed_{pid}.txt"), "w") as f:
            f.write(traceback.format_exc())
    jax.distributed.shutdown()


def emergency_worker(out: str, pid: int) -> None:
    """The multi-tier (emergency) CheckpointManager: local per-process dirs + persistent."""
    import jax
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.multihost import multihost
    from orbax.checkpoint.experimental.emergency import checkpoint_manager as ecm

    multihost.initialize_runtime_to_distributed_ids()
    multihost.initialize_distributed_to_device_ids()
    base = os.path.join(out, "ckpt", "emergency")
    local = os.path.join(base, f"local_p{pid}")
    persistent = os.path.join(base, "persistent")
    os.makedirs(local, exist_ok=True)
    mesh, state = emergency_state(0)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
    options = ecm.CheckpointManagerOptions(
        local=ecm.LocalCheckpointOptions(save_interval_steps=1, max_to_keep=2),
        persistent=ecm.PersistentCheckpointOptions(save_interval_steps=2, max_to_keep=3),
        enable_async_checkpointing=False,
    )
    with ecm.CheckpointManager(local, persistent, mesh, abstract, options=options) as m:
        for step in range(4):
            _, state = emergency_state(step)
            m.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)))
            m.wait_until_finished()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_multiprocess(c: Corpus) -> None:
    import jax
    import orbax.checkpoint as ocp

    port = _free_port()
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, __file__, c.out, "--mp-worker", str(i), "--port", str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(2)]
    outs = []
    deadline = time.time() + 240
    for pr in procs:
        try:
            o, _ = pr.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError("multi-process save timed out") from None
        outs.append(o.decode(errors="replace"))
    if any(pr.returncode for pr in procs):
        raise RuntimeError("multi-process save failed:\n" + "\n----\n".join(o[-3000:] for o in outs))
    _record_emergency(c)
    # Orbax's own restore on this (single) process, with shardings on our 8 local devices.
    tree = mp_tree()
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)
    for name, kw in (("multiprocess_zarr3", {"use_zarr3": True}), ("multiprocess_zarr2", {})):
        p = c.path(name)
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**kw)) as ck:
            restored = ck.restore(p, args=ocp.args.PyTreeRestore(
                abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract)))
        c.record(name, restored, kind="item", layout="ocdbt", zarr=3 if kw else 2, processes=2)


def _record_emergency(c: Corpus) -> None:
    """Expected values for the emergency layout (the state is a known function of the step)."""
    import numpy as np

    base = c.path("emergency")
    errs = []
    for f in os.listdir(c.out):
        if f.startswith("emergency_failed_"):
            with open(os.path.join(c.out, f)) as fh:
                errs.append(fh.read())
    if errs or not os.path.isdir(base):
        c.failures["emergency"] = "\n".join(errs) or "no emergency checkpoint written"
        return
    found = []
    for tier in sorted(os.listdir(base)):
        for step_name in sorted(os.listdir(os.path.join(base, tier))):
            if not step_name.isdigit():
                continue
            step = int(step_name)
            expected = {"w": np.arange(32, dtype=np.float32).reshape(4, 8) + step,
                        "b": np.full(8, step, np.float32)}
            name = f"emergency_{tier}_{step}"
            c.record(name, expected, kind="step", rel=f"emergency/{tier}/{step_name}", item="state"
                     if tier.startswith("local") else "default", tier=tier, synthesized_expected=True)
            found.append(name)
    c.cases["emergency"] = {"kind": "info", "path": "ckpt/emergency", "steps": found}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-multiprocess", action="store_true")
    ap.add_argument("--mp-worker", type=int, default=None)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if a.mp_worker is not None:
        mp_worker(os.path.abspath(a.out), a.mp_worker, a.port)
        return 0
    _setup_jax(8)
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)
    c = Corpus(a.out)
    only = {s for s in a.only.split(",") if s}
    todo = [(n, f) for n, f in CASES.items() if not only or n in only]
    if not a.no_multiprocess and (not only or "multiprocess" in only):
        todo.append(("multiprocess", run_multiprocess))
    for name, fn in todo:
        t0 = time.time()
        try:
            fn(c)
        except Exception:  # noqa: BLE001 - recorded, reported, and failed on below
            c.failures[name] = traceback.format_exc()
        print(f"{name}: {time.time() - t0:.1f}s{' FAILED' if name in c.failures else ''}", file=sys.stderr)
    c.finish()
    for name, tb in c.failures.items():
        print(f"--- {name} failed:\n{tb}", file=sys.stderr)
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
