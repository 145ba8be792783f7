"""The read-buffer pool of restores (bufpool.SlabPool; remoteread._Pool uses MAX_SPAN slabs):
pieces of a few reused slabs, never two live pieces over the same bytes, memory bounded by
the budget plus one slab."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocdbt_py.checkpoint.restore import remoteread
from ocdbt_py.checkpoint.restore.bufpool import SlabPool
from ocdbt_py.checkpoint.restore.remoteread import _Pool


def test_pieces_reuse_the_same_slabs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remoteread, "MAX_SPAN", 1000)
    pool = _Pool(2000)
    a, b = pool.take(600), pool.take(400)  # both in slab 1
    c = pool.take(700)  # slab 2
    assert pool.nbytes == 2000 and len(pool.slabs) == 2
    assert not np.shares_memory(a, b) and not np.shares_memory(a, c)
    pool.give(a)
    d = pool.take(300)  # slab 1 still has b out: slab 2's tail
    assert not np.shares_memory(d, b) and not np.shares_memory(d, c)
    pool.give(b)  # slab 1 empty again: starts over
    e = pool.take(1000)
    assert np.shares_memory(e, a) and len(pool.slabs) == 2
    for x in (c, d, e):
        pool.give(x)
    assert all(s.live == 0 and s.top == 0 for s in pool.slabs)


def test_oversized_or_no_room_gets_its_own_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remoteread, "MAX_SPAN", 1000)
    pool = _Pool(1000)  # one slab, plus one spare
    big = pool.take(5000)
    assert big.nbytes == 5000 and pool.nbytes == 0  # larger than a slab: alone
    held = [pool.take(900), pool.take(900)]  # both slabs
    extra = pool.take(900)  # no room: alone, not a third slab
    assert len(pool.slabs) == 2 and extra.nbytes == 900
    assert not any(np.shares_memory(extra, h) for h in held)
    pool.give(extra)
    pool.give(big)  # buffers of their own are simply dropped
    assert len(pool._owner) == 2


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(st.integers(1, 1500), st.just(-1)), min_size=1, max_size=80))
def test_live_pieces_never_overlap(ops: list[int]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(remoteread, "MAX_SPAN", 1000)
        pool = _Pool(3000)
        live: list[np.ndarray] = []
        for op in ops:
            if op < 0:
                if live:
                    pool.give(live.pop(0))  # oldest first, as requests complete
                continue
            piece = pool.take(op)
            assert piece.nbytes == op
            assert not any(np.shares_memory(piece, x) for x in live)
            live.append(piece)
            assert pool.nbytes <= 3000 + 1000
        for x in live:
            pool.give(x)
        assert all(s.live == 0 for s in pool.slabs)


def test_remote_pool_uses_max_span_slabs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _Pool(64 << 20).slab == remoteread.MAX_SPAN
    monkeypatch.setattr(remoteread, "MAX_SPAN", 4096)
    assert _Pool(64 << 20).slab == 4096
    assert SlabPool(100, 4096).slab == 100  # never a slab larger than the whole budget
