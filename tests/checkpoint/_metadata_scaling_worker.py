"""Run in a subprocess by ``test_metadata_scaling.py`` (so that the memory of a 100k-array save
does not stay with the pytest process, whose RSS every later child inherits in ``ru_maxrss``).

Usage: python _metadata_scaling_worker.py DIR.  Saves checkpoints of 1k and 100k arrays under
DIR, reads the metadata of each through a counting :class:`LatencyStore` and locally, prints
a JSON summary.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint import treemeta
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.testing.latency import LatencyStore


def tree(n: int) -> dict[str, dict[str, np.ndarray]]:
    return {f"layer{k}": {f"w{i}": np.full((i % 3 + 1,), k * 100 + i, np.float32) for i in range(100)}
            for k in range(n // 100)}


def fields(md: object) -> tuple[object, ...]:
    return (md.shape, str(md.dtype), md.chunks, md.stored_bytes, md.chunks_stored, list(md.path))  # type: ignore[attr-defined]


def all_fields(tree: dict[str, dict[str, object]]) -> list[object]:
    """Every field of every LeafMetadata, in tree order (dtype and tuples compared by repr)."""
    return [(k, w, [(f.name, repr(getattr(md, f.name))) for f in dataclasses.fields(md)])  # type: ignore[arg-type]
            for k, layer in tree.items() for w, md in layer.items()]


def scanner_vs_generic(path: Path) -> dict[str, object]:
    """metadata() with the _METADATA scanner and with the generic parser only: every field the same."""
    taken = treemeta.scan_tree_metadata((path / "_METADATA").read_text("utf-8")) is not None
    fast = all_fields(checkpoint.metadata(str(path)))
    scan = treemeta.scan_tree_metadata
    treemeta.scan_tree_metadata = lambda text: None  # type: ignore[assignment]
    try:
        slow = all_fields(checkpoint.metadata(str(path)))
    finally:
        treemeta.scan_tree_metadata = scan
    return {"scanner_taken": taken, "scanner_same": fast == slow, "leaves": len(fast)}


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
                       "sample": fields(md["layer7"]["w5"]), "last": fields(md[f"layer{n // 100 - 1}"]["w99"]),
                       **scanner_vs_generic(path)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
