"""``stats()``: per-tensor min, max, mean, std and NaN/Inf/zero counts, streamed chunk by chunk.

Moments are over the finite values, accumulated in float64 (each chunk's count, mean and sum
of squared deviations, combined with Chan et al.'s pairwise formula), so bfloat16, float8 and
int4 tensors get exact-as-float64 results and one huge tensor never needs to fit in memory.
``min``/``max`` are over finite values too (NaN and Inf are counted separately).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.restore.api import PathLike
from ocdbt_py.inspect import histogram
from ocdbt_py.inspect.source import (
    Checkpoint,
    ChunkUnit,
    Scratch,
    Tensor,
    chunk_units,
    decode,
    default_workers,
    fetch_raw,
    fill_scalar,
    group_units,
    numeric_view,
    open_checkpoint,
    run_chunks,
    task_bytes,
)
from ocdbt_py.maintenance.verify_data import NO_CHECKSUM

__all__ = ["Moments", "TensorStats", "stats", "checkpoint_stats", "chunk_moments", "run_moments", "checksum_summary"]


@dataclasses.dataclass
class Moments:
    """Mergeable summary of some values: finite count, mean, sum of squared deviations, range,
    NaN/Inf/zero counts and (optionally) histogram pieces."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    nan: int = 0
    inf: int = 0
    zeros: int = 0
    size: int = 0
    pieces: list[histogram.Piece] = dataclasses.field(default_factory=list)

    def add(self, o: Moments) -> None:
        """Merge ``o`` into this summary."""
        if o.n:
            n = self.n + o.n
            delta = o.mean - self.mean
            self.mean += delta * o.n / n
            self.m2 += o.m2 + delta * delta * self.n * o.n / n
            self.n = n
            self.lo = min(self.lo, o.lo)
            self.hi = max(self.hi, o.hi)
        self.nan += o.nan
        self.inf += o.inf
        self.zeros += o.zeros
        self.size += o.size
        self.pieces.extend(o.pieces)


#: Values reduced at a time (their float64 copy stays in the CPU caches).
BLOCK = 1 << 17


def chunk_moments(a: np.ndarray, *, hist: bool = False) -> Moments:
    """The :class:`Moments` of one array (any dtype NumPy or ml_dtypes has; complex values
    get their NaN/Inf/zero counts, other unordered types only their size).  Works through the values in blocks of
    :data:`BLOCK` with one reused float64 buffer, so its memory is small and cache-resident."""
    a = np.asarray(a)
    x = numeric_view(a)
    m = Moments(size=int(a.size))
    if x is None and a.dtype.kind == "c":  # no order: only the counts
        m.nan = int(np.count_nonzero(np.isnan(a)))
        m.inf = int(np.count_nonzero(np.isinf(a)))
        m.zeros = int(a.size - np.count_nonzero(a))
        return m
    if x is None or not x.size:
        return m
    flat = x.reshape(-1)
    buf = np.empty(min(BLOCK, flat.size), np.float64)
    for lo in range(0, flat.size, BLOCK):
        m.add(_block_moments(flat[lo:lo + BLOCK], buf, hist))
    m.size = int(a.size)
    return m


def run_moments(one: np.ndarray, count: int, *, hist: bool = False) -> Moments:
    """The :class:`Moments` of ``count`` copies of the single value in ``one``, computed once."""
    m = chunk_moments(one, hist=hist)
    m.n *= count
    m.nan *= count
    m.inf *= count
    m.zeros *= count
    m.size = count
    for p in m.pieces:
        p.counts = p.counts * count
    return m


def _block_moments(block: np.ndarray, buf: np.ndarray, hist: bool) -> Moments:
    m = Moments(size=int(block.size))
    m.zeros = int(block.size - np.count_nonzero(block))
    if block.dtype.kind == "f":
        fin = np.isfinite(block)
        nfin = int(np.count_nonzero(fin))
        if nfin != block.size:
            m.nan = int(np.count_nonzero(np.isnan(block)))
            m.inf = block.size - nfin - m.nan
            block = block[fin]
    if not block.size:
        return m
    y = buf[:block.size]
    np.copyto(y, block, casting="unsafe")  # exact: every float32/int64-or-smaller value is a float64
    m.n = int(y.size)
    m.lo, m.hi = float(y.min()), float(y.max())
    m.mean = float(y.sum()) / m.n
    if hist:
        m.pieces.append(histogram.piece(y, m.lo, m.hi))
    y -= m.mean
    with np.errstate(over="ignore"):  # deviations near the float64 limit: std is then Inf (None)
        np.square(y, out=y)
    m.m2 = float(y.sum())  # pairwise summation (BLAS dot would pay a thread hand-off per block)
    return m


@dataclasses.dataclass
class TensorStats:
    """Statistics of one tensor (``None`` where there is no finite value)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int
    zeros: int
    size: int
    histogram: list[int] | None = None
    #: whether every stored chunk carries a checksum checked on decode (``None``: no stored chunk)
    checksummed: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``ocdbt stats --json`` prints for this tensor."""
        d: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        for k in ("min", "max", "mean", "std"):
            v = getattr(self, k)
            d[k] = None if v is None or not math.isfinite(v) else v
        d.update(nan=self.nan, inf=self.inf, zeros=self.zeros, size=self.size, checksummed=self.checksummed)
        if self.histogram is not None:
            d["histogram"] = {"lo": d["min"], "hi": d["max"], "counts": self.histogram}
        return d

    @property
    def nonfinite(self) -> bool:
        """Whether the tensor holds NaN or Inf."""
        return bool(self.nan or self.inf)


def _finish(t: Tensor, m: Moments, hist: bool, sums: list[int]) -> TensorStats:
    has = m.n > 0
    h = histogram.merge(m.pieces, m.lo, m.hi) if hist and has else None
    return TensorStats(t.name, t.shape, t.dtype.name, m.lo if has else None, m.hi if has else None,
                       m.mean if has else None, math.sqrt(max(m.m2, 0.0) / m.n) if has else None,
                       m.nan, m.inf, m.zeros, m.size, h, None if not sums[1] else sums[0] == sums[1])


def _carries_checksum(u: ChunkUnit, raw: Any) -> int | None:
    """1 or 0 for a stored chunk (whether it carries a checksum), ``None`` for no stored chunk."""
    if raw is None or u.tensor.item is None:
        return None
    return int(u.tensor.zarr().chain.carries_checksum(raw))


def checkpoint_stats(ck: Checkpoint, *, hist: bool = False, workers: int | None = None,
                     progress: Callable[[int, int], None] | None = None) -> dict[str, TensorStats]:
    """Statistics of every tensor of an opened checkpoint (``{name: TensorStats}``, in the
    checkpoint's leaf order).  ``progress(done_bytes, total_bytes)`` is called as chunks finish."""
    total = sum(t.nbytes for t in ck.tensors)
    acc = {t.name: Moments() for t in ck.tensors}
    done = [0]
    scratch = Scratch()

    sums = {t.name: [0, 0] for t in ck.tensors}  # [checksummed chunks, stored chunks]

    def task(units: list[ChunkUnit]) -> list[tuple[str, Moments, int | None]]:
        raws = fetch_raw(units)
        out: list[tuple[str, Moments, int | None]] = []
        try:
            for i, u in enumerate(units):
                if u.fill:  # absent chunks of a large grid: one run of the fill value
                    out.append((u.tensor.name, run_moments(fill_scalar(u.tensor), u.fill, hist=hist), None))
                    continue
                summed = _carries_checksum(u, raws.values[i])
                a = decode(u, raws.values[i], scratch)  # or a view of the stored bytes (no codec)
                out.append((u.tensor.name, chunk_moments(a, hist=hist), summed))
                del a
                raws.release(i)  # the buffer goes back as soon as the chunk is reduced
        finally:
            raws.release_all()
        return out

    def step(units: list[ChunkUnit]) -> None:
        done[0] += sum(u.nbytes for u in units)
        if progress is not None:
            progress(done[0], total)

    units = (u for t in ck.tensors for u in chunk_units(t, runs=True))
    nworkers = workers or default_workers(ck.remote)
    for res in run_chunks(group_units(units), task, workers=nworkers, progress=step, weight=task_bytes):
        for name, m, summed in res:
            acc[name].add(m)
            if summed is not None:
                sums[name][0] += summed
                sums[name][1] += 1
    return {t.name: _finish(t, acc[t.name], hist, sums[t.name]) for t in ck.tensors}


def checksum_summary(result: Iterable[TensorStats]) -> str:
    """One line: whether the stored values of these tensors carry checksums checked on read."""
    stored = [t for t in result if t.checksummed is not None]
    summed = sum(1 for t in stored if t.checksummed)
    if not stored:
        return "values checksummed: no stored chunks"
    if summed == len(stored):
        return "values checksummed: every stored chunk carries a checksum, checked on read"
    if summed == 0:
        return NO_CHECKSUM + " (save with checksum=True to add them)"
    return (f"{len(stored) - summed} of {len(stored)} tensors have chunks without a checksum: a change that "
            "still decodes cannot be detected there")


def stats(path: PathLike, *, include: Sequence[str] | None = None, step: int | None = None,
          storage_options: dict[str, Any] | None = None, histograms: bool = False, workers: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> dict[str, TensorStats]:
    """Per-tensor statistics of a checkpoint (item, step or manager root; any fsspec URL),
    streamed chunk by chunk on ``workers`` threads without restoring it.

    ``include``: glob patterns on dotted names.  ``histograms``: also a value histogram per
    tensor (:data:`ocdbt_py.inspect.histogram.BINS` bins over ``[min, max]``).
    """
    with open_checkpoint(path, step=step, storage_options=storage_options, include=include) as ck:
        return checkpoint_stats(ck, hist=histograms, workers=workers, progress=progress)
