"""zarr-python reading through :class:`~ocdbt_py.bridges.OcdbtZarrStore` vs its own ``LocalStore``.

Usage::

    python bench/bench_zarr_store.py [--dir /tmp/bench_zarr_store] [--size-mib 256] [--chunks 1024]
                                     [--repeat 5] [--json out.json]

One array of ``--size-mib`` MiB of float32 in ``--chunks`` chunks (256 KiB each by default) is
written by zarr-python twice, with the same metadata and bytes: once to a directory through
zarr-python's ``LocalStore``, once into an OCDBT database through ``OcdbtZarrStore``.  Each
case then times ``zarr.open_array(store, mode="r")[:]`` (a fresh store each time, page cache
warm), both stores alternating in the same process: best wall time of ``--repeat``, the median
of the per-round ratios (each round's two reads run back to back) and process CPU time (the
machine is often shared: CPU time moves least with load).  Two codec settings:
``raw`` (no compressor: the store's overhead is all that differs) and ``zstd`` (zarr-python's
default, level 0).  Issue 30's target: ours / LocalStore <= 1.25x.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore

from ocdbt_py.bridges import OcdbtZarrStore


def _write(dirpath: Path, size_mib: int, chunks: int, codec: str) -> tuple[Any, Any]:
    n = size_mib * (1 << 20) // 4
    per = n // chunks
    rng = np.random.default_rng(0)
    # rounded floats: zstd finds something to compress, as with real weights' low mantissa bits
    data = rng.standard_normal(n).astype(np.float32).round(3).reshape(chunks, per)
    compressors: Any = None if codec == "raw" else ZstdCodec(level=0)
    local = dirpath / f"local_{codec}"
    ocdbt = dirpath / f"ocdbt_{codec}"
    for p in (local, ocdbt):
        shutil.rmtree(p, ignore_errors=True)
    for store in (LocalStore(str(local)), OcdbtZarrStore(str(ocdbt))):
        a = zarr.create_array(store, shape=data.shape, dtype=data.dtype, chunks=(1, per), compressors=compressors)
        a[:] = data
    return (lambda: LocalStore(str(local), read_only=True)), (lambda: OcdbtZarrStore(str(ocdbt), read_only=True))


def _read(make: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process) of one full read."""
    gc.collect()
    c = time.process_time()
    t = time.perf_counter()
    out = zarr.open_array(make(), mode="r")[:]
    dt = time.perf_counter() - t
    assert out.size > 0
    return dt, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/bench_zarr_store")
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--codecs", default="raw,zstd")
    ap.add_argument("--json")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"load": os.getloadavg()[0], "cases": {}}
    print(f"| case | OcdbtZarrStore | LocalStore | ours / LocalStore |   (load {results['load']:.2f})")
    print("|---|---:|---:|---:|")
    for codec in args.codecs.split(","):
        local, ocdbt = _write(d, args.size_mib, args.chunks, codec)
        _read(local), _read(ocdbt)  # warm the page cache and imports
        ts_local: list[tuple[float, float]] = []
        ts_ours: list[tuple[float, float]] = []
        for i in range(args.repeat):
            order = [(local, ts_local), (ocdbt, ts_ours)]
            for make, acc in order if i % 2 == 0 else order[::-1]:
                acc.append(_read(make))
        ours, peer = min(w for w, _ in ts_ours), min(w for w, _ in ts_local)
        cpu_ours, cpu_peer = min(c for _, c in ts_ours), min(c for _, c in ts_local)
        # each round's two reads ran back to back: their ratio is the least disturbed by load
        pairs = sorted(o[0] / p[0] for o, p in zip(ts_ours, ts_local))
        results["cases"][codec] = {"ours_s": ours, "local_s": peer, "ratio": ours / peer,
                                   "cpu_ours_s": cpu_ours, "cpu_local_s": cpu_peer, "cpu_ratio": cpu_ours / cpu_peer,
                                   "median_pair_ratio": pairs[len(pairs) // 2],
                                   "ours_all": ts_ours, "local_all": ts_local}
        print(f"| {args.size_mib} MiB in {args.chunks} chunks, {codec} | {ours:.3f} s ({cpu_ours:.2f} CPU-s) | "
              f"{peer:.3f} s ({cpu_peer:.2f} CPU-s) | {ours / peer:.2f}x best, {pairs[len(pairs) // 2]:.2f}x median "
              f"pair, {cpu_ours / cpu_peer:.2f}x CPU |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
