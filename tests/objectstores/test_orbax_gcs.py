"""Orbax-compatible checkpoints on the GCS emulator, in both directions: Orbax (through
TensorStore's own gcs driver, pointed at the emulator by ``TENSORSTORE_GCS_HTTP_URL``) restores
a checkpoint ``checkpoint.save`` wrote to ``gs://``, and we restore one Orbax saved there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ocdbt_py import checkpoint
from tests.objectstores import servers

pytest.importorskip("orbax.checkpoint")

BUCKET = "ocdbt-orbax"

_ORBAX = r"""
import json, sys
import numpy as np, jax, orbax.checkpoint as ocp
ours, theirs = sys.argv[1], sys.argv[2]
with ocp.PyTreeCheckpointer() as c:
    meta = c.metadata(ours)
    tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
    args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    got = c.restore(ours, args=ocp.args.PyTreeRestore(restore_args=args))
with ocp.StandardCheckpointer() as c:
    c.save(theirs, {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "n": {"i": np.arange(5, dtype=np.int64)}})
print(json.dumps({jax.tree_util.keystr(p): np.asarray(v).tolist()
                  for p, v in jax.tree_util.tree_leaves_with_path(got)}))
"""


def test_orbax_round_trip_on_gcs_emulator(gcs_server: servers.GcsServer) -> None:
    gcs_server.make_bucket(BUCKET)
    ours, theirs = f"gs://{BUCKET}/ours", f"gs://{BUCKET}/theirs"
    tree = {"a": np.arange(10, dtype=np.float32), "b": {"c": np.full((3, 4), 7, np.int32)}}
    checkpoint.save(ours, tree, storage_options=gcs_server.storage_options())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR"))}
    env.update(gcs_server.env())
    env.update({"TENSORSTORE_GCS_HTTP_URL": gcs_server.endpoint, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
                "JAX_PLATFORMS": "cpu"})
    p = subprocess.run([sys.executable, "-c", _ORBAX, ours, theirs], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"['a']": list(range(10)), "['b']['c']": [[7] * 4] * 3}
    back = checkpoint.restore(theirs, storage_options=gcs_server.storage_options())
    np.testing.assert_array_equal(back["w"], np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(back["n"]["i"], np.arange(5, dtype=np.int64))
