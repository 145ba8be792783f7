"""What a GCS restore cannot avoid on this machine: receiving the bytes, next to ours (issue 20).

Usage::

    python bench/gcs_floor.py [--dir /tmp/bench_ckpt] [--case big] [--repeat 4]

Uploads ``<dir>/full/<case>`` (a checkpoint of ``bench_restore.py``) to fake-gcs-server on
127.0.0.1, then alternates, in fresh processes:

* **receive**: a bare HTTP client (``http.client``, 2 connections, one per core) fetching every
  data file in 16 MiB ranges with ``readinto`` into one reused buffer per connection: the bytes
  crossing the socket and nothing else (no decode, no output pages);
* **ours**: ``checkpoint.restore("gs://...")`` as ``bench_gcs_azure.py`` measures it.

Each row gives the client's wall time and CPU seconds and the emulator's CPU seconds for
that run (the emulator shares the cores).  The floor of a restore is the receive row plus
decoding and first-touch faults of the outputs, which ``floor.py`` measures locally for the
same checkpoint (``big``: 1.21–1.27 CPU-s in session 6).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from bench_gcs_azure import BUCKET, _tree_cpu  # noqa: E402
from common import upload_dir  # noqa: E402

STEP = 16 << 20

_RECEIVE = r'''
import http.client, json, resource, sys, threading, time, urllib.parse
host, port, bucket, step = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[5])
jobs = [(n, off, min(step, size - off)) for n, size in json.loads(sys.argv[4]) for off in range(0, size, step)]
lock = threading.Lock()
def worker():
    conn = http.client.HTTPConnection(host, port)
    buf = memoryview(bytearray(step))
    while True:
        with lock:
            if not jobs:
                return
            name, off, n = jobs.pop()
        conn.request("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media",
                     headers={"Range": f"bytes={off}-{off + n - 1}"})
        r = conn.getresponse()
        got = 0
        while got < n:
            k = r.readinto(buf[got:n])
            if not k:
                break
            got += k
        r.read()
        if got != n:
            raise SystemExit(f"short read: {got} of {n}")
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
threads = [threading.Thread(target=worker) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "cpu_seconds": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime}))
'''


def _run(argv: list[str], env: dict[str, str], emulator_pid: int) -> dict[str, Any]:
    e0 = _tree_cpu(emulator_pid)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    out["emulator_cpu"] = _tree_cpu(emulator_pid) - e0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/bench_ckpt")
    ap.add_argument("--case", default="big")
    ap.add_argument("--repeat", type=int, default=4)
    a = ap.parse_args()
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs

    from tests.objectstores import servers

    root = Path(a.dir) / "full" / a.case
    if not (root / "_METADATA").exists():
        raise SystemExit(f"{root} is missing: run bench/bench_restore.py --dir {a.dir} first")
    files = [(f"{a.case}/{p.relative_to(root).as_posix()}", p.stat().st_size) for p in sorted(root.rglob("*"))
             if p.is_file() and "/d/" in f"/{p.relative_to(root).as_posix()}"]
    srv = servers.start_gcs()
    try:
        srv.make_bucket(BUCKET)
        os.environ.update(srv.env())
        fs = gcsfs.GCSFileSystem(skip_instance_cache=True, **srv.storage_options())
        upload_dir(fs, root, f"{BUCKET}/{a.case}")
        host, port = srv.endpoint.split("//")[1].split(":")
        env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
        sides = {
            "receive": [sys.executable, "-c", _RECEIVE, host, port, BUCKET, json.dumps(files), str(STEP)],
            "ours": [sys.executable, str(HERE / "bench_gcs_azure.py"), "--worker", "ours",
                     f"gs://{BUCKET}/{a.case}", json.dumps(srv.storage_options())],
        }
        rows = []
        for i in range(a.repeat):
            for side, argv in sides.items():
                r = _run(argv, env, srv.proc.proc.pid)
                rows.append((side, i + 1, r))
                print(f"# {side} round {i + 1}: {r['seconds']:.3f} s", file=sys.stderr)
    finally:
        srv.stop()
    print(f"GCS {a.case}: {sum(n for _, n in files) / 2**20:.0f} MiB of data files; load {os.getloadavg()[0]:.1f}\n")
    print("| side | round | wall s | client CPU s | emulator CPU s |")
    print("|---|---:|---:|---:|---:|")
    for side, i, r in rows:
        print(f"| {side} | {i} | {r['seconds']:.3f} | {r['cpu_seconds']:.2f} | {r['emulator_cpu']:.2f} |")


if __name__ == "__main__":
    main()
