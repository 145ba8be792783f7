"""The bridges: safetensors export/import, zarr-python through ``ocdbt://``, dask on 2 workers.

Usage::

    python bench/bench_bridges.py [--dir /tmp/bench_bridges] [--size-mib 1024] [--repeat 3] [--json out.json]

Every measurement runs in a fresh subprocess (its own imports, caches and peak RSS), after
the inputs were read once so every side finds them in the page cache; best of ``--repeat``.
Cases, with the issue's targets:

* ``export``: ``bridges.export_safetensors(ckpt, dir, max_shard_size=size/4)`` vs our own
  ``checkpoint.restore`` of the same checkpoint, and vs ``safetensors.numpy.save_file`` of the
  same arrays (already in memory); peak RSS growth vs the largest tensor.
* ``import``: ``bridges.import_safetensors(dir, ckpt)`` of those shards vs our restore and
  vs ``safetensors.numpy.load_file`` of the shards (which holds every tensor in memory).
* ``zarr``: zarr-python reading the whole array through ``ocdbt://`` vs zarr-python on a plain
  directory holding the same array (same chunks and codec)                 target <= 1.3x
* ``dask``: ``sum`` of every array of ``bridges.to_dask(ckpt)`` on a LocalCluster of 2
  worker processes (cluster start excluded) vs ``checkpoint.restore`` + NumPy sums   <= 1.5x

The machine may be shared: quote ratios, with the load average printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from common import call_worker, warm_page_cache  # bench/common.py (bench/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
N_TENSORS = 8


class _PeakRss:
    """Peak resident set size above the level at start, sampled every 2 ms by a thread
    (``ru_maxrss`` alone would hide a peak lower than one reached while importing)."""

    def __init__(self) -> None:
        self.start = self.now()
        self.peak = self.start
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.now())

    def growth(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, self.now()) - self.start


def _arrays(size: int) -> dict[str, Any]:
    import numpy as np

    per = size // N_TENSORS // 4
    rng = np.random.default_rng(0)
    base = rng.standard_normal(per // 64 + 1).astype(np.float32)
    return {f"layer{i}": {"w": (np.resize(base, per) + i).reshape(-1, 1024)} for i in range(N_TENSORS)}


# -- workers (fresh processes) -----------------------------------------------------------------
def _w_restore(ckpt: str) -> dict[str, Any]:
    from ocdbt_py import checkpoint

    peak = _PeakRss()
    t = time.perf_counter()
    tree = checkpoint.restore(ckpt)
    dt = time.perf_counter() - t
    return {"seconds": dt, "rss_growth": peak.growth(), "nbytes": sum(v["w"].nbytes for v in tree.values())}


def _w_export(ckpt: str, out: str, shard: str) -> dict[str, Any]:
    from ocdbt_py import bridges
    from ocdbt_py.bridges import safetensors_export  # noqa: F401

    shutil.rmtree(out, ignore_errors=True)
    peak = _PeakRss()
    t = time.perf_counter()
    bridges.export_safetensors(ckpt, out, max_shard_size=int(shard))
    return {"seconds": time.perf_counter() - t, "rss_growth": peak.growth()}


def _w_st_save(size: str, out: str) -> dict[str, Any]:
    from safetensors.numpy import save_file

    flat = {f"{k}.w": v["w"] for k, v in _arrays(int(size)).items()}
    peak = _PeakRss()
    t = time.perf_counter()
    save_file(flat, out)
    return {"seconds": time.perf_counter() - t, "rss_growth": peak.growth()}


def _w_st_load(src: str) -> dict[str, Any]:
    from safetensors.numpy import load_file

    peak = _PeakRss()
    t = time.perf_counter()
    n = sum(a.nbytes for f in sorted(os.listdir(src)) if f.endswith(".safetensors")
            for a in load_file(os.path.join(src, f)).values())
    return {"seconds": time.perf_counter() - t, "rss_growth": peak.growth(), "nbytes": n}


def _w_import(src: str, dst: str) -> dict[str, Any]:
    from ocdbt_py import bridges
    from ocdbt_py.bridges import safetensors_import  # noqa: F401

    shutil.rmtree(dst, ignore_errors=True)
    peak = _PeakRss()
    t = time.perf_counter()
    bridges.import_safetensors(src, dst)
    return {"seconds": time.perf_counter() - t, "rss_growth": peak.growth()}


def _w_zarr(url: str) -> dict[str, Any]:
    import zarr

    if url.startswith("ocdbt://"):
        import fsspec

        from ocdbt_py.bridges.fsspec_ocdbt import register

        try:
            fsspec.get_filesystem_class("ocdbt")
        except (ValueError, ImportError):
            register()
    t = time.perf_counter()
    a = zarr.open_array(url, mode="r")
    data = a[...]
    return {"seconds": time.perf_counter() - t, "nbytes": int(data.nbytes)}


def _w_dask(ckpt: str) -> dict[str, Any]:
    import dask
    from distributed import Client, LocalCluster

    from ocdbt_py import bridges

    cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                           host="127.0.0.1")
    try:
        with Client(cluster):
            tree = bridges.to_dask(ckpt)
            sums = [v["w"].sum(dtype="float64") for v in tree.values()]
            dask.compute(*[v["w"][:1].sum() for v in tree.values()])  # workers up and importing
            t = time.perf_counter()
            total = float(sum(dask.compute(*sums)))
            dt = time.perf_counter() - t
    finally:
        cluster.close()
    return {"seconds": dt, "total": total}


def _w_restore_sum(ckpt: str) -> dict[str, Any]:
    from ocdbt_py import checkpoint

    t = time.perf_counter()
    tree = checkpoint.restore(ckpt)
    total = float(sum(v["w"].sum(dtype="float64") for v in tree.values()))
    return {"seconds": time.perf_counter() - t, "total": total}


WORKERS = {"restore": _w_restore, "export": _w_export, "st_save": _w_st_save, "import": _w_import,
           "st_load": _w_st_load, "zarr": _w_zarr, "dask": _w_dask, "restore_sum": _w_restore_sum}


# -- setup -------------------------------------------------------------------------------------
def _setup(d: Path, size: int) -> dict[str, str]:
    from ocdbt_py import bridges, checkpoint

    paths = {"ckpt": str(d / "ckpt"), "hf": str(d / "hf"), "zplain": str(d / "plain.zarr"), "zdb": str(d / "zdb")}
    if not (d / "ckpt").exists():
        checkpoint.save(paths["ckpt"], _arrays(size))
    if not (d / "hf").exists():
        bridges.export_safetensors(paths["ckpt"], paths["hf"], max_shard_size=size // 4)
    if not (d / "zdb").exists():
        import numpy as np
        import zarr

        import ocdbt_py

        rows = size // 4 // 1024
        z = zarr.create_array(paths["zplain"], shape=(rows, 1024), chunks=(max(1, rows // 32), 1024),
                              dtype="float32", zarr_format=2)
        z[...] = np.resize(np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32), rows * 1024
                           ).reshape(rows, 1024)
        db = ocdbt_py.open(paths["zdb"], mode="a")
        with db.transaction() as t:
            for root, _, files in os.walk(paths["zplain"]):
                for f in files:
                    rel = os.path.relpath(os.path.join(root, f), paths["zplain"]).replace(os.sep, "/")
                    t.put(f"arr/{rel}", Path(root, f).read_bytes())
            t.commit()
    for p in paths.values():
        warm_page_cache(Path(p))
    return paths


def _best(args: list[str], repeat: int) -> dict[str, Any]:
    runs = [call_worker(__file__, args) for _ in range(repeat)]
    return min(runs, key=lambda r: r["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/bench_bridges")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="comma-separated cases: export,import,zarr,dask")
    ap.add_argument("--worker", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker[0]](*a.worker[1:])))
        return
    size = a.size_mib << 20
    d = Path(a.dir) / f"{a.size_mib}MiB"
    d.mkdir(parents=True, exist_ok=True)
    p = _setup(d, size)
    only = set((a.only or "export,import,zarr,dask").split(","))
    tensor = size // N_TENSORS
    res: dict[str, Any] = {"size_mib": a.size_mib, "largest_tensor_mib": tensor / 2**20,
                           "load_before": os.getloadavg()}
    restore = _best(["restore", p["ckpt"]], a.repeat)
    res["restore_s"] = restore["seconds"]
    if "export" in only:
        ex = _best(["export", p["ckpt"], str(d / "out_hf"), str(size // 4)], a.repeat)
        st = _best(["st_save", str(size), str(d / "st.safetensors")], a.repeat)
        res["export"] = {"s": ex["seconds"], "vs_restore": ex["seconds"] / restore["seconds"],
                         "vs_safetensors_save_file": ex["seconds"] / st["seconds"],
                         "rss_growth_vs_tensor": ex["rss_growth"] / tensor, "st_save_s": st["seconds"],
                         "st_save_rss_growth_vs_tensor": st["rss_growth"] / tensor}
    if "import" in only:
        im = _best(["import", p["hf"], str(d / "out_ckpt")], a.repeat)
        sl = _best(["st_load", p["hf"]], a.repeat)
        res["import"] = {"s": im["seconds"], "vs_restore": im["seconds"] / restore["seconds"],
                         "vs_safetensors_load_file": im["seconds"] / sl["seconds"], "st_load_s": sl["seconds"],
                         "rss_growth_vs_tensor": im["rss_growth"] / tensor,
                         "st_load_rss_growth_vs_tensor": sl["rss_growth"] / tensor}
    if "zarr" in only:
        zo = _best(["zarr", f"ocdbt://arr::file://{p['zdb']}"], a.repeat)
        zp = _best(["zarr", p["zplain"]], a.repeat)
        res["zarr"] = {"ocdbt_s": zo["seconds"], "plain_s": zp["seconds"], "ratio": zo["seconds"] / zp["seconds"]}
    if "dask" in only:
        dk = _best(["dask", p["ckpt"]], a.repeat)
        rs = _best(["restore_sum", p["ckpt"]], a.repeat)
        assert abs(dk["total"] - rs["total"]) <= 1e-6 * max(1.0, abs(rs["total"])), (dk, rs)
        res["dask"] = {"dask_s": dk["seconds"], "restore_sum_s": rs["seconds"], "ratio": dk["seconds"] / rs["seconds"]}
    res["load_after"] = os.getloadavg()
    print(json.dumps(res, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
