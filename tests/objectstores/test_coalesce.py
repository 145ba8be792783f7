"""Byte-range coalescing and the latency/request-counting wrapper, with requests counted."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocdbt_py.kvstore import MemoryStore
from ocdbt_py.kvstore.coalesce import coalesced_get_many, plan
from ocdbt_py.testing.latency import LatencyStore

BLOB = bytes(range(256)) * 64  # 16 KiB


def test_plan_merges_within_gap_only() -> None:
    spans = plan([("a", (0, 10)), ("a", (15, 20)), ("a", (100, 110))], gap=5)
    assert [(s.key, s.byte_range) for s in spans] == [("a", (0, 20)), ("a", (100, 110))]
    spans = plan([("a", (0, 10)), ("a", (16, 20))], gap=5)
    assert len(spans) == 2


def test_plan_respects_max_span_and_keys() -> None:
    reqs = [("a", (i * 10, i * 10 + 10)) for i in range(10)] + [("b", (0, 5))]
    spans = plan(reqs, gap=0, max_span=30)
    assert [s.byte_range for s in spans if s.key == "a"] == [(0, 30), (30, 60), (60, 90), (90, 100)]
    assert [s.byte_range for s in spans if s.key == "b"] == [(0, 5)]


def test_plan_whole_object_absorbs_ranges_and_suffix_stays_alone() -> None:
    spans = plan([("a", (5, 9)), "a", ("a", (-4, None)), ("a", (1000, 2000))], gap=0)
    kinds = sorted((s.byte_range is None, len(s.members)) for s in spans)
    assert kinds == [(False, 1), (True, 3)]  # suffix alone; whole read serves three requests


def test_plan_overlapping_and_duplicate_ranges() -> None:
    spans = plan([("a", (0, 100)), ("a", (10, 20)), ("a", (10, 20)), ("a", (90, 150))], gap=0)
    assert [s.byte_range for s in spans] == [(0, 150)]


def test_plan_rejects_bad_ranges() -> None:
    with pytest.raises(ValueError):
        plan([("a", (5, 2))])
    with pytest.raises(ValueError):
        plan(["a"], gap=-1)


_ranges = st.one_of(
    st.none(),
    st.tuples(st.integers(0, 20000), st.integers(0, 4000)).map(lambda t: (t[0], t[0] + t[1])),
    st.tuples(st.integers(0, 20000), st.none()),
    st.tuples(st.integers(-20000, -1), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(
    reqs=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "missing"]), _ranges), max_size=40),
    gap=st.integers(0, 5000),
    max_span=st.integers(1, 30000),
)
def test_coalesced_results_equal_direct_reads(reqs: list, gap: int, max_span: int) -> None:
    store = MemoryStore({"a": BLOB, "b": BLOB[:100], "c": b""})
    calls: list[int] = []

    def fetch(pairs: list) -> list:
        calls.append(len(pairs))
        return [store.get(k, r) for k, r in pairs]

    got = coalesced_get_many(reqs, fetch, gap=gap, max_span=max_span)
    assert got == [store.get(k, r) for k, r in reqs]
    assert len(calls) == 1 and calls[0] <= len(reqs)


def test_latency_store_counts_and_merges() -> None:
    base = MemoryStore({f"obj{i}": BLOB for i in range(5)})
    s = LatencyStore(base, delay=0.01, gap=1024)  # a delay makes overlap (depth 1) certain
    # 200 small ranges in one object, 16 bytes apart: one request
    reqs = [("obj0", (i * 80, i * 80 + 64)) for i in range(200)]
    assert s.get_many(reqs) == [BLOB[a:b] for _, (a, b) in reqs]
    assert s.stats.requests == 1 and s.stats.bytes_read == 199 * 80 + 64
    s.reset_stats()
    # the same ranges spread over five objects: five requests, all in one round trip
    reqs = [(f"obj{i % 5}", (i * 80, i * 80 + 64)) for i in range(200)]
    assert s.get_many(reqs) == [BLOB[a:b] for _, (a, b) in reqs]
    assert s.stats.requests == 5 and s.stats.depth == 1
    # without coalescing every range is a request
    raw = LatencyStore(base, coalesce=False)
    raw.get_many(reqs)
    assert raw.stats.requests == 200


def test_latency_store_delay_and_depth() -> None:
    base = MemoryStore({f"k{i}": b"v" for i in range(20)})
    s = LatencyStore(base, delay=0.05)
    t = time.perf_counter()
    assert s.get_many([f"k{i}" for i in range(20)]) == [b"v"] * 20
    concurrent = time.perf_counter() - t
    assert s.stats.requests == 20 and s.stats.depth == 1 and s.stats.max_in_flight > 1
    assert 0.05 <= concurrent < 0.5
    s.reset_stats()
    t = time.perf_counter()
    for i in range(4):
        s.get(f"k{i}")
    assert time.perf_counter() - t >= 0.2
    assert s.stats.requests == 4 and s.stats.depth == 4


def test_latency_store_passes_writes_and_conditions() -> None:
    s = LatencyStore(MemoryStore(), delay=0.0)
    g = s.set_if("m", b"1", if_generation=None)
    assert s.get_with_generation("m") == (b"1", g)
    s.set("x/y", b"2")
    assert list(s.list()) == ["m", "x/y"] and s.list_dir("") == (["x"], ["m"])
    s.delete("x/y")
    assert s.stats.by_op == {"set_if": 1, "get_with_generation": 1, "set": 1, "list": 2, "delete": 1}
    with pytest.raises(ValueError):
        LatencyStore(MemoryStore(), delay=-1)
