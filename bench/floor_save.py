"""The floor of a checkpoint save on this machine: what any writer of Orbax's format must do.

Over the same chunks ``ocdbt_py.checkpoint.save`` writes (for ``bench_save.py``'s NumPy cases,
one chunk per array), with nothing else (no metadata, no B+tree, no manifest):

* ``zstd``: zstd at the level the format records (1, Orbax's ``.zarray``) on all cores (as
  many threads as ours uses: one per core, at least 4), one compressor per thread, chunks
  dealt largest first to the least loaded thread, output discarded;
* ``+write``: the same, appended to one file per thread in 1 MiB writes (the page cache);
* ``+fsync``: the same, writeback started every 32 MiB (``sync_file_range``, as ours does) and
  every file fsynced at the end (what a durable save pays).

Each is timed as the best of ``--repeat`` (wall and process CPU).  ``bench_save.py`` runs the
``+fsync`` floor in the same run as ours and Orbax (``floor`` column), so the gap of ours to the
floor, and the floor's ratio to Orbax, come from one run.

    python bench/floor_save.py --cases quarter,big     # the split for two cases
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

LEVEL = 1  # what Orbax's Zarr v2 metadata records (and what ours writes)
ONE_SHOT = 1 << 20  # chunks up to this size are compressed in one call, in batches
PIECE = 1 << 20  # output pieces of large chunks (what the page cache takes best, measured)
WRITEBACK_EVERY = 32 << 20  # start writeback of what was written (so the final fsync has little left)
try:  # Linux: sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE), as ours does
    _sfr: Any = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
    _sfr.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
except (OSError, AttributeError):
    _sfr = None


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _File:
    """Output of one thread: a file (or nothing, for the ``zstd`` floor)."""

    def __init__(self, path: str | None, kick: bool):
        self.f = open(path, "wb", buffering=0) if path else None  # noqa: SIM115 - closed in close()
        self.kick = kick and _sfr is not None
        self.unflushed = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if self.f is not None:
            mv = memoryview(data)
            done = 0
            while done < n:
                done += self.f.write(mv[done:])
            self.unflushed += n
            if self.kick and self.unflushed >= WRITEBACK_EVERY:
                self.unflushed = 0
                _sfr(self.f.fileno(), 0, 0, 2)
        return n

    def flush(self) -> None:
        pass

    def close(self, sync: bool) -> None:
        if self.f is not None:
            if sync:
                os.fsync(self.f.fileno())
            self.f.close()


def _worker(chunks: list[np.ndarray], out: _File) -> None:
    c = zstandard.ZstdCompressor(level=LEVEL)
    small = [memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in chunks if a.nbytes <= ONE_SHOT]
    for i in range(0, len(small), 256):  # one C call per batch, as a writer of many small chunks would
        coll = c.multi_compress_to_buffer(small[i:i + 256], threads=1)
        out.write(b"".join(coll[j].tobytes() for j in range(len(coll))))
    for a in chunks:
        if a.nbytes > ONE_SHOT:
            raw = memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
            with c.stream_writer(out, size=raw.nbytes, closefd=False, write_size=PIECE) as w:
                w.write(raw)


def floor_once(chunks: list[np.ndarray], mode: str, directory: str | None, threads: int | None = None
               ) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of one floor pass (``mode``: ``zstd``, ``write`` or ``fsync``)."""
    # as many threads as ours encodes with (one per core, at least 4): on a shared machine
    # fewer threads than ours would get a smaller share of the cores and time slower
    n = threads or max(4, min(16, os.cpu_count() or 4))
    order = sorted(range(len(chunks)), key=lambda i: -chunks[i].nbytes)  # largest first: balanced
    shares: list[list[np.ndarray]] = [[] for _ in range(n)]
    loads = [0] * n
    for i in order:
        k = loads.index(min(loads))
        shares[k].append(chunks[i])
        loads[k] += chunks[i].nbytes
    outs = [_File(os.path.join(directory, f"floor{k}") if mode != "zstd" and directory else None, mode == "fsync")
            for k in range(n)]
    c0, t0 = _cpu(), time.perf_counter()
    ths = [threading.Thread(target=_worker, args=(shares[k], outs[k])) for k in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    for o in outs:
        o.close(sync=(mode == "fsync"))
    if mode == "fsync" and directory:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0, _cpu() - c0


def floor_save(tree: dict[str, Any], directory: str, mode: str = "fsync") -> Callable[[str], None]:
    """A ``save(dst)``-like callable running the floor over ``tree``'s arrays into ``dst``."""
    chunks = [np.asarray(v) for v in tree.values()]

    def run(dst: str) -> None:
        os.makedirs(dst, exist_ok=True)
        floor_once(chunks, mode, dst)

    return run


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_save import build_tree  # the same trees as bench_save.py

    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="quarter,small16k,big,many")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| case | zstd only: wall · CPU s | + writes (page cache) | + fsync | load |")
    print("|---|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        chunks = [np.asarray(v) for v in build_tree(case, 1.0).values()]
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeat):
            for mode in ("zstd", "write", "fsync"):  # interleaved
                d = tempfile.mkdtemp(prefix="floor_save_", dir=os.environ.get("BENCH_TMP"))
                try:
                    r = floor_once(chunks, mode, d)
                finally:
                    shutil.rmtree(d, ignore_errors=True)
                if mode not in best or r[0] < best[mode][0]:
                    best[mode] = r
        cells = " | ".join(f"{best[m][0]:.3f} · {best[m][1]:.3f}" for m in ("zstd", "write", "fsync"))
        print(f"| {case} | {cells} | {os.getloadavg()[0]:.1f} |")


if __name__ == "__main__":
    main()
