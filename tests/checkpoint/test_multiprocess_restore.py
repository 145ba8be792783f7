"""Two ``jax.distributed`` processes restore a 2-process checkpoint onto a global mesh."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoint.conftest import Corpus, subprocess_env

HERE = Path(__file__).resolve().parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_process_restore(orbax_corpus: Corpus) -> None:
    pytest.importorskip("jax")
    port = _port()
    procs = [subprocess.Popen([sys.executable, str(HERE / "_mp_restore_worker.py"), str(orbax_corpus.root),
                               str(i), str(port)], env=subprocess_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rc, out, err in outs:
        assert rc == 0, err[-4000:]
        res = json.loads(out.strip().splitlines()[-1])
        assert res["problems"] == [], res
