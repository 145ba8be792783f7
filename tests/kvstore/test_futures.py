"""ocdbt_py.kvstore.futures.all_done: one future for several."""

from __future__ import annotations

import concurrent.futures
import threading

from ocdbt_py.kvstore.futures import all_done


def test_all_done_gives_every_outcome_in_order() -> None:
    gate = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        def slow(x: int) -> int:
            gate.wait(5)
            if x == 1:
                raise ValueError("part 1")
            return x * 10

        parts = [pool.submit(slow, i) for i in range(3)]
        combined = all_done(parts)
        assert not combined.done()  # nothing blocks, nothing is done yet
        gate.set()
        out = combined.result(timeout=5)
    assert out[0] == 0 and out[2] == 20
    assert isinstance(out[1], ValueError) and str(out[1]) == "part 1"


def test_all_done_of_nothing_and_of_cancelled() -> None:
    assert all_done([]).result(timeout=1) == []
    f: concurrent.futures.Future[int] = concurrent.futures.Future()
    f.cancel()
    done = concurrent.futures.Future[int]()
    done.set_result(3)
    out = all_done([f, done]).result(timeout=1)
    assert isinstance(out[0], concurrent.futures.CancelledError) and out[1] == 3
