"""Write small checkpoints with an *older* Orbax release, plus what that release restores.

The committed fixtures under ``conformance/fixtures/checkpoint/orbax-<version>/`` were made
with this script, each in its own venv (the versions pair Orbax with the JAX of its time)::

    python3.11 -m venv /tmp/orbax05
    /tmp/orbax05/bin/pip install "orbax-checkpoint==0.5.10" "jax[cpu]==0.4.26" "numpy<2" \
        "tensorstore==0.1.58"
    /tmp/orbax05/bin/python conformance/checkpoint/gen_legacy_fixtures.py \
        conformance/fixtures/checkpoint/orbax-0.5.10

    python3.11 -m venv /tmp/orbax09
    /tmp/orbax09/bin/pip install "orbax-checkpoint==0.9.1" "jax[cpu]==0.4.35"
    /tmp/orbax09/bin/python conformance/checkpoint/gen_legacy_fixtures.py \
        conformance/fixtures/checkpoint/orbax-0.9.1

    python3.11 -m venv /tmp/orbax011
    /tmp/orbax011/bin/pip install "orbax-checkpoint==0.11.5" "jax[cpu]==0.5.0"
    /tmp/orbax011/bin/python conformance/checkpoint/gen_legacy_fixtures.py \
        conformance/fixtures/checkpoint/orbax-0.11.5

Arrays are tiny so that every fixture stays a few KB.  Each case's record in
``corpus.json`` names the layout; ``expected/<case>.json`` holds that Orbax release's own
restore (see ``_expected.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

try:
    from importlib.metadata import version as _pkg_version

    ORBAX_VERSION = _pkg_version("orbax-checkpoint")
except Exception:  # noqa: BLE001
    ORBAX_VERSION = "unknown"

from _expected import Encoder  # noqa: E402

MESH = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def put(x: Any, *spec: Any) -> Any:
    return jax.device_put(x, NamedSharding(MESH, P(*spec)))


def tree() -> dict:
    return {
        "params": {
            "kernel": put(jnp.arange(32, dtype=jnp.float32).reshape(4, 8) / 4, "data", "model"),
            "bias": put(jnp.linspace(-1, 1, 8, dtype=jnp.float32)),
            "embed": put((jnp.arange(16, dtype=jnp.float32).reshape(8, 2) - 5).astype(jnp.bfloat16), "data"),
        },
        "counts": put(jnp.arange(8, dtype=jnp.int32), "data"),
        "flag": jnp.array([True, False]),
        "scale": jnp.float32(0.5),
        "np_arr": np.arange(3, dtype=np.float64),
        "step": 7,
        "lr": 0.125,
        "name": "legacy",
        "layers": [jnp.ones(2, jnp.float16), 4],
    }


def save(path: str, t: Any, save_args: Any = None, **kw: Any) -> None:
    h = ocp.PyTreeCheckpointHandler(**kw)
    with ocp.Checkpointer(h) as c:
        if hasattr(ocp, "args"):
            c.save(path, args=ocp.args.PyTreeSave(t, save_args=save_args))
        else:
            c.save(path, t, save_args=save_args)


def restore(path: str, **kw: Any) -> Any:
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**kw)) as c:
        return c.restore(path)


def handler_accepts(name: str) -> bool:
    import inspect

    return name in inspect.signature(ocp.PyTreeCheckpointHandler.__init__).parameters


def main() -> int:
    out = os.path.abspath(sys.argv[1])
    shutil.rmtree(out, ignore_errors=True)
    ck = os.path.join(out, "ckpt")
    exp = os.path.join(out, "expected")
    os.makedirs(ck)
    os.makedirs(exp)
    cases: dict[str, dict] = {}
    failures: dict[str, str] = {}

    def record(name: str, restored: Any, **info: Any) -> None:
        Encoder(exp, name).write(restored)
        cases[name] = {"path": f"ckpt/{name}", "expected": f"expected/{name}.json", **info}

    def run(name: str, fn: Any) -> None:
        try:
            fn(name)
        except Exception:  # noqa: BLE001 - reported below
            failures[name] = traceback.format_exc()

    def pytree_ocdbt(name: str) -> None:
        p = os.path.join(ck, name)
        save(p, tree())
        record(name, restore(p), layout="ocdbt", zarr=2)

    def pytree_dirs(name: str) -> None:
        p = os.path.join(ck, name)
        save(p, tree(), use_ocdbt=False)
        record(name, restore(p, use_ocdbt=False), layout="dirs", zarr=2)

    def pytree_zarr3(name: str) -> None:
        if not handler_accepts("use_zarr3"):
            raise RuntimeError("this Orbax has no use_zarr3")
        p = os.path.join(ck, name)
        t = tree()
        save_args = jax.tree_util.tree_map(lambda _: ocp.SaveArgs(), t)
        fields = ocp.SaveArgs.__dataclass_fields__
        if "write_chunk_shape" in fields:  # Orbax 0.5: shards with several inner chunks
            save_args["params"]["kernel"] = ocp.SaveArgs(write_chunk_shape=(1, 4), read_chunk_shape=(1, 2))
        save(p, t, save_args=save_args, use_zarr3=True)
        record(name, restore(p, use_zarr3=True), layout="ocdbt", zarr=3)

    def aggregate(name: str) -> None:
        # Orbax <= 0.5: SaveArgs(aggregate=True) keeps values inline in the msgpack file.
        p = os.path.join(ck, name)
        t = tree()
        save_args = jax.tree_util.tree_map(lambda _: ocp.SaveArgs(), t)
        for k in ("np_arr", "step", "lr", "scale", "name"):
            save_args[k] = ocp.SaveArgs(aggregate=True)
        save(p, t, save_args=save_args)
        if not os.path.exists(os.path.join(p, "checkpoint")):
            shutil.rmtree(p)
            raise RuntimeError("this Orbax writes no msgpack file")
        record(name, restore(p), layout="ocdbt", zarr=2, msgpack=True)
        # The same without _METADATA: only the msgpack file gives the structure (Orbax < 0.4).
        p2 = os.path.join(ck, name + "_no_metadata")
        shutil.copytree(p, p2)
        os.remove(os.path.join(p2, "_METADATA"))
        record(name + "_no_metadata", restore(p2), layout="ocdbt", zarr=2, msgpack=True)

    def manager(name: str) -> None:
        root = os.path.join(ck, name)
        opts = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
        small = {"w": jnp.arange(4, dtype=jnp.float32), "n": 1}
        if hasattr(ocp, "args"):
            with ocp.CheckpointManager(root, options=opts, item_names=("state", "meta")) as m:
                for s in (1, 2, 3):
                    m.save(s, args=ocp.args.Composite(
                        state=ocp.args.StandardSave({**small, "w": small["w"] + s}),
                        meta=ocp.args.JsonSave({"step": s})))
                r = m.restore(3)
                restored = {k: r[k] for k in r.keys()}  # noqa: SIM118 - a Composite, not a dict
                steps = list(m.all_steps())
        else:
            raise RuntimeError("no ocp.args")
        record(name, restored, kind="root", steps=steps)

    for name, fn in (("pytree_ocdbt", pytree_ocdbt), ("pytree_dirs", pytree_dirs), ("pytree_zarr3", pytree_zarr3),
                     ("aggregate", aggregate), ("manager", manager)):
        run(name, fn)
    with open(os.path.join(out, "corpus.json"), "w") as f:
        json.dump({"orbax_version": ORBAX_VERSION, "jax_version": jax.__version__, "cases": cases,
                   "not_written": {k: v.strip().splitlines()[-1] for k, v in failures.items()}}, f, indent=1)
    for k, v in failures.items():
        print(f"--- {k} not written:\n{v}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
