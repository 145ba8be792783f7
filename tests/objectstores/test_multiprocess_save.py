"""A real 2-process ``jax.distributed`` job saves one checkpoint straight to the S3 server and
to the Azure emulator (each process writes its own OCDBT database there, the primary merges);
our reader restores it."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.objectstores import servers
from tests.objectstores.mp_values import global_values

pytest.importorskip("jax")

PROCESSES = 2
BUCKET = "ocdbt-mp"
_n = itertools.count()


def _run(urls: list[str], env_extra: dict[str, str]) -> None:
    port = servers._free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "STORAGE_EMULATOR"))}
    env.update(env_extra)
    env["PYTHONPATH"] = str(servers.REPO) + os.pathsep + env.get("PYTHONPATH", "")
    worker = str(servers.REPO / "tests" / "objectstores" / "_mp_save_worker.py")
    procs = [
        subprocess.Popen([sys.executable, worker, json.dumps(urls), str(PROCESSES), str(i), str(port), "2"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(PROCESSES)
    ]
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err.decode()[-3000:]
            assert json.loads(out.decode().strip().splitlines()[-1])["ok"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_multiprocess_save_to_s3_and_azure(s3_server: servers.S3Server, azure_server: servers.AzureServer) -> None:
    """One job saves to both stores (one JAX start-up for both)."""
    from ocdbt_py import checkpoint
    from ocdbt_py.kvstore import open_kvstore

    n = next(_n)
    targets = [(f"s3://{BUCKET}/mp{n}", s3_server), (f"az://{BUCKET}/mp{n}", azure_server)]
    env: dict[str, str] = {}
    for _, srv in targets:
        srv.make_bucket(BUCKET)
        env.update(srv.env())
    _run([u for u, _ in targets], env)
    for url, srv in targets:
        store = open_kvstore(url, srv.storage_options())
        keys = set(store.list())
        assert {f"ocdbt.process_{i}/manifest.ocdbt" for i in range(PROCESSES)} <= keys, url
        assert "commit_success.txt" in keys and "_METADATA" in keys
        assert not [k for k in keys if "orbax-checkpoint-tmp" in k]
        got = checkpoint.restore(url, storage_options=srv.storage_options())
        for k, v in global_values().items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), (url, k)
        assert got["step"] == 3
