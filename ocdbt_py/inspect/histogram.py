"""Value histograms built while streaming: each chunk is binned over its own range, and the
pieces are merged onto the tensor's final range at the end (each piece's bin goes to the final
bin holding its centre), so no second pass over the data is needed."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["BINS", "Piece", "piece", "merge"]

#: Bins of a tensor's histogram.
BINS = 40


@dataclasses.dataclass
class Piece:
    """A chunk's histogram: ``counts`` over ``BINS`` equal bins of ``[lo, hi]``."""

    lo: float
    hi: float
    counts: np.ndarray


def piece(finite: np.ndarray, lo: float, hi: float) -> Piece:
    """The histogram of ``finite`` values (a flat float64 array within ``[lo, hi]``)."""
    if hi <= lo:
        counts = np.zeros(BINS, np.int64)
        counts[0] = finite.size
        return Piece(lo, lo, counts)
    t = np.subtract(finite, lo)
    t *= BINS / (hi - lo)
    idx = t.astype(np.intp)
    np.minimum(idx, BINS - 1, out=idx)  # the maximum itself goes into the last bin
    return Piece(lo, hi, np.bincount(idx, minlength=BINS).astype(np.int64))


def merge(pieces: list[Piece], lo: float, hi: float) -> list[int]:
    """The counts of ``BINS`` bins over ``[lo, hi]`` from the chunks' pieces."""
    out = np.zeros(BINS, np.int64)
    width = (hi - lo) / BINS if hi > lo else 0.0
    for p in pieces:
        if p.hi > p.lo:
            centres = p.lo + (np.arange(BINS) + 0.5) * ((p.hi - p.lo) / BINS)
        else:
            centres = np.full(BINS, p.lo)
        if width > 0:
            idx = np.clip(((centres - lo) / width).astype(np.int64), 0, BINS - 1)
        else:
            idx = np.zeros(BINS, np.int64)
        np.add.at(out, idx, p.counts)
    return [int(c) for c in out]
