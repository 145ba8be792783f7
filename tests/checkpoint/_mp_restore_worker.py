"""One of two ``jax.distributed`` processes restoring a checkpoint onto a global mesh.

Usage: python _mp_restore_worker.py CORPUS_DIR PROCESS_ID PORT.  Each process restores the
2-process corpus checkpoints with targets sharded over all 8 devices (4 per process), checks
that it holds only its own shards and that they equal Orbax's recorded restore, and prints a
JSON list of problems.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
ROOT, PID, PORT = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=2, process_id=PID)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "conformance" / "checkpoint"))
from _expected import load_expected  # noqa: E402

from ocdbt_py import checkpoint  # noqa: E402


def main() -> list[str]:
    info = json.loads((ROOT / "corpus.json").read_text())["cases"]
    # a 2x4 mesh over both processes, transposed relative to the save's 4x2
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
    errs = []
    for case in ("multiprocess_zarr3", "multiprocess_zarr2"):
        path = ROOT / info[case]["path"]
        expected = load_expected(str(ROOT / info[case]["expected"]))["tree"]
        md = checkpoint.metadata(path)
        target = {
            "kernel": jax.ShapeDtypeStruct(md["kernel"].shape, md["kernel"].dtype,
                                           sharding=NamedSharding(mesh, P("a", "b"))),
            "embed": jax.ShapeDtypeStruct(md["embed"].shape, md["embed"].dtype,
                                          sharding=NamedSharding(mesh, P("b"))),
            "bias": jax.ShapeDtypeStruct(md["bias"].shape, md["bias"].dtype, sharding=NamedSharding(mesh, P())),
        }
        got = checkpoint.restore(path, target)
        for k, t in target.items():
            a = got[k]
            want = expected[k].value
            if a.sharding != t.sharding or a.shape != want.shape or a.dtype != want.dtype:
                errs.append(f"{case}.{k}: {a.dtype}{a.shape} {a.sharding}")
                continue
            if a.is_fully_addressable and k != "bias":
                errs.append(f"{case}.{k}: expected a multi-process array")
            shards = a.addressable_shards
            if {s.device for s in shards} != set(jax.local_devices()):
                errs.append(f"{case}.{k}: shards on {[s.device for s in shards]}")
            for s in shards:
                if not np.array_equal(np.asarray(s.data), want[s.index]):
                    errs.append(f"{case}.{k}: wrong data for {s.index} on {s.device}")
        plain = checkpoint.restore(path)  # NumPy restore works on every process as well
        if not np.array_equal(plain["kernel"], expected["kernel"].value):
            errs.append(f"{case}: numpy restore differs")
    return errs


if __name__ == "__main__":
    problems = main()
    print(json.dumps({"process": PID, "problems": problems}))
    jax.distributed.shutdown()
