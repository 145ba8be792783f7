"""``metadata()`` of a 100k-parameter checkpoint: a fixed number of requests (not one per leaf),
and the same answer as for the local directory; and the column scan it relies on
(``OcdbtStore.entry_columns``) against the per-entry ``entries()``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.kvstore import LocalStore
from ocdbt_py.store import open as open_db
from ocdbt_py.testing.latency import LatencyStore


def _tree(n: int) -> dict[str, dict[str, np.ndarray]]:
    return {f"layer{k}": {f"w{i}": np.full((i % 3 + 1,), k * 100 + i, np.float32) for i in range(100)}
            for k in range(n // 100)}


def _requests(path: Path) -> tuple[int, int, object]:
    store = LatencyStore(LocalStore(str(path), read_only=True))
    md = checkpoint.metadata(store)
    return store.stats.requests, store.stats.depth, md


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("md") / "ck100k"
    checkpoint.save(str(path), _tree(100_000), sync=False)
    return path


def test_metadata_of_100k_leaves_takes_no_per_leaf_requests(big: Path, tmp_path: Path) -> None:
    small = tmp_path / "ck1k"
    checkpoint.save(str(small), _tree(1_000), sync=False)
    n_small, depth_small, _ = _requests(small)
    n_big, depth_big, md = _requests(big)
    # the same requests whatever the number of leaves: listing, small files, manifest, B+tree
    assert n_big <= n_small + 2, (n_small, n_big)
    assert n_big <= 20 and depth_big <= 10, (n_big, depth_big)
    assert depth_big <= depth_small + 1
    assert isinstance(md, dict) and len(md) == 1000 and all(len(v) == 100 for v in md.values())
    leaf = md["layer7"]["w5"]
    assert (leaf.shape, leaf.dtype, leaf.chunks_stored) == ((3,), np.dtype(np.float32), 1)
    assert leaf.stored_bytes is not None and leaf.stored_bytes > 0
    # and the same answer as from the local directory
    local = checkpoint.metadata(str(big))
    assert local["layer999"]["w99"].shape == md["layer999"]["w99"].shape == (1,)
    for k in ("layer0", "layer500", "layer999"):
        for name, a in local[k].items():
            b = md[k][name]
            assert (a.shape, a.dtype, a.chunks, a.stored_bytes, a.chunks_stored, a.path) == \
                   (b.shape, b.dtype, b.chunks, b.stored_bytes, b.chunks_stored, b.path)


def test_entry_columns_agree_with_entries(big: Path) -> None:
    db = open_db(str(big))
    entries = list(db.entries())
    cols = list(db.entry_columns())
    keys = [k for c in cols for k in c.keys]
    sizes = [s for c in cols for s in c.sizes]
    assert keys == [e.key for e in entries]
    assert sizes == [e.size for e in entries]
    got = [v for c in cols for v in c.inline(range(len(c.keys)))]
    assert got == [e.inline for e in entries]
    # a sub-range (start inside a leaf) keeps positions relative to the run
    lo, hi = entries[1234].key, entries[54321].key
    sub = list(db.entry_columns(start=lo, stop=hi))
    sub_keys = [k for c in sub for k in c.keys]
    assert sub_keys == [e.key for e in entries[1234:54321]]
    assert [v for c in sub for v in c.inline(range(len(c.keys)))] == [e.inline for e in entries[1234:54321]]


def _depth(x: object) -> int:
    if isinstance(x, dict):
        return 1 + max((_depth(v) for v in x.values()), default=0)
    if isinstance(x, list):
        return 1 + max((_depth(v) for v in x), default=0)
    return 0


def test_text_depth_matches_the_parsed_value() -> None:
    """The depth check of large JSON documents (``zarr3._json.text_depth``, used instead of a
    walk of every parsed value) agrees with the parsed value, strings holding brackets
    included; a backslash anywhere (a quote might be escaped) leaves it to the walk."""
    import json
    import random

    from zarr3._json import MAX_DEPTH, parse, text_depth

    rng = random.Random(0)

    def gen(d: int) -> object:
        r = rng.random()
        if d > 12 or r < 0.3:
            return rng.choice([1, 2.5, None, True, "a[b", "}{", "x", "]]", ""])
        if r < 0.65:
            return [gen(d + 1) for _ in range(rng.randrange(0, 4))]
        return {rng.choice(["k", "[", "}", "q"]) + str(i): gen(d + 1) for i in range(rng.randrange(0, 4))}

    for _ in range(300):
        x = gen(0)
        text = json.dumps(x)
        if not isinstance(x, (dict, list)):
            continue
        assert text_depth(text, min_size=0) == _depth(x), text
    assert text_depth(json.dumps({"a": "\\\"[[["}), min_size=0) is None
    assert text_depth("[1]") is None  # small: walked
    # a large document nested too deep is refused by the text check
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    big = '{"pad": "' + "x" * (1 << 20) + '", "d": ' + deep + "}"
    with pytest.raises(ValueError, match="deeper"):
        parse(big)
    ok = '{"pad": "' + "x" * (1 << 20) + '", "d": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    assert parse(ok)["d"] == parse("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
