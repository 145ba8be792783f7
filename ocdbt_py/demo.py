"""The ``make demo`` job: an Orbax checkpoint on local disk, read back without TensorStore.

1. Orbax (with JAX on CPU, 8 virtual devices, in a child process) saves a sharded checkpoint
   into ``.demo/`` — the oracle's own output, written the way training jobs write it.
2. ocdbt-py inspects it like the ``ocdbt`` CLI does: versions, keys, ``verify``.
3. ``ocdbt_py.checkpoint.restore`` turns it into NumPy arrays (no JAX, no TensorStore in this
   process) and compares them with what was saved; ``metadata`` gives shapes without reading
   data; ``export_safetensors`` streams it to a safetensors file.
4. The other way round: ``ocdbt_py.checkpoint.save`` writes a NumPy tree (no JAX here) and
   Orbax, in a child process, restores it and compares every leaf.
5. A training loop with ``CheckpointManager`` (async saves, ``FixedInterval``, retention by
   ``LatestN`` and ``BestN`` on the loss); Orbax's own ``CheckpointManager`` lists the steps,
   picks the same best step and restores it.

Run: ``python -m ocdbt_py.demo [--dir .demo]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

_SAVE = textwrap.dedent(
    """
    import os, sys, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import numpy as np, jax, jax.numpy as jnp, ml_dtypes
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 128), dtype=np.float32)
    tree = {
        "params": {
            "dense": {"kernel": jax.device_put(w, NamedSharding(mesh, P("data", "model"))),
                      "bias": jnp.arange(128, dtype=jnp.bfloat16)},
            "embed": jax.device_put(rng.standard_normal((64, 32)).astype(np.float16),
                                    NamedSharding(mesh, P(None, "model"))),
        },
        "step": 1000,
        "lr": np.float32(3e-4),
        "mask": np.array([True, False, True]),
        "name": "demo-run",
    }
    path = sys.argv[1]
    ocp.PyTreeCheckpointer().save(path, tree)
    saved = {
        "params.dense.kernel": w.tolist(),
        "params.dense.bias": np.arange(128).astype(ml_dtypes.bfloat16).astype(np.float32).tolist(),
    }
    json.dump(saved, open(path + ".expected.json", "w"))
    """
)


_ORBAX_MANAGER = textwrap.dedent(
    """
    import sys, json
    import numpy as np
    import orbax.checkpoint as ocp
    root, want = sys.argv[1], json.loads(sys.argv[2])
    opts = ocp.CheckpointManagerOptions(best_fn=lambda m: m["loss"], best_mode="min")
    with ocp.CheckpointManager(root, options=opts) as mgr:
        best = mgr.best_step()
        got = mgr.restore(best, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(), config=ocp.args.JsonRestore()))
        ok = (mgr.all_steps() == want["steps"] and best == want["best"]
              and np.array_equal(np.asarray(got["params"]["w"]), np.full((64, 64), best, np.float32))
              and got["config"] == {"lr": 0.1, "step": best})
        print("Orbax's CheckpointManager: steps", mgr.all_steps(), "best", best, "->",
              "matches" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)
    """
)


_ORBAX_RESTORE = textwrap.dedent(
    """
    import sys, json
    import numpy as np, ml_dtypes
    import orbax.checkpoint as ocp
    got = ocp.PyTreeCheckpointer().restore(sys.argv[1])
    want = json.load(open(sys.argv[2]))
    ok = (np.array_equal(np.asarray(got["w"], dtype=np.float32), np.array(want["w"], dtype=np.float32))
          and np.asarray(got["emb"]).dtype == ml_dtypes.bfloat16
          and np.array_equal(np.asarray(got["emb"]).astype(np.float32), np.array(want["emb"], dtype=np.float32))
          and int(got["step"]) == want["step"] and got["tag"] == want["tag"])
    print("Orbax restored", {k: getattr(v, "shape", v) for k, v in got.items()}, "->",
          "matches" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)
    """
)


def _step(n: int, text: str) -> None:
    print(f"\n== {n}. {text}")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".demo", help="working directory on local disk")
    args = ap.parse_args(argv)

    import numpy as np

    import ocdbt_py
    from ocdbt_py import checkpoint
    from ocdbt_py.maintenance.verify import verify

    work = os.path.abspath(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ckpt = os.path.join(work, "ckpt")

    _step(1, f"Orbax saves a sharded checkpoint to {ckpt}")
    t = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-c", _SAVE, ckpt], check=True)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        print(f"could not run Orbax to make the demo checkpoint ({e}); is it installed? "
              "`make demo` installs it into .venv.")
        return 1
    print(f"saved in {time.perf_counter() - t:.1f} s; files:")
    for root, _, files in sorted(os.walk(ckpt)):
        for f in sorted(files)[:4]:
            rel = os.path.relpath(os.path.join(root, f), ckpt)
            print(f"  {rel}  ({os.path.getsize(os.path.join(root, f))} bytes)")

    _step(2, "ocdbt-py opens the OCDBT database at the checkpoint's root")
    db = ocdbt_py.open(ckpt)
    info = db.info()
    print(f"generation {info['generation']}, {info['num_keys']} keys, "
          f"{info['num_indirect_value_bytes']} out-of-line value bytes, config {info['config']}")
    for entry in list(db.entries())[:6]:
        loc = entry.location
        where = "inline" if loc is None else f"{loc.file.path.decode()}:{loc.offset}"
        print(f"  {entry.key.decode():40s} {entry.size:8d}  {where}")
    report = verify(ckpt)
    print(f"verify: {'clean' if report.ok else 'PROBLEMS'} "
          f"({report.nodes} nodes, {report.versions} versions, {report.data_files} data files checked)")
    if not report.ok:
        for p in report.problems:
            print("  ", p)
        return 1

    _step(3, "checkpoint.metadata: shapes and dtypes without reading array data")
    meta = checkpoint.metadata(ckpt)
    print(json.dumps(_summarise(meta), indent=2, default=str)[:1500])

    _step(4, "checkpoint.restore: NumPy arrays, no JAX or TensorStore in this process")
    t = time.perf_counter()
    tree = checkpoint.restore(ckpt)
    print(f"restored in {time.perf_counter() - t:.3f} s")
    with open(ckpt + ".expected.json") as fh:
        expected = json.load(fh)
    kernel = tree["params"]["dense"]["kernel"]
    bias = tree["params"]["dense"]["bias"]
    ok = (np.array_equal(kernel, np.array(expected["params.dense.kernel"], dtype=np.float32))
          and np.array_equal(bias.astype(np.float32), np.array(expected["params.dense.bias"], dtype=np.float32))
          and tree["step"] == 1000 and tree["name"] == "demo-run")
    print(f"kernel {kernel.shape} {kernel.dtype}, bias {bias.shape} {bias.dtype}, "
          f"step={tree['step']!r}, name={tree['name']!r}: {'matches' if ok else 'MISMATCH'} what Orbax saved")
    loaded = [m for m in ("jax", "tensorstore") if m in sys.modules]
    print(f"modules loaded in this process from JAX/TensorStore: {loaded or 'none'}")

    _step(5, "export_safetensors: stream the checkpoint to a safetensors file")
    out = os.path.join(work, "model.safetensors")
    checkpoint.export_safetensors(ckpt, out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")

    _step(6, "checkpoint.save: a NumPy tree, no JAX, written the way Orbax writes it; Orbax restores it")
    import ml_dtypes

    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, 64), dtype=np.float32)
    emb = rng.standard_normal((100, 16)).astype(ml_dtypes.bfloat16)
    mine = {"w": w, "emb": emb, "step": 2000, "tag": "saved-by-ocdbt-py"}
    ours = os.path.join(work, "ours")
    t = time.perf_counter()
    checkpoint.save(ours, mine)
    print(f"saved in {time.perf_counter() - t:.3f} s; JAX loaded: {'jax' in sys.modules}")
    want = os.path.join(work, "ours.expected.json")
    with open(want, "w") as fh:
        json.dump({"w": w.tolist(), "emb": emb.astype(np.float32).tolist(), "step": 2000,
                   "tag": "saved-by-ocdbt-py"}, fh)
    back = subprocess.run([sys.executable, "-c", _ORBAX_RESTORE, ours, want])

    _step(7, "CheckpointManager: a training loop with async saves and retention; Orbax's manager reads it")
    from ocdbt_py.checkpoint.manager import BestN, CheckpointManager, FixedInterval, KeepAnyOf, LatestN

    root = os.path.join(work, "run")
    losses = [5.0, 3.0, 1.0, 2.0, 4.0, 3.5, 6.0]
    t = time.perf_counter()
    with CheckpointManager(root, save_policy=FixedInterval(10),
                           preservation=KeepAnyOf(LatestN(2), BestN(1, "loss"))) as mgr:
        for step in range(70):
            params = {"w": np.full((64, 64), step, np.float32)}
            mgr.save(step, {"params": params, "config": checkpoint.JsonItem({"lr": 0.1, "step": step})},
                     metrics={"loss": losses[step // 10]})
        mgr.wait_until_finished()
        steps, best = mgr.all_steps(), mgr.best_step()
    print(f"70 steps, saved every 10, in {time.perf_counter() - t:.2f} s; kept {steps}, best {best}")
    managed = subprocess.run([sys.executable, "-c", _ORBAX_MANAGER, root, json.dumps({"steps": steps, "best": best})])
    return 0 if ok and not loaded and back.returncode == 0 and managed.returncode == 0 else 1


def _summarise(tree: object) -> object:
    if isinstance(tree, dict):
        return {k: _summarise(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_summarise(v) for v in tree]
    shape = getattr(tree, "shape", None)
    dtype = getattr(tree, "dtype", None)
    if shape is not None:
        return f"{dtype}{list(shape)}"
    return repr(tree)


if __name__ == "__main__":
    raise SystemExit(main())
