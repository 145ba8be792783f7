"""Run in a subprocess by ``test_metadata_scaling.py`` (so that the memory of a 100k-array save
does not stay with the pytest process, whose RSS every later child inherits in ``ru_maxrss``).

Usage: python _metadata_scaling_worker.py DIR.  Saves checkpoints of 1k and 100k arrays under
DIR, reads the metadata of each through a counting :class:`LatencyStore` and locally, prints
a JSON summary.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ocdbt_py import checkpoint
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.testing.latency import LatencyStore


def tree(n: int) -> dict[str, dict[str, np.ndarray]]:
    return {f"layer{k}": {f"w{i}": np.full((i % 3 + 1,), k * 100 + i, np.float32) for i in range(100)}
            for k in range(n // 100)}


def fields(md: object) -> tuple[object, ...]:
    return (md.shape, str(md.dtype), md.chunks, md.stored_bytes, md.chunks_stored, list(md.path))  # type: ignore[attr-defined]


def main() -> None:
    root = Path(sys.argv[1])
    out: dict[str, object] = {}
    for n in (1_000, 100_000):
        path = root / f"ck{n}"
        checkpoint.save(str(path), tree(n), sync=False)
        store = LatencyStore(LocalStore(str(path), read_only=True))
        md = checkpoint.metadata(store)
        local = checkpoint.metadata(str(path))
        same = all(fields(local[k][w]) == fields(md[k][w]) for k in local for w in local[k])
        out[str(n)] = {"requests": store.stats.requests, "depth": store.stats.depth, "layers": len(md),
                       "per_layer": sorted({len(v) for v in md.values()}), "same_as_local": same,
                       "sample": fields(md["layer7"]["w5"]), "last": fields(md[f"layer{n // 100 - 1}"]["w99"])}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
