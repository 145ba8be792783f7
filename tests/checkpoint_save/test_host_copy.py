"""``host_copy.copy_arrays``: private, C-contiguous copies made by threads taking pieces in turn."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ocdbt_py.checkpoint.saving import host_copy


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    big = rng.standard_normal((3000, 1024)).astype(np.float32)  # 11.7 MiB: cut into row pieces
    return [
        np.array(7, dtype=np.int64),  # 0-d
        rng.integers(0, 255, 17, dtype=np.uint8),  # odd size: the next copy starts aligned
        big,
        big[::2, 3:900],  # not contiguous
        rng.standard_normal((64, 64)).astype(np.float16),
        *[rng.standard_normal(4096).astype(np.float64) for _ in range(300)],  # many small ones
        np.asfortranarray(rng.standard_normal((700, 900))),  # Fortran order, 4.8 MiB
    ]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_copies_are_equal_private_and_contiguous(workers: int) -> None:
    arrays = _arrays()
    outs, arena = host_copy.copy_arrays(arrays, workers)
    assert len(outs) == len(arrays)
    for a, c in zip(arrays, outs):
        assert c.dtype == a.dtype and c.shape == a.shape
        assert c.flags.c_contiguous
        assert np.array_equal(c, a)
        assert not np.shares_memory(c, a)
        assert np.shares_memory(c, arena)
    # writes to the sources after the copy do not reach the copies
    arrays[2][:] = -1
    assert not np.any(outs[2] == -1)


def test_a_late_copy_thread_leaves_its_share_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces are taken in turn, not dealt out up front: when the pool's thread only gets going
    after the caller has run out of pieces, the caller has copied everything."""
    arrays = _arrays()
    caller_done = threading.Event()
    taken: dict[str, int] = {}
    real = host_copy._copy_pieces

    def counting(pieces: list[list[tuple[np.ndarray, object]]], order: object) -> None:
        me = threading.current_thread().name
        if threading.current_thread() is not threading.main_thread():
            assert caller_done.wait(10)

        def counted() -> object:
            for i in order:  # type: ignore[attr-defined]
                taken[me] = taken.get(me, 0) + (i < len(pieces))
                yield i

        real(pieces, counted())  # type: ignore[arg-type]
        if threading.current_thread() is threading.main_thread():
            caller_done.set()

    monkeypatch.setattr(host_copy, "_copy_pieces", counting)
    outs, _ = host_copy.copy_arrays(arrays, 2)
    for a, c in zip(arrays, outs):
        assert np.array_equal(c, a)
    # the caller took every piece (the copies are complete), the late thread none
    assert taken.pop(threading.main_thread().name) > 4
    assert taken and sum(taken.values()) == 0
