"""One batch of single-chunk arrays, decoded on the worker pool while the caller goes on.

Most arrays of a checkpoint are stored as one chunk.  A whole-item restore fetches them in
batches (:mod:`.reader`); each batch is planned here (arrays side by side in a fetched buffer
share slabs and are decoded a run at a time, see :mod:`.slabs`; the others are decoded one by
one, a job of ~1 MiB at a time) and its jobs are submitted at once, so that the caller can
hand out the previous batch's arrays, and the next batch can be fetched, while this one
decodes.  :meth:`SingleBatch.results` waits for the jobs and yields the arrays;
:meth:`SingleBatch.abandon` waits for them and releases everything without results.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.restore.gcpause import paused_gc
from ocdbt_py.checkpoint.restore.localread import Placement
from ocdbt_py.checkpoint.restore.pages import HUGE_MIN, output_pages
from ocdbt_py.checkpoint.restore.slabs import Slab, fill_slab, plan_slabs, run_codec
from ocdbt_py.errors import CorruptionError
from zarr3.engine.alloc import empty
from zarr3.engine.executor import get_pool, num_threads

__all__ = ["SingleBatch", "JOB_BYTES"]

#: Arrays decoded one by one are grouped into jobs of about this many output bytes (or 64
#: arrays), to amortize the pool round trip over many tiny arrays.
JOB_BYTES = 1 << 20


class SingleBatch:
    """Decoding of ``batch`` (``(param, Zarr metadata)`` of arrays stored as exactly one
    chunk), whose stored ``datas`` were fetched for ``keys``.  ``done(i)`` releases value
    ``i``'s buffer; ``where`` says where values lie in shared buffers (local reads, see
    :class:`.localread.Placement`), ``None`` elsewhere.  Missing chunks are errors unless
    ``fill_missing``; errors name ``url``."""

    def __init__(self, batch: list[tuple[str, Any]], keys: list[str], datas: list[Any],
                 done: Callable[[int], None] | None, where: Placement | None, *,
                 fill_missing: bool, url: str):
        if not fill_missing and None in datas:
            if where is not None:
                where.release_all()
            i = datas.index(None)
            raise CorruptionError(
                f"array {batch[i][0]!r}: chunk {keys[i]!r} is missing (the checkpoint stores every chunk, so "
                f"a missing one means it is damaged or incomplete)", path=url)
        self.batch = batch
        self.datas = datas
        self.done = done
        self.where = where
        self.url = url
        self.outs: list[Any] = [None] * len(batch)
        self._futures: list[concurrent.futures.Future[Any]] = []
        self._contexts = contextlib.ExitStack()
        try:
            with paused_gc():
                self.slabs, rest, self.nbytes, big = _plan(batch, where)
                self.mems: list[Any] = [None] * len(self.slabs)
                jobs = [self._slab_job(k) for k in range(len(self.slabs))] + self._array_jobs(rest)
            self._contexts.enter_context(output_pages(big))
            if len(jobs) == 1 or num_threads() == 1:
                for job in jobs:
                    job()
            else:
                pool = get_pool()
                self._futures = [pool.submit(job) for job in jobs]
        except BaseException:
            self.abandon()
            raise

    # -- jobs -----------------------------------------------------------------------------
    def _decode(self, i: int, out: np.ndarray | None = None) -> None:
        p, m = self.batch[i]
        raw = self.datas[i]
        if out is None:
            out = self.outs[i] = empty(m.shape, m.data_type.dtype, f"restoring array {p!r}")
        try:
            if raw is None:
                fv = m.fill_value
                out[...] = 0 if fv is None else fv
            elif tuple(m.chunk_shape) == out.shape:
                m.chain.decode_into(raw, out)
            else:  # the single chunk overhangs the array edge
                full = m.chain.decode(raw)
                out[...] = full[tuple(slice(0, n) for n in out.shape)]
        except CorruptionError as e:
            raise CorruptionError(f"array {p!r}: {e.reason}", path=self.url) from e
        if self.where is None:
            self.datas[i] = None  # release the compressed bytes as soon as they are decoded
            if self.done is not None:
                self.done(i)

    def _one_by_one(self, i: int, mem: np.ndarray, offset: int) -> None:
        m = self.batch[i][1]
        out = self.outs[i] = np.ndarray(m.shape, m.data_type.dtype, mem, offset)
        self._decode(i, out)

    def _slab_job(self, k: int) -> Callable[[], None]:
        def run() -> None:
            assert self.where is not None
            self.mems[k] = fill_slab(self.slabs[k], self.where.buffers, self.datas, self.nbytes, self._one_by_one)
        return run

    def _array_jobs(self, rest: list[int]) -> list[Callable[[], None]]:
        def job(idxs: list[int]) -> Callable[[], None]:
            def run() -> None:
                for i in idxs:
                    self._decode(i)
            return run

        jobs = []
        lo = acc = 0
        for k, i in enumerate(rest):
            acc += self.nbytes[i]
            if acc >= JOB_BYTES or k - lo >= 63:
                jobs.append(job(rest[lo:k + 1]))
                lo, acc = k + 1, 0
        if lo < len(rest):
            jobs.append(job(rest[lo:]))
        return jobs

    # -- ending ---------------------------------------------------------------------------
    def _wait(self) -> None:
        """Wait for every job; re-raise the first failure (after all have stopped)."""
        futures, self._futures = self._futures, []
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            concurrent.futures.wait(futures)
            raise

    def _release(self) -> None:
        self._contexts.close()
        if self.where is not None:
            self.where.release_all()

    def results(self) -> Iterator[tuple[str, np.ndarray]]:
        """Wait for the batch and yield ``(param, array)`` for each of its arrays."""
        try:
            self._wait()
            outs = self.outs
            with paused_gc():
                for slab, mem in zip(self.slabs, self.mems):
                    for i, o in zip(slab.idx, slab.offsets):
                        if outs[i] is None:
                            m = self.batch[i][1]
                            outs[i] = np.ndarray(m.shape, m.data_type.dtype, mem, o)
        finally:
            self._release()
        for (p, _), out in zip(self.batch, outs):
            yield p, out

    def abandon(self) -> None:
        """Stop: wait for the jobs already running, drop the rest, release the buffers."""
        futures, self._futures = self._futures, []
        for f in futures:
            f.cancel()
        concurrent.futures.wait(futures)
        self._release()


def _nbytes(meta: Any) -> int:
    return math.prod(meta.shape) * meta.data_type.dtype.itemsize


def _plan(batch: list[tuple[str, Any]], where: Placement | None) -> tuple[list[Slab], list[int], list[int], int]:
    """Slabs for the arrays of a batch that can share them (see :mod:`.slabs`), the indices of
    the arrays decoded one by one, every array's output bytes, and the bytes of outputs large
    enough for huge pages."""
    n = len(batch)
    info: dict[int, tuple[int, int, int]] = {}  # id(meta) -> (bytes, run codec, alignment)
    rows = []
    for _, m in batch:
        row = info.get(id(m))
        if row is None:
            size = _nbytes(m)
            exact = tuple(m.chunk_shape) == tuple(m.shape) and 0 < size < HUGE_MIN
            row = info[id(m)] = (size, run_codec(m.chain) if exact else 0, m.data_type.dtype.alignment)
        rows.append(row)
    cols = np.array(rows, np.int64).reshape(n, 3)
    nb, codec, align = cols[:, 0], cols[:, 1], cols[:, 2]
    if where is None:
        codec = np.zeros(n, np.int64)
        buf = rel = stored = codec
    else:
        buf, rel, stored = (np.array(x, np.int64) for x in (where.buf, where.rel, where.size))
    ok = (codec > 0) & (buf >= 0)
    el = np.flatnonzero(ok)
    slabs = plan_slabs(el, codec[el], nb[el], align[el], buf[el], rel[el], stored[el])
    rest = np.flatnonzero(~ok)
    big = int(nb[rest][nb[rest] >= HUGE_MIN].sum())
    return slabs, rest.tolist(), nb.tolist(), big
