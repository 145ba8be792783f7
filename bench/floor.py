"""The floor of a local restore on this machine, measured next to ours and Orbax.

Usage::

    python bench/floor.py [--dir /tmp/ocdbt_bench_restore] [--repeat 3] [--cases quarter,small16k,big,medium]
                          [--json out.json]

For each restore case of ``bench/bench_restore.py`` (whose checkpoints it writes with Orbax
if they are not in ``--dir`` yet), in fresh processes taking turns, after warming the page
cache before each: ours (``ocdbt_py.checkpoint.restore``), Orbax (to NumPy), and the **floor**:
what no reader of those files can avoid on this machine, i.e.

* ``decode``: the same compressed chunks, already in memory (the page cache's own pages, one
  mapping per chunk, every page touched before the clock starts: no copy into fresh memory),
  decoded with the same zstd (python-zstandard, one decompressor per thread,
  ``stream_reader(...).readinto``) into fresh ``np.empty`` outputs (allocated up front, as
  ours does for large arrays, inside the clock) on as many threads as cores, each thread
  taking the next chunk when it is free.  Outputs stay alive (as a
  restore's do), so every output page is a first touch.  Measured twice, in separate
  processes: outputs on ordinary pages and on transparent huge pages (NumPy's default; on the
  development VM their cost swings with whether the free 2 MiB blocks are warm); the floor
  takes the faster.
* ``read``: getting the compressed bytes out of the page cache, on as many threads as cores,
  the cheaper of ``preadv`` into a reused (already faulted) buffer per thread and ``mmap`` of
  each chunk with one byte per page touched.

``floor = decode + read`` (both use every core; nothing else is counted: no B+tree, no
metadata, no planning, no Python per array beyond the decode call).  Also reported: ``codec``,
the same decode into the already-faulted outputs (zstd alone), so ``decode - codec`` is the
first-touch page faults.  Each side's figure is its best of ``--repeat`` processes; the
table gives ours/floor, Orbax/floor and the issue's target (a ratio of Orbax) expressed as a
multiple of the floor: below 1.0x the target asks for less than the floor.  The load average
is recorded per case.
"""

from __future__ import annotations

import argparse
import itertools
import json
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import call_worker, repo_env, warm_page_cache  # bench/common.py (bench/ is on sys.path)

HERE = Path(__file__).resolve().parent
RESTORE = str(HERE / "bench_restore.py")
_JAX_ENV = repo_env(jax_devices=8)
TARGETS = {"quarter": 0.45, "small16k": 0.08, "big": 0.5, "medium": 0.15, "tiny": 0.1}
PAGE = 4096


# -- the floor worker ---------------------------------------------------------------------------


def _chunks(item: Path) -> list[tuple[str, int, int, str, tuple[int, ...], dict[str, Any]]]:
    """(data file, offset, length, array, chunk coordinates, array's ``.zarray``) of every
    stored chunk of the item's OCDBT databases (located with our B+tree reader, outside any
    timing)."""
    import ocdbt_py

    out = []
    for dbdir in sorted(item.glob("ocdbt.process_*")) or [item]:
        db = ocdbt_py.open(dbdir)
        metas: dict[str, dict[str, Any]] = {}
        located = []
        for e in db.entries():
            k = e.key.decode()
            if k.endswith("/.zarray"):
                metas[k.rsplit("/", 1)[0]] = json.loads(bytes(e.inline or db.get(e.key) or b""))
            elif e.location is not None:
                located.append((k, e.location))
        for k, loc in located:
            name, ck = k.rsplit("/", 1)
            m = metas[name]
            assert (m.get("compressor") or {}).get("id") == "zstd", m
            coords = tuple(int(x) for x in ck.split(m.get("dimension_separator", ".")))
            out.append((str(dbdir / loc.file.path.decode()), loc.offset, loc.length, name, coords, m))
    return out


def _on_threads(n: int, work: Any, items: list[Any]) -> float:
    """Wall seconds for ``n`` threads to run ``work(item, state)`` over ``items`` (each thread
    takes the next item when free; ``state`` is a per-thread dict)."""
    counter = itertools.count()
    start = threading.Barrier(n + 1)

    def run() -> None:
        state: dict[str, Any] = {}
        start.wait()
        while (i := next(counter)) < len(items):
            work(items[i], state)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def _region(out: Any, coords: tuple[int, ...], chunks: list[int]) -> Any:
    """The part of ``out`` a chunk fills (chunks here split the first axis only, so it is
    contiguous and no edge chunk overhangs)."""
    sl = tuple(slice(i * c, (i + 1) * c) for i, c in zip(coords, chunks))
    region = out[sl]
    assert region.flags.c_contiguous and list(region.shape) == list(chunks), (region.shape, chunks)
    return region


def run_floor(item: Path, pages: str, reps: int) -> dict[str, Any]:
    import numpy as np
    import zstandard

    from ocdbt_py.checkpoint.restore.pages import _switch

    threads = os.cpu_count() or 1
    chunks = _chunks(item)
    fds = {f: os.open(f, os.O_RDONLY) for f in {c[0] for c in chunks}}
    biggest = max(c[2] for c in chunks)

    def pread(c: Any, st: dict[str, Any]) -> None:
        buf = st.get("buf")
        if buf is None:
            buf = st["buf"] = np.ones(biggest, np.uint8)  # faulted once, reused
        mv = memoryview(buf)[: c[2]]
        got = 0
        while got < c[2]:
            got += os.preadv(fds[c[0]], [mv[got:]], c[1] + got)

    def touch(c: Any, st: dict[str, Any]) -> None:
        start = c[1] - c[1] % mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(fds[c[0]], c[1] + c[2] - start, offset=start, access=mmap.ACCESS_READ)
        a = np.frombuffer(mm, np.uint8)
        int(a[::PAGE].sum())
        del a
        mm.close()

    t_pread = min(_on_threads(threads, pread, chunks) for _ in range(reps))
    t_mmap = min(_on_threads(threads, touch, chunks) for _ in range(reps))
    # the compressed chunks, in memory before the clock starts: the page cache's own pages,
    # mapped and their page tables populated (a copy into fresh anonymous memory would take
    # free 2 MiB blocks the outputs' huge pages need, and ours never makes one)
    maps = {}
    views = {}
    for i, c in enumerate(chunks):  # one mapping per chunk, as ours maps large chunks
        start = c[1] - c[1] % mmap.ALLOCATIONGRANULARITY
        maps[i] = mmap.mmap(fds[c[0]], c[1] + c[2] - start, offset=start, access=mmap.ACCESS_READ)
        views[i] = memoryview(maps[i])[c[1] - start:]
    datas = [views[i] for i in range(len(chunks))]
    for v in datas:
        int(np.frombuffer(v, np.uint8)[::PAGE].sum())  # every page mapped before the clock starts
    for fd in fds.values():
        os.close(fd)
    jobs = [(d,) for d in datas]
    sw = _switch()
    if sw is not None:
        sw(pages == "huge")

    def decode(pair: Any, st: dict[str, Any]) -> None:
        d = st.get("d")
        if d is None:
            d = st["d"] = zstandard.ZstdDecompressor()
        d.stream_reader(pair[0][0]).readinto(pair[1].reshape(-1).view(np.uint8))

    # fresh outputs (once per process), one per array, allocated up front (as ours does for
    # large arrays) and first touched by the decoding threads
    c0, t0 = time.process_time(), time.perf_counter()
    arrays = {c[3]: np.empty(c[5]["shape"], np.dtype(c[5]["dtype"])) for c in chunks}  # one output per array
    outs = [_region(arrays[c[3]], c[4], c[5]["chunks"]) for c in chunks]
    t_alloc = time.perf_counter() - t0
    again = list(zip(jobs, outs))
    t_decode = t_alloc + _on_threads(threads, decode, again)
    cpu_decode = time.process_time() - c0

    t_codec = min(_on_threads(threads, decode, again) for _ in range(reps))
    compressed = sum(len(d) for d in datas)
    del jobs, again, datas
    for v in views.values():
        v.release()
    for m in maps.values():
        m.close()
    return {"pages": pages, "threads": threads, "chunks": len(chunks), "decode_s": t_decode,
            "decode_cpu_s": cpu_decode, "codec_s": t_codec, "pread_s": t_pread, "mmap_s": t_mmap,
            "read_s": min(t_pread, t_mmap), "floor_s": t_decode + min(t_pread, t_mmap),
            "bytes": sum(a.nbytes for a in arrays.values()), "compressed": compressed}


def worker(argv: list[str]) -> None:
    if argv[0] != "floor":
        raise SystemExit(f"unknown worker mode {argv[0]}")
    print(json.dumps(run_floor(Path(argv[1]), argv[2], int(argv[3]))))


# -- driver ---------------------------------------------------------------------------------------


def measure(root: Path, case: str, repeat: int) -> dict[str, Any]:
    """Ours, Orbax and the floor (both page modes) of one case, best of ``repeat`` each."""
    item = root / case
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "orbax": [], "small": [], "huge": []}
    order = list(runs)
    for i in range(repeat):
        for who in order[i % 4:] + order[: i % 4]:  # a different side first each round
            warm_page_cache(item)
            if who in ("ours", "orbax"):
                runs[who].append(call_worker(RESTORE, [who, str(item)], _JAX_ENV))
            else:
                runs[who].append(call_worker(__file__, ["floor", str(item), who, "3"], _JAX_ENV))
    ours = min(r["seconds"] for r in runs["ours"])
    orbax = min(r["seconds"] for r in runs["orbax"])
    fl = {m: min(runs[m], key=lambda r: r["floor_s"]) for m in ("small", "huge")}
    best = min(fl.values(), key=lambda r: r["floor_s"])
    floor = best["floor_s"]
    target = TARGETS[case] * orbax
    return {"case": case, "ours_s": ours, "orbax_s": orbax, "floor_s": floor, "floor_pages": best["pages"],
            "decode_s": best["decode_s"], "codec_s": min(r["codec_s"] for r in runs["small"] + runs["huge"]),
            "read_s": best["read_s"], "floor_small_s": fl["small"]["floor_s"], "floor_huge_s": fl["huge"]["floor_s"],
            "ours_over_floor": ours / floor, "orbax_over_floor": orbax / floor, "ours_over_orbax": ours / orbax,
            "target_ratio": TARGETS[case], "target_s": target, "target_over_floor": target / floor,
            "ours_cpu_s": min(r["cpu_s"] for r in runs["ours"]), "orbax_cpu_s": min(r["cpu_s"] for r in runs["orbax"]),
            "floor_cpu_s": best["decode_cpu_s"], "load": os.getloadavg()[0], "bytes": best["bytes"],
            "compressed": best["compressed"], "threads": best["threads"]}


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| case | ours | Orbax | floor (decode + read) | codec alone | faults | ours/floor | Orbax/floor | "
            "ours/Orbax | target | target/floor | load |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        verdict = "below the floor: impossible" if r["target_over_floor"] < 1 else "reachable"
        rows.append(
            f"| {r['case']} | {r['ours_s']:.3f} s | {r['orbax_s']:.3f} s | {r['floor_s']:.3f} s "
            f"({r['decode_s']:.3f} + {r['read_s']:.3f}, {r['floor_pages']} pages; other pages "
            f"{r['floor_small_s' if r['floor_pages'] == 'huge' else 'floor_huge_s']:.3f} s) | {r['codec_s']:.3f} s | "
            f"{r['decode_s'] - r['codec_s']:.3f} s | {r['ours_over_floor']:.2f}x | {r['orbax_over_floor']:.2f}x | "
            f"{r['ours_over_orbax']:.2f}x | <= {r['target_ratio']}x = {r['target_s']:.3f} s | "
            f"{r['target_over_floor']:.2f}x ({verdict}) | {r['load']:.1f} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/ocdbt_bench_restore")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="quarter,small16k,big,medium")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return 0
    root = Path(a.dir) / "full"
    root.mkdir(parents=True, exist_ok=True)
    call_worker(RESTORE, ["make", str(root), str(1 << 30)], _JAX_ENV)
    results = []
    for case in a.cases.split(","):
        r = measure(root, case, a.repeat)
        results.append(r)
        print(f"{case:8s} ours {r['ours_s']:.3f}s orbax {r['orbax_s']:.3f}s floor {r['floor_s']:.3f}s "
              f"({r['floor_pages']} pages) ours/floor {r['ours_over_floor']:.2f}x target/floor "
              f"{r['target_over_floor']:.2f}x load {r['load']:.1f}", file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
