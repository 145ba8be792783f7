"""Issue 32, holes 2 and 3: work proportional to what is stored, not to the declared grid.

A few hundred bytes of per-parameter checkpoint can declare a ``[1000, 1000]`` array of
``[1, 1]`` chunks (10^6 chunks) or a ``[10^6, 10^6]`` one (10^12 chunks) and store none of
them.  ``checkpoint.restore`` used to build a Python tuple per chunk before reading (+435 MiB
and 8 s for the 4 MiB output; ``[3000, 3000]``: ``MemoryError`` after 60 s) and reached the
first missing chunk only after that; ``ocdbt stats``/``report`` computed a statistic per
missing chunk, ``cp`` probed every chunk file and ``export`` built chunk tuples per slab (past
20 s, 0.8-2.4 GB).  Now large grids are read from one listing of the stored chunks, absent
ones are one run of the fill value (or, where every chunk must be stored, the first missing
one is an error at once), and each case below stays under 100 MiB of growth and 2 CPU-s in a
child process.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.security.childproc import run_child

pytestmark = pytest.mark.timeout(300)

LIMIT_MIB = 100
LIMIT_S = 2.0


def declared(path: Path, n: int, *, every_chunk: bool = False, stored: dict[tuple[int, int], float] | None = None
             ) -> Path:
    """A per-parameter checkpoint whose one array ``w`` declares ``[n, n]`` float32 in
    ``[1, 1]`` chunks and stores only ``stored`` (position -> value)."""
    (path / "w").mkdir(parents=True)
    meta = {"tree_metadata": {"('w',)": {"key_metadata": [{"key": "w", "key_type": 2}],
                                         "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}},
            "use_ocdbt": False}
    if every_chunk:
        meta["store_array_data_equal_to_fill_value"] = True
    (path / "_METADATA").write_text(json.dumps(meta))
    (path / "w" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [n, n], "chunks": [1, 1], "dtype": "<f4", "compressor": None,
        "fill_value": 0, "order": "C", "filters": None, "dimension_separator": "."}))
    for (i, j), v in (stored or {}).items():
        (path / "w" / f"{i}.{j}").write_bytes(np.float32(v).tobytes())
    return path


def _check(got: dict[str, tuple[int, float, str]], expect: dict[str, str]) -> None:
    assert sorted(got) == sorted(expect), got
    for name, want in expect.items():
        mib, secs, outcome = got[name]
        assert outcome.startswith(want), (name, outcome)
        assert mib < LIMIT_MIB and secs < LIMIT_S, (name, mib, secs, outcome)


def test_restore_of_a_million_declared_chunks(tmp_path: Path) -> None:
    empty = declared(tmp_path / "empty", 1000)
    some = declared(tmp_path / "some", 1000, stored={(0, 0): 7.0, (999, 3): 2.5})
    strict = declared(tmp_path / "strict", 1000, every_chunk=True, stored={(0, 0): 1.0, (0, 1): 1.0})
    got = run_child(f"""
        import numpy as np
        import zarr3
        from ocdbt_py import checkpoint
        def restore_empty():
            w = checkpoint.restore({str(empty)!r})["w"]
            return w.shape, float(np.abs(w).sum())
        def restore_some():
            w = checkpoint.restore({str(some)!r})["w"]
            return float(w.sum()), float(w[0, 0]), float(w[999, 3]), int(np.count_nonzero(w))
        def restore_strict():
            return checkpoint.restore({str(strict)!r})
        def lazy_slice():
            w = checkpoint.restore({str(some)!r}, lazy=True)["w"]
            return float(w[:, :100].sum()), float(w[990:, :].sum())
        def zarr3_read():
            a = zarr3.open({str(some / "w")!r})
            return float(a[...].sum())
        def zarr3_strict():
            return zarr3.open({str(some / "w")!r}, fill_missing=False)[:500, :]
        for fn in (restore_empty, restore_some, restore_strict, lazy_slice, zarr3_read, zarr3_strict):
            measure(fn)
    """)
    _check(got, {
        "restore_empty": "ok ((1000, 1000), 0.0)",
        "restore_some": "ok (9.5, 7.0, 2.5, 2)",
        "restore_strict": "CorruptionError array 'w': chunk 'w/0.2' is missing",
        "lazy_slice": "ok (9.5, 2.5)",
        "zarr3_read": "ok 9.5",
        "zarr3_strict": "ChunkNotFoundError",
    })


def test_cli_on_a_trillion_declared_chunks(tmp_path: Path) -> None:
    ck = declared(tmp_path / "ck", 10**6, stored={(5, 5): 3.0})
    strict = declared(tmp_path / "strict", 10**6, every_chunk=True)
    out = tmp_path / "out"
    out.mkdir()
    got = run_child(f"""
        import contextlib, io
        from ocdbt_py import checkpoint
        from ocdbt_py.cli import main
        def cli(*args):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                rc = main([str(a) for a in args])
            return rc, buf.getvalue().strip().splitlines()[-1][:120]
        def stats():
            return cli("stats", {str(ck)!r}, "--json")
        def stats_values():
            from ocdbt_py.inspect.stats import stats as st
            s = st({str(ck)!r}, histograms=True)["w"]
            return s.max, s.zeros, s.size, sum(s.histogram)
        def stats_strict():
            return cli("stats", {str(strict)!r})
        def report():
            return cli("report", {str(ck)!r}, "-o", {str(out / "r.html")!r})
        def cp():
            return cli("cp", {str(ck)!r}, {str(out / "copy")!r})
        def copied():
            return float(checkpoint.restore({str(out / "copy")!r}, lazy=True)["w"][:10, :10].sum())
        def export():
            return cli("export", {str(ck)!r}, {str(out / "e.npz")!r})
        def restore():
            return checkpoint.restore({str(ck)!r})
        for fn in (stats, stats_values, stats_strict, report, cp, copied, export, restore):
            measure(fn)
    """)
    _check(got, {
        "stats": "ok (0,", "stats_values": "ok (3.0, 999999999999, 1000000000000, 1000000000000)",
        "stats_strict": "ok (1, \"ocdbt: error: array 'w': chunk 'w/0.0' is missing",
        "report": "ok (0,", "cp": "ok (0,", "copied": "ok 3.0",
        "export": "ok (1, 'ocdbt: error: writing", "restore": "ResourceError",
    })
    assert not (out / "e.npz").exists()
    assert sorted(p.name for p in (out / "copy" / "w").iterdir()) == [".zarray", "5.5"]


def test_ocdbt_item_with_a_million_declared_chunks(tmp_path: Path) -> None:
    """The same grid in an OCDBT item (listing = one B+tree range): the fill value at once, or
    with every chunk required the first missing one at once."""
    import ocdbt_py
    from ocdbt_py import checkpoint

    ck = tmp_path / "ck"
    checkpoint.save(ck, {"w": np.arange(4, dtype=np.float32)})
    db = ocdbt_py.open(str(ck), mode="a")
    for k in [k for k in db.list() if k.endswith(b"/.zarray")]:
        doc = json.loads(db[k])
        doc["shape"], doc["chunks"] = [1000, 1000], [1, 1]
        db[k] = json.dumps(doc).encode()
    db.close()
    strict = tmp_path / "strict"
    import shutil

    shutil.copytree(ck, strict)
    for path, every in ((ck, False), (strict, True)):  # Orbax's newer saves store every chunk
        meta = json.loads((path / "_METADATA").read_text())
        meta["store_array_data_equal_to_fill_value"] = every
        (path / "_METADATA").write_text(json.dumps(meta))
    got = run_child(f"""
        from ocdbt_py import checkpoint
        def lenient():
            w = checkpoint.restore({str(ck)!r})["w"]
            return w.shape, float(w.sum())
        def strict():
            return checkpoint.restore({str(strict)!r})
        measure(lenient)
        measure(strict)
    """)
    _check(got, {"lenient": "ok ((1000, 1000), 0.0)", "strict": "CorruptionError array 'w': chunk 'w/0.0' is missing"})


@pytest.mark.parametrize("name,sep", [("default", "/"), ("default", "."), ("v2", "."), ("v2", "/")])
def test_chunk_keys_decode_only_as_encoded(name: str, sep: str) -> None:
    """A listed key counts as a chunk only if it is exactly the key of that position."""
    from zarr3.chunk_grid import ChunkKeyEncoding
    from zarr3.stored import first_missing

    enc = ChunkKeyEncoding(name, sep)
    for coords in [(), (0,), (7, 0, 12), (10**12, 3)]:
        assert enc.decode(enc.encode(coords), len(coords)) == coords
    key = enc.encode((1, 2))
    for bad in (key.replace("1", "01"), key + sep + "0", key.replace("2", "-2"), key.replace("2", "\u0662"),
                "zarr.json", ".zarray", ""):
        assert enc.decode(bad, 2) is None, bad
    assert first_missing([range(2), range(3)], [(0, 0), (0, 1), (0, 2), (1, 0)]) == (1, 1)
    assert first_missing([range(1), range(2)], [(0, 0), (0, 1)]) is None
