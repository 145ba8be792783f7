"""Reader benchmarks: ours vs TensorStore on the same database, in the same run.

Cases (issue 2): list 100k keys; 14k point reads; read every value of a database holding
1 GiB of 1-16 MiB values (page cache warm); ``import ocdbt_py`` time.

    .venv/bin/python bench/bench_ocdbt_read.py [--bulk-mib 1024] [--repeat 5] [--cases list,points,bulk,import]

(TensorStore's sequential point reads take ~10 ms each here, so ``--cases list`` is the quick
way to re-measure listing alone.)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import best_of, table  # noqa: E402

import ocdbt_py  # noqa: E402


def make_small_db(path: str, n: int) -> list[bytes]:
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path}/"}).result()
    rng = random.Random(0)
    keys = sorted({f"params.layer{rng.randrange(10**6):06d}.w{i}".encode() for i in range(n)})
    with ts.Transaction(atomic=True) as txn:
        t = kv.with_transaction(txn)
        for k in keys:
            t.write(k, rng.randbytes(rng.choice([8, 64, 200])))
    return keys


def make_bulk_db(path: str, total_mib: int) -> int:
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path}/"}).result()
    rng = random.Random(1)
    written = 0
    i = 0
    with ts.Transaction(atomic=True) as txn:
        t = kv.with_transaction(txn)
        while written < total_mib << 20:
            size = rng.randint(1, 16) << 20
            t.write(f"v{i:05d}".encode(), os.urandom(size))
            written += size
            i += 1
    return written


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--point-reads", type=int, default=14_000)
    ap.add_argument("--bulk-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default="list,points,bulk,import", help="comma-separated subset to run")
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    import tensorstore as ts

    tmp = tempfile.mkdtemp(prefix="ocdbt-bench-")
    rows = []
    try:
        small = os.path.join(tmp, "small")
        keys = make_small_db(small, args.keys)
        tkv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{small}/"}).result()

        # both sides open the database and materialise the keys as a list of bytes
        # (TensorStore's list().result() returns one)
        def ours_list() -> None:
            db = ocdbt_py.open(small)
            assert len(list(db.list())) == len(keys)

        def ts_list() -> None:
            kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{small}/"}).result()
            assert len(kv.list().result()) == len(keys)

        if "list" in cases:
            rows.append(
                (f"list {len(keys)} keys (open + list)", best_of(ours_list, args.repeat), best_of(ts_list, args.repeat))
            )
            print(f"load average {os.getloadavg()[0]:.2f}")

        sample = random.Random(2).sample(keys, min(args.point_reads, len(keys)))
        db = ocdbt_py.open(small)

        def ours_points_seq() -> None:
            get = db.get
            for k in sample:
                get(k)

        def ours_points_batch() -> None:
            db.get_many(sample)

        def ts_points_concurrent() -> None:
            futs = [tkv.read(k) for k in sample]
            for f in futs:
                f.result()

        def ts_points_seq() -> None:
            for k in sample:
                tkv.read(k).result()

        if "points" in cases:
            t_ts_conc = best_of(ts_points_concurrent, args.repeat)
            t_ts_seq = best_of(ts_points_seq, args.repeat)
            rows.append(
                (f"{len(sample)} point reads, sequential get()", best_of(ours_points_seq, args.repeat), t_ts_seq)
            )
            rows.append(
                (f"{len(sample)} point reads, get_many vs TS concurrent futures",
                 best_of(ours_points_batch, args.repeat), t_ts_conc)
            )

        if args.bulk_mib and "bulk" in cases:
            bulk = os.path.join(tmp, "bulk")
            total = make_bulk_db(bulk, args.bulk_mib)
            bdb = ocdbt_py.open(bulk)
            bkv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{bulk}/"}).result()
            bkeys = list(bdb.list())

            def ours_bulk() -> None:
                n = 0
                for _, v in bdb.items(batch=8):
                    n += len(v)
                assert n == total

            def ts_bulk() -> None:
                futs = [bkv.read(k) for k in bkeys]
                assert sum(len(f.result().value) for f in futs) == total

            t_ours = best_of(ours_bulk, max(2, args.repeat // 2))
            t_ts = best_of(ts_bulk, max(2, args.repeat // 2))
            rows.append((f"read all values, {total >> 20} MiB of 1-16 MiB values", t_ours, t_ts))
            print(f"bulk throughput: ours {total / t_ours / 1e9:.2f} GB/s, TensorStore {total / t_ts / 1e9:.2f} GB/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(table(rows))
    if "import" not in cases:
        return
    imports = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import ocdbt_py"], check=True)
        imports.append(time.perf_counter() - t)
    base = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        base.append(time.perf_counter() - t)
    print(f"\n`import ocdbt_py`: {min(imports) - min(base):.3f} s above a bare interpreter start "
          f"({min(imports):.3f} s vs {min(base):.3f} s)")


if __name__ == "__main__":
    main()
