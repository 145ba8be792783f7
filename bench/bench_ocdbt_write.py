"""Writer benchmarks: ours vs TensorStore, same machine, same run, interleaved.

Cases (issue 5):

* bulk write of 100k small keys in one transaction (fresh database, until durable);
* bulk write of 1 GiB of 1-16 MiB values in one transaction, with peak RSS;
* 1,000 single-key commits (each its own generation).

Every measurement runs in a fresh child process (so peak RSS belongs to one case and one
library), ours and TensorStore's back to back (alternating which goes first); the best time of
``--repeat`` runs and the median ratio of the back-to-back pairs are reported (the pairs are
robust to the machine's load changing during the run).

    .venv/bin/python bench/bench_ocdbt_write.py [--bulk-mib 1024] [--repeat 3] [--keys 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def _small_items(n: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(0)
    keys = sorted({f"params.layer{rng.randrange(10**6):06d}.w{i}".encode() for i in range(n)})
    return [(k, rng.randbytes(rng.choice([8, 64, 200]))) for k in keys]


def _big_values(total_mib: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(1)
    out = []
    written = 0
    i = 0
    while written < total_mib << 20:
        size = rng.randint(1, 16) << 20
        out.append((b"v%05d" % i, os.urandom(size)))
        written += size
        i += 1
    return out


def _ts_kv(path: str):  # type: ignore[no-untyped-def]
    import tensorstore as ts

    return ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path}/"}).result()


def child(case: str, lib: str, path: str, n: int, bulk_mib: int) -> dict[str, float]:
    """Run one case once in this process; returns seconds, peak RSS and bytes written."""
    if lib == "ts":
        import tensorstore as ts
    else:
        import ocdbt_py
        import ocdbt_py.store  # noqa: F401  (imports are not timed)
        import ocdbt_py.write.commit  # noqa: F401
    if case == "bulk_small":
        items = _small_items(n)
    elif case == "bulk_big":
        items = _big_values(bulk_mib)
    else:
        items = [(b"key%05d" % i, b"value %d" % i) for i in range(n)]
    written = sum(len(k) + len(v) for k, v in items)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    if case in ("bulk_small", "bulk_big"):
        if lib == "ts":
            kv = _ts_kv(path)
            with ts.Transaction(atomic=True) as txn:
                t = kv.with_transaction(txn)
                for k, v in items:
                    t.write(k, v)
        else:
            db = ocdbt_py.open(path, mode="a")
            with db.transaction() as tx:
                for k, v in items:
                    tx.put(k, v)
    else:  # single-key commits
        if lib == "ts":
            kv = _ts_kv(path)
            for k, v in items:
                kv.write(k, v).result()
        else:
            db = ocdbt_py.open(path, mode="a")
            for k, v in items:
                db.put(k, v)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    del items
    return {"seconds": seconds, "peak_rss": rss, "rss_before": rss0, "written": written}


def run_child(case: str, lib: str, n: int, bulk_mib: int) -> dict[str, float]:
    tmp = tempfile.mkdtemp(prefix="ocdbt-wbench-")
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", case, lib, os.path.join(tmp, "db"), str(n), str(bulk_mib)],
            check=True, capture_output=True, text=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        case, lib, path, n, mib = sys.argv[2:7]
        print(json.dumps(child(case, lib, path, int(n), int(mib))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--bulk-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cases = [
        ("bulk_small", f"bulk write, {args.keys} small keys, one transaction", args.keys),
        ("single", f"{args.commits} single-key commits", args.commits),
    ]
    if args.bulk_mib:
        cases.append(("bulk_big", f"bulk write, {args.bulk_mib} MiB of 1-16 MiB values, one transaction", 0))
    rows = []
    for case, title, n in cases:
        best: dict[str, dict[str, float]] = {}
        ratios = []
        reps = args.repeat if case != "bulk_big" else max(2, args.repeat - 1)
        for rep in range(reps):
            pair = {}
            # alternate which library goes first, so a load change hits both alike
            for lib in ("ours", "ts") if rep % 2 == 0 else ("ts", "ours"):
                r = run_child(case, lib, n, args.bulk_mib)
                pair[lib] = r["seconds"]
                if lib not in best or r["seconds"] < best[lib]["seconds"]:
                    best[lib] = r
            ratios.append(pair["ours"] / pair["ts"])
            print(f"  {case} run {rep + 1}: ours {pair['ours']:.3f} s, TensorStore {pair['ts']:.3f} s",
                  file=sys.stderr)
        ratios.sort()
        rows.append((title, best["ours"], best["ts"], ratios[len(ratios) // 2]))
    print("| case | ours (best) | TensorStore (best) | ours/TS, best | ours/TS, median of pairs "
          "| peak RSS ours (x bytes written) | peak RSS TS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for title, o, t, med in rows:
        w = o["written"]
        print(
            f"| {title} | {o['seconds']:.3f} s | {t['seconds']:.3f} s | {o['seconds'] / t['seconds']:.2f}x "
            f"| {med:.2f}x | {o['peak_rss'] / 2**20:.0f} MiB ({o['peak_rss'] / w:.2f}x) "
            f"| {t['peak_rss'] / 2**20:.0f} MiB ({t['peak_rss'] / w:.2f}x) |"
        )


if __name__ == "__main__":
    main()
