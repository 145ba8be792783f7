"""Whole-item restores from S3 start on the data files straight after the listing
(``remoteread.Prefetch``): the values that fall inside those early ranges are taken from them,
the rest fetched as before, and the result is the same as without the prefetch."""

from __future__ import annotations

import functools
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.layout import Listing
from ocdbt_py.checkpoint.restore import remoteread
from ocdbt_py.checkpoint.restore.remoteread import _claim, _Job
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore import open_kvstore
from tests.objectstores import servers
from tests.objectstores.test_checkpoint import _assert_same

BUCKET = "ocdbt-prefetch"
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "conformance" / "fixtures" / "checkpoint"
_n = itertools.count()


@pytest.fixture(scope="module")
def s3(s3_server: servers.S3Server) -> servers.S3Server:
    s3_server.make_bucket(BUCKET)
    return s3_server


def _upload(srv: servers.S3Server, local: Path) -> str:
    import s3fs

    root = f"{BUCKET}/up{next(_n)}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **srv.storage_options())
    files = [p for p in sorted(local.rglob("*")) if p.is_file()]
    fs.put([str(p) for p in files], [f"{root}/{p.relative_to(local).as_posix()}" for p in files])
    return f"s3://{root}"


class _Spy:
    """Records the prefetch each RemoteSource.run was given, and how many values it held."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        # (ranges, values taken from them, values planned, values joined from two ranges)
        self.calls: list[tuple[int, int, int, int]] = []
        real = remoteread.RemoteSource.run

        def run(src: Any, keys: Any, hints: Any, consume: Any, prefetched: Any = None) -> None:
            real_plan = src._plan

            def plan(k: Any, h: Any, pre: Any = None) -> Any:
                jobs, ready = real_plan(k, h, pre)
                held = sum(len(j.spans[0][4]) for j, _ in pre.jobs) if pre is not None else 0
                joined = len({id(jj) for j, _ in pre.jobs for jj in j.feeds}) if pre is not None else 0
                self.calls.append((len(pre.jobs) if pre is not None else 0, held,
                                   sum(len(j.spans[0][4]) for j in jobs if j.keys is None), joined))
                return jobs, ready

            src._plan = plan
            real(src, keys, hints, consume, prefetched)

        monkeypatch.setattr(remoteread.RemoteSource, "run", run)


@pytest.mark.parametrize("version,case", [("orbax-0.11.5", "pytree_ocdbt"), ("orbax-0.11.5", "pytree_zarr3"),
                                          ("orbax-0.9.1", "pytree_ocdbt"), ("orbax-0.5.10", "aggregate")])
def test_orbax_fixtures_restore_the_same(s3: servers.S3Server, monkeypatch: pytest.MonkeyPatch,
                                         version: str, case: str) -> None:
    """Orbax's own layouts (a root database over ``ocdbt.process_0``): the data files the
    listing names are prefetched in tiny ranges (their values are all inline, so the ranges
    hold nothing the plan wants); the restore equals the local one."""
    local = FIXTURES / version / "ckpt" / case
    want = checkpoint.restore(local)
    url = _upload(s3, local)
    monkeypatch.setattr(remoteread, "MAX_SPAN", 48)
    monkeypatch.setattr(remoteread, "PREFETCH_MIN_FILE", 0)
    spy = _Spy(monkeypatch)
    got = checkpoint.restore(url, storage_options=s3.storage_options())
    _assert_same(got, want)
    assert spy.calls and spy.calls[0][0] > 1, "no prefetch was made"


def _tree(n: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"params": {f"w{i:03d}": rng.standard_normal(int(rng.integers(1, 3000))).astype(np.float32)
                       for i in range(n)}, "step": np.int64(9), "note": "x"}


_CASES = [(z, f, b) for z in (False, True) for f, b in ((None, 1 << 30), (None, 100_000), (200_000, 300_000))]


# the fsspec route (joins across ranges) on two of the cases, to keep `make test` short
@pytest.mark.parametrize("backend,use_zarr3,file_size,budget",
                         [("obstore", *c) for c in _CASES] + [("fsspec", False, None, 100_000),
                                                               ("fsspec", True, 200_000, 300_000)])
def test_saved_checkpoint_with_and_without_prefetch(s3: servers.S3Server, monkeypatch: pytest.MonkeyPatch,
                                                    use_zarr3: bool, file_size: int | None, budget: int,
                                                    backend: str) -> None:
    """fsspec (reads into buffers): ranges of at most MAX_SPAN from offset 0, values across
    two of them joined.  obstore (reads in parts): whole data files while they fit in the
    budget (the first one cut at the budget), so no value is cut."""
    monkeypatch.setenv("OCDBT_PY_BACKEND", backend)
    tree = _tree(120, 1)
    url = f"s3://{BUCKET}/saved{next(_n)}"
    checkpoint.save(url, tree, storage_options=s3.storage_options(), use_zarr3=use_zarr3,
                    ocdbt_target_data_file_size=file_size)
    # ranges of 4 KiB: values straddle their ends; a small budget leaves the rest of the data
    # files to the ordinary plan
    monkeypatch.setattr(remoteread, "MAX_SPAN", 4096)
    monkeypatch.setattr(remoteread, "PREFETCH_MIN_FILE", 0)
    monkeypatch.setattr(remoteread, "IN_FLIGHT_BYTES", budget)
    monkeypatch.setattr(remoteread, "MAX_IN_FLIGHT_BYTES", budget)
    spy = _Spy(monkeypatch)
    got = checkpoint.restore(url, storage_options=s3.storage_options())
    monkeypatch.setenv("OCDBT_PY_PREFETCH", "0")
    plain = checkpoint.restore(url, storage_options=s3.storage_options())
    _assert_same(got["params"], tree["params"])
    _assert_same(plain, got)
    (ranges, held, planned, joined), (ranges_off, held_off, planned_off, _) = spy.calls
    assert ranges_off == held_off == 0 and planned_off == held + planned + joined
    assert held > 0  # the prefetch was made and used
    if backend == "fsspec":
        assert ranges > 1
        assert joined > 0  # values straddling two adjacent ranges: joined from them, not fetched again
        assert planned > 0  # values over more than two ranges (and, with a small budget, the rest) as usual
    else:
        assert joined == 0
        assert (planned == 0) == (budget == 1 << 30)  # everything prefetched, or the rest planned


def test_partial_restore_does_not_prefetch(s3: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(30, 2)
    url = f"s3://{BUCKET}/partial{next(_n)}"
    checkpoint.save(url, tree, storage_options=s3.storage_options())
    spy = _Spy(monkeypatch)
    target = {"params": {"w003": np.zeros_like(tree["params"]["w003"])}}
    got = checkpoint.restore(url, target, storage_options=s3.storage_options())
    np.testing.assert_array_equal(got["params"]["w003"], tree["params"]["w003"])
    lazy = checkpoint.restore(url, storage_options=s3.storage_options(), lazy=True)
    np.testing.assert_array_equal(np.asarray(lazy["params"]["w007"]), tree["params"]["w007"])
    assert all(c[0] == 0 for c in spy.calls)


def test_listing_carries_sizes_on_object_stores(s3: servers.S3Server, tmp_path: Path) -> None:
    tree = _tree(3, 3)
    url = f"s3://{BUCKET}/sizes{next(_n)}"
    checkpoint.save(url, tree, storage_options=s3.storage_options())
    checkpoint.save(tmp_path / "c", tree)
    remote = Listing.of(open_kvstore(url, s3.storage_options()))
    data = {k: v for k, v in remote.sizes.items() if k.startswith("d/")}
    assert data and all(v > 0 for v in data.values())
    assert remote.sizes["manifest.ocdbt"] == (tmp_path / "c" / "manifest.ocdbt").stat().st_size
    assert Listing.of(open_kvstore(tmp_path / "c")).sizes == {}  # local: not listed recursively


def test_data_file_gone_after_listing_is_corruption(s3: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(20, 4)
    url = f"s3://{BUCKET}/gone{next(_n)}"
    checkpoint.save(url, tree, storage_options=s3.storage_options())
    real_of = Listing.of.__func__  # type: ignore[attr-defined]
    writer = open_kvstore(url, s3.storage_options())

    def of(cls: Any, kv: Any, prefix: str = "", **kw: Any) -> Listing:
        lst = real_of(cls, kv, prefix, **kw)
        for k in [k for k in lst.sizes if k.startswith("d/")]:
            writer.delete(prefix + k)  # the data files vanish between the listing and the reads
        return lst

    monkeypatch.setattr(Listing, "of", classmethod(of))
    with pytest.raises(CorruptionError, match="missing"):
        checkpoint.restore(url, storage_options=s3.storage_options())


def test_claim_takes_only_values_wholly_inside_a_range() -> None:
    jobs = [_Job(100, [(0, "d/f", 0, 100, [])]), _Job(100, [(0, "d/f", 100, 200, [])]),
            _Job(50, [(0, "d/f", 300, 350, [])]), _Job(50, [(0, "d/f", 360, 410, [])])]
    vals = [(0, 0, 10), (1, 90, 10), (2, 95, 10), (3, 100, 100), (4, 195, 10), (5, 250, 10), (6, 300, 50),
            (7, 340, 30), (8, 50, 200)]
    vals.sort(key=lambda v: v[1])
    rest, split = _claim(vals, jobs)
    assert [v[0] for v in jobs[0].spans[0][4]] == [0, 1]
    assert [v[0] for v in jobs[1].spans[0][4]] == [3]
    assert [v[0] for v in jobs[2].spans[0][4]] == [6]
    assert jobs[3].spans[0][4] == []
    # across two adjacent ranges: joined; past the second range's end, into a gap, or over
    # three ranges: fetched anew
    assert [(v[0], a is jobs[0], b is jobs[1]) for v, a, b in split] == [(2, True, True)]
    assert [v[0] for v in rest] == [8, 4, 5, 7]


def _put(out: dict[int, bytes], i: int, v: Any) -> None:
    out[i] = bytes(v)


def test_straddling_values_are_joined_from_the_ranges_in_either_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values across the boundary of two prefetched ranges come out whole whichever range
    arrives first, and nothing is requested twice."""
    from ocdbt_py.checkpoint.restore.locations import Location
    from ocdbt_py.kvstore.memory import MemoryStore

    blob = np.random.default_rng(5).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    store = MemoryStore()
    store.set("d/f", blob)
    vals = {"a": (0, 90), "b": (90, 40), "c": (130, 100), "d": (230, 70), "e": (300, 350), "f": (650, 350)}
    table = {k: Location(0, "d/f", off, n, None) for k, (off, n) in vals.items()}
    asked: list[tuple[int, int]] = []
    real_get_many = MemoryStore.get_many

    order = [1]

    def get_many(self: Any, reqs: Any) -> Any:
        asked.extend(r for _, r in reqs)
        lo = reqs[0][1][0]
        time.sleep((lo if order[0] > 0 else 1000 - lo) / 4000)  # the ranges arrive in this order
        return real_get_many(self, reqs)

    monkeypatch.setattr(MemoryStore, "get_many", get_many)
    monkeypatch.setattr(remoteread, "MAX_SPAN", 100)
    monkeypatch.setattr(remoteread, "PREFETCH_MIN_FILE", 0)
    for order[0] in (1, -1):
        asked.clear()
        pre = remoteread.Prefetch([store], [(0, "d/f", len(blob))], budget=400)
        got: dict[int, bytes] = {}
        src = remoteread.RemoteSource(store, [store], table)
        keys = list(vals)
        src.run(keys, [n for _, n in vals.values()], functools.partial(_put, got), pre)
        for i, k in enumerate(keys):
            off, n = vals[k]
            assert got[i] == blob[off: off + n], k
        # b (90..130) and c (130..230) joined from two ranges each, d inside [200, 300), e and f
        # beyond the prefetch: requested as usual
        assert sorted(asked) == [(0, 100), (100, 200), (200, 300), (300, 400), (300, 650), (650, 1000)]


def test_prefetch_takes_the_largest_files_first_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from ocdbt_py.kvstore.memory import MemoryStore

    store = MemoryStore()
    sizes = {"d/small": 1000, "d/big": 300_000, "d/mid": 150_000, "d/tiny": 10}
    for k, n in sizes.items():
        store.set(k, bytes(n))
    monkeypatch.setattr(remoteread, "MAX_SPAN", 100_000)
    monkeypatch.setattr(remoteread, "PREFETCH_MIN_FILE", 500)
    pre = remoteread.Prefetch([store], [(0, k, n) for k, n in sizes.items()], budget=420_000)
    pre.wait()
    spans = [(j.spans[0][1], j.spans[0][2], j.spans[0][3]) for j, _ in pre.jobs]
    assert spans == [("d/big", 0, 100_000), ("d/big", 100_000, 200_000), ("d/big", 200_000, 300_000),
                     ("d/mid", 0, 100_000), ("d/mid", 100_000, 120_000)]  # budget reached; small/tiny not read
    assert pre.nbytes == 420_000


@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_prefetch_on_gcs_and_azure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                   kind: str) -> None:
    """The listing of gcsfs/adlfs carries sizes too, so their whole restores prefetch."""
    if kind == "gcs":
        srv: Any = request.getfixturevalue("gcs_server")
        srv.make_bucket(BUCKET)
        url = f"gs://{BUCKET}/pre{next(_n)}"
    else:
        srv = request.getfixturevalue("azure_server")
        srv.make_container(BUCKET)
        url = f"az://{BUCKET}/pre{next(_n)}"
    tree = _tree(40, 5)
    checkpoint.save(url, tree, storage_options=srv.storage_options())
    assert any(k.startswith("d/") for k in Listing.of(open_kvstore(url, srv.storage_options())).sizes)
    monkeypatch.setattr(remoteread, "MAX_SPAN", 8192)
    monkeypatch.setattr(remoteread, "PREFETCH_MIN_FILE", 0)
    spy = _Spy(monkeypatch)
    got = checkpoint.restore(url, storage_options=srv.storage_options())
    _assert_same(got["params"], tree["params"])
    ranges, held, _, _ = spy.calls[0]
    assert ranges > 0 and held > 0


@pytest.mark.parametrize("alone", [True, False])
def test_first_prefetched_range_goes_alone(monkeypatch: pytest.MonkeyPatch, alone: bool) -> None:
    """The other ranges are requested once the first has arrived (so it arrives sooner and
    decoding starts); a failure to start them reaches whoever waits on their futures."""
    from ocdbt_py.kvstore.memory import MemoryStore

    store = MemoryStore()
    store.set("d/f", bytes(300))
    events: list[str] = []
    real_get_many = MemoryStore.get_many

    def get_many(self: Any, reqs: Any) -> Any:
        lo = reqs[0][1][0]
        events.append(f"start {lo}")
        if lo == 0:
            time.sleep(0.2)
        out = real_get_many(self, reqs)
        events.append(f"end {lo}")
        return out

    monkeypatch.setattr(MemoryStore, "get_many", get_many)
    monkeypatch.setattr(remoteread, "MAX_SPAN", 100)
    monkeypatch.setattr(remoteread, "PREFETCH_MIN_FILE", 0)
    monkeypatch.setattr(remoteread, "PREFETCH_FIRST_ALONE", alone)
    pre = remoteread.Prefetch([store], [(0, "d/f", 300)], budget=300)
    pre.wait()
    assert [f.result()[0] for _, f in pre.jobs] == [bytes(100)] * 3
    if alone:
        assert events.index("end 0") < events.index("start 100") and events.index("end 0") < events.index("start 200")
    else:
        assert events.index("start 100") < events.index("end 0")

    real_start = remoteread._start_span
    calls = itertools.count()

    def start_once(*a: Any) -> Any:
        if next(calls):
            raise OSError("cannot start")
        return real_start(*a)

    monkeypatch.setattr(remoteread, "_start_span", start_once)
    if alone:
        pre = remoteread.Prefetch([store], [(0, "d/f", 300)], budget=300)
        pre.wait()  # never hangs
        assert pre.jobs[0][1].result()[0] == bytes(100)
        for _, f in pre.jobs[1:]:
            with pytest.raises(OSError, match="cannot start"):
                f.result()
