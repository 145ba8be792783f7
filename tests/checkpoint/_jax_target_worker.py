"""JAX-target restores on 8 CPU devices, compared with Orbax's restore of the same targets.

Usage: python _jax_target_worker.py CORPUS_DIR.  Prints one JSON object: check name -> list
of problems (empty list: passed).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # int64/float64 leaves keep their dtype

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ocdbt_py import checkpoint  # noqa: E402
from ocdbt_py.checkpoint import LeafMetadata  # noqa: E402
from ocdbt_py.kvstore import LocalStore  # noqa: E402

ROOT = Path(sys.argv[1])
INFO = json.loads((ROOT / "corpus.json").read_text())
MESH = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))  # not the 4x2 mesh of the save


def path(case: str) -> Path:
    return ROOT / INFO["cases"][case]["path"]


def spec_for(shape: tuple[int, ...]) -> P:
    if len(shape) >= 2 and shape[0] % 2 == 0 and shape[1] % 4 == 0:
        return P("x", "y")
    if len(shape) >= 1 and shape[0] % 4 == 0:
        return P("y")
    return P()


def abstract_targets(md: Any) -> Any:
    """ShapeDtypeStructs with shardings on MESH for every array leaf of a metadata tree."""
    def conv(m: Any) -> Any:
        if isinstance(m, LeafMetadata) and m.kind == "array":
            return jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=NamedSharding(MESH, spec_for(m.shape)))
        if isinstance(m, dict):
            out = {k: conv(v) for k, v in m.items()}
            return {k: v for k, v in out.items() if v is not None}
        if isinstance(m, list):
            return [conv(v) for v in m]
        return None
    return conv(md)


def flat(tree: Any) -> dict[str, Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(p): v for p, v in leaves}


def orbax_restore(p: Path, target: Any, **kw: Any) -> Any:
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**kw)) as c:
        return c.restore(p, args=ocp.args.PyTreeRestore(
            target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))


def same(ours: Any, theirs: Any, target: Any) -> list[str]:
    errs = []
    fo, ft, fg = flat(ours), flat(theirs), flat(target)
    if not set(fg) <= set(fo):
        return [f"leaves {sorted(fo)} lack some of target {sorted(fg)}"]
    for k, t in fg.items():
        a, b = fo[k], ft[k]
        if not isinstance(a, jax.Array):
            errs.append(f"{k}: not a jax.Array ({type(a).__name__})")
            continue
        if a.sharding != t.sharding:
            errs.append(f"{k}: sharding {a.sharding} != {t.sharding}")
        if a.dtype != t.dtype or a.shape != t.shape:
            errs.append(f"{k}: {a.dtype}{a.shape} != {t.dtype}{t.shape}")
        if not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=a.dtype.kind == "f"):
            errs.append(f"{k}: values differ from Orbax")
        for shard in a.addressable_shards:  # every device holds exactly its region
            if not np.array_equal(np.asarray(shard.data), np.asarray(b)[shard.index]):
                errs.append(f"{k}: shard on {shard.device} holds the wrong region")
                break
    return errs


CHECKS: dict[str, Callable[[], list[str]]] = {}


def check(fn: Callable[[], list[str]]) -> Callable[[], list[str]]:
    CHECKS[fn.__name__] = fn
    return fn


@check
def resharded_matches_orbax() -> list[str]:
    errs = []
    for case, kw in (("std_zarr2_ocdbt", {}), ("pytree_zarr3_ocdbt", {"use_zarr3": True}),
                     ("chunked_zarr3", {"use_zarr3": True}), ("perparam_zarr2", {"use_ocdbt": False}),
                     ("multiprocess_zarr2", {})):
        target = abstract_targets(checkpoint.metadata(path(case)))
        ours = checkpoint.restore(path(case), target)
        theirs = orbax_restore(path(case), target, **kw)
        errs += [f"{case}: {e}" for e in same(ours, theirs, target)]
    return errs


@check
def partial_subtree_and_cast() -> list[str]:
    p = path("pytree_zarr3_ocdbt")
    target = {"params": {"embed": jax.ShapeDtypeStruct((32, 4), jnp.float32,
                                                       sharding=NamedSharding(MESH, P(None, "y")))}}
    ours = checkpoint.restore(p, target)
    errs = []
    if set(ours) != {"params"} or set(ours["params"]) != {"embed"}:
        errs.append(f"partial restore returned {jax.tree_util.tree_structure(ours)}")
    full = checkpoint.restore(p)
    got = ours["params"]["embed"]
    if got.dtype != jnp.float32 or not np.array_equal(np.asarray(got), full["params"]["embed"].astype(np.float32)):
        errs.append("bf16 -> f32 cast wrong")
    if got.sharding != target["params"]["embed"].sharding:
        errs.append("sharding not applied")
    return errs


@check
def jax_array_target_and_numpy_leaves() -> list[str]:
    p = path("std_zarr2_ocdbt")
    like = jax.device_put(jnp.zeros((8, 16), jnp.float32), NamedSharding(MESH, P("x")))
    target = {"params": {"layer0": {"kernel": like, "bias": np.zeros(16, np.float16)}}, "py_int": 0,
              "s0_f32": jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(MESH, P()))}
    ours = checkpoint.restore(p, target)
    full = checkpoint.restore(p)
    errs = []
    k = ours["params"]["layer0"]["kernel"]
    if k.sharding != like.sharding or not np.array_equal(np.asarray(k), full["params"]["layer0"]["kernel"]):
        errs.append("jax.Array target")
    b = ours["params"]["layer0"]["bias"]
    if not isinstance(b, np.ndarray) or b.dtype != np.float16:
        errs.append(f"numpy target leaf gave {type(b).__name__} {getattr(b, 'dtype', None)}")
    if ours["py_int"] != full["py_int"] or type(ours["py_int"]) is not int:
        errs.append("python scalar target")
    if not isinstance(ours["s0_f32"], jax.Array) or float(ours["s0_f32"]) != 1.5:
        errs.append("0-d sharded target")
    return errs


@check
def prng_keys() -> list[str]:
    p = path("exotic_zarr3_nocompress")
    target = {"key": jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                                          sharding=NamedSharding(MESH, P())),
              "rawkey": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(MESH, P()))}
    ours = checkpoint.restore(p, target)
    errs = []
    if not jax.dtypes.issubdtype(ours["key"].dtype, jax.dtypes.prng_key):
        errs.append("typed key not restored as a key")
    elif not np.array_equal(jax.random.key_data(ours["key"]), jax.random.key_data(jax.random.key(0))):
        errs.append("typed key data wrong")
    if not np.array_equal(np.asarray(ours["rawkey"]), np.asarray(jax.random.PRNGKey(1))):
        errs.append("raw key wrong")
    return errs


class CountingStore(LocalStore):
    """Counts reads per key."""

    def __init__(self, root: str):
        super().__init__(root, read_only=True)
        self.counts: dict[str, int] = {}

    def get(self, key: str, byte_range: Any = None) -> bytes | None:
        self.counts[key] = self.counts.get(key, 0) + 1
        return super().get(key, byte_range)

    def local_path(self, key: str = "") -> str | None:
        return None  # no direct file reads: every read must come through get() to be counted


@check
def each_region_read_once_per_device_domain() -> list[str]:
    """8 devices, 8 distinct regions: each chunk file is read once, never the whole array per
    device.  (per-param dirs, so every chunk is its own file.)"""
    from ocdbt_py.checkpoint.restore import reader as reader_mod

    p = path("perparam_zarr3")
    md = checkpoint.metadata(p)["params"]["layer0"]["kernel"]  # (8, 16), chunks (2, 8): 8 chunks
    errs = []
    # Small arrays are read whole once and sliced in memory: every chunk once, for any mesh.
    # Large arrays (forced here) are read per device region: P("y", "x") on the 2x4 mesh gives
    # (2, 8) regions, one chunk each, every chunk read once; P("x", "y") gives (4, 4) regions:
    # each chunk overlaps two regions and is read twice.
    saved = reader_mod.SMALL_ARRAY_BYTES
    cases = ((P("x", "y"), 1, saved), (P("y", "x"), 1, 0), (P("x", "y"), 2, 0))
    for spec, times, small in cases:
        reader_mod.SMALL_ARRAY_BYTES = small
        store = CountingStore(str(p))
        target = {"params": {"layer0": {"kernel": jax.ShapeDtypeStruct(
            md.shape, md.dtype, sharding=NamedSharding(MESH, spec))}}}
        checkpoint.restore(store, target)
        chunk_reads = {k: n for k, n in store.counts.items() if k.startswith("params.layer0.kernel/c/")}
        if len(chunk_reads) != md.nchunks:
            errs.append(f"{spec}: {len(chunk_reads)} chunk files read, expected all {md.nchunks}")
        if any(n != times for n in chunk_reads.values()):
            errs.append(f"{spec}: chunks read other than {times}x: {chunk_reads}")
    reader_mod.SMALL_ARRAY_BYTES = saved
    # a single-device target of one row reads only the chunks of that row
    store2 = CountingStore(str(p))
    lazy = checkpoint.restore(store2, lazy=True)["params"]["layer0"]["kernel"]
    lazy[0:2, 0:8]
    touched = [k for k in store2.counts if k.startswith("params.layer0.kernel/c/")]
    if touched != ["params.layer0.kernel/c/0/0"]:
        errs.append(f"a (2, 8) region read {touched}")
    return errs


@check
def step_dir_targets_per_item() -> list[str]:
    root = path("manager")
    md = checkpoint.metadata(root)
    target = {"params": abstract_targets(md["params"])}
    ours = checkpoint.restore(root, target)
    full = checkpoint.restore(root)
    errs = []
    if set(ours) != {"params"}:
        errs.append(f"items {set(ours)}")
    for k, v in flat(ours["params"]).items():
        if not np.array_equal(np.asarray(v), flat(full["params"])[k]):
            errs.append(f"{k} differs")
    return errs


def main() -> int:
    results = {}
    for name, fn in CHECKS.items():
        try:
            results[name] = fn()
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = [traceback.format_exc()[-3000:]]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
