"""``IoSink``: bounded queued writes, the first failure re-raised, nothing kept per finished write."""

from __future__ import annotations

import threading

import pytest

from zarr3.engine import executor
from zarr3.engine.executor import IoSink


@pytest.fixture(autouse=True)
def _threads() -> object:
    old = executor.num_threads()
    executor.set_num_threads(4)
    yield
    executor.set_num_threads(old)


def test_every_write_runs_and_finished_ones_are_not_kept() -> None:
    sink = IoSink(max_pending=8)
    done: list[int] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        with lock:
            done.append(i)

    for i in range(20_000):
        sink.submit(lambda i=i: write(i))
        assert len(sink._pending) <= 8  # only writes in flight are held
    sink.wait()
    assert sorted(done) == list(range(20_000))
    assert not sink._pending


def test_first_failure_is_raised_and_stops_further_writes() -> None:
    sink = IoSink(max_pending=4)
    ran: list[int] = []
    gate = threading.Event()

    def bad() -> None:
        raise OSError("disk full")

    sink.submit(bad)
    for _ in range(10_000):  # until the failing write has finished (at most ~10 s)
        if sink._error is not None:
            break
        gate.wait(0.001)
    assert sink._error is not None
    with pytest.raises(OSError, match="disk full"):
        sink.submit(lambda: ran.append(1))
    assert ran == []  # nothing was queued after the failure
    with pytest.raises(OSError, match="disk full"):
        sink.wait()
    sink.wait(suppress=True)  # the caller cleaning up after its own error


def test_wait_blocks_until_writes_finish() -> None:
    sink = IoSink(max_pending=4)
    release = threading.Event()
    finished: list[str] = []

    def slow() -> None:
        release.wait(10)
        finished.append("slow")

    sink.submit(slow)
    threading.Timer(0.05, release.set).start()
    sink.wait()
    assert finished == ["slow"]
