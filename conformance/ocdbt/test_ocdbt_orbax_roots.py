"""Orbax checkpoints' OCDBT databases: the merged item root and the per-process database.

A small pytree (sharded over 8 host CPU devices) is saved by orbax-checkpoint in a subprocess
(JAX is slow to import and needs its device count set before import).  Its merged root
(``manifest.ocdbt`` whose leaves reference ``ocdbt.process_0/d/...`` through non-empty base
paths) and ``ocdbt.process_0/`` itself are then read by ocdbt-py and compared with
TensorStore's reads of the same databases.  OCDBT roots in the checkpoint corpus committed
under ``conformance/fixtures/checkpoint`` (older Orbax versions) are checked the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ocdbt_oracle import check_store, oracle_from_tensorstore

import ocdbt_py

pytestmark = [pytest.mark.orbax, pytest.mark.tensorstore, pytest.mark.timeout(600)]

SAVE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import orbax.checkpoint as ocp

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    # 4 KiB shards of incompressible floats: stored out of line (Orbax inlines <= 1024 bytes)
    w = jax.device_put(rng.standard_normal((128, 64)).astype(np.float32),
                       NamedSharding(mesh, P("data", "model")))
    b = jax.device_put(jnp.linspace(0, 1, 16, dtype=jnp.float32), NamedSharding(mesh, P()))
    tree = {
        "params": {"w": w, "b": b, "emb": jnp.ones((300, 8), jnp.bfloat16)},
        "step": jnp.asarray(7, jnp.int32),
        "scale": np.float64(0.5),
        "mask": np.array([True, False, True]),
    }
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(sys.argv[1], "ckpt"), tree)
    ckptr.wait_until_finished()
    ckptr.close()
    """
)


@pytest.fixture(scope="module")
def orbax_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tensorstore")
    pytest.importorskip("orbax.checkpoint")
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("orbax")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", SAVE_SCRIPT, str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out / "ckpt"


def test_orbax_merged_root(orbax_checkpoint: Path) -> None:
    root = orbax_checkpoint
    assert (root / "manifest.ocdbt").is_file() and (root / "ocdbt.process_0" / "manifest.ocdbt").is_file()
    oracle = oracle_from_tensorstore(str(root))
    check_store(str(root), oracle)
    db = ocdbt_py.open(root)
    keys = list(db.list())
    assert any(k.endswith(b"/.zarray") or k.endswith(b"/zarr.json") for k in keys)
    # the merged root references the per-process database's data files through base paths
    bases = {e.location.file.base_path for e in db.entries() if e.location is not None}
    assert bases == {b"ocdbt.process_0/"}
    # Orbax's write options are visible in the config
    assert db.config.max_inline_value_bytes == 1024


def test_orbax_per_process_database(orbax_checkpoint: Path) -> None:
    proc0 = orbax_checkpoint / "ocdbt.process_0"
    oracle = oracle_from_tensorstore(str(proc0))
    check_store(str(proc0), oracle)
    merged = dict(ocdbt_py.open(orbax_checkpoint).items())
    assert dict(ocdbt_py.open(proc0).items()) == merged


def test_zarr_python_reads_the_checkpoint_through_ocdbt_zarr_store(orbax_checkpoint: Path) -> None:
    """zarr-python opens the arrays of the checkpoint Orbax (the installed version) just wrote
    through :class:`OcdbtZarrStore` over its merged root, and reads what TensorStore reads."""
    zarr = pytest.importorskip("zarr")
    import json

    import numpy as np
    import tensorstore as ts

    from ocdbt_py.bridges import OcdbtZarrStore

    store = OcdbtZarrStore(str(orbax_checkpoint), read_only=True)
    read = 0
    for key in store.db.list():
        name, _, leaf = key.decode().rpartition("/")
        if leaf not in ("zarr.json", ".zarray"):
            continue
        meta = json.loads(store.db[key])
        if "bfloat16" in json.dumps(meta.get("data_type", meta.get("dtype"))):
            continue  # a dtype zarr-python does not know
        fmt = 3 if leaf == "zarr.json" else 2
        got = zarr.open_array(store, path=name, mode="r", zarr_format=fmt)[...]
        want = ts.open({"driver": "zarr3" if fmt == 3 else "zarr",
                        "kvstore": {"driver": "ocdbt", "base": f"file://{orbax_checkpoint}/", "path": f"{name}/"}}
                       ).result().read().result()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)
        read += 1
    assert read >= 4  # w (sharded over 8 devices), b, step, scale, mask


CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoint"


def _corpus_roots() -> list[Path]:
    if not CORPUS.is_dir():
        return []
    return sorted(p.parent for p in CORPUS.rglob("manifest.ocdbt"))


@pytest.mark.parametrize(
    "root", _corpus_roots(), ids=lambda p: str(p.relative_to(CORPUS)) if isinstance(p, Path) else str(p)
)
def test_checkpoint_corpus_ocdbt_roots(root: Path) -> None:
    """Every OCDBT database in the committed Orbax checkpoint corpus reads like TensorStore."""
    pytest.importorskip("tensorstore")
    check_store(str(root), oracle_from_tensorstore(str(root), probes=False), deep=False)
