"""``diff()``: what differs between two checkpoints, tensor by tensor.

Tensors are matched by dotted name.  Where both sides store a tensor with the same shape,
dtype, chunking and codecs, the stored bytes of each chunk are compared first and only chunks
whose bytes differ are decoded (two identical checkpoints are compared without decoding
anything).  Otherwise (another layout, chunking or compression; an inline value) each chunk of
``a`` is decoded and the same region of ``b`` read.  Values compare equal when
``|a - b| <= atol + rtol * |b|`` (NumPy's ``isclose``), NaN equal to NaN, +-Inf to itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.restore.api import PathLike
from ocdbt_py.inspect.source import (
    Checkpoint,
    ChunkUnit,
    Scratch,
    Tensor,
    chunk_units,
    decode,
    default_workers,
    fetch_raw,
    group_units,
    numeric_view,
    open_checkpoint,
    run_chunks,
    same_bytes,
    task_bytes,
)

__all__ = ["DiffResult", "ValueDiff", "diff", "diff_checkpoints"]


@dataclasses.dataclass
class ValueDiff:
    """How much two tensors' values differ (mergeable over chunks)."""

    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    sum_sq: float = 0.0
    n_diff: int = 0
    nonfinite_diff: int = 0
    chunks: int = 0
    chunks_same_bytes: int = 0

    def add(self, o: ValueDiff) -> None:
        """Merge ``o`` into this one."""
        self.max_abs_diff = max(self.max_abs_diff, o.max_abs_diff)
        self.max_rel_diff = max(self.max_rel_diff, o.max_rel_diff)
        self.sum_sq += o.sum_sq
        self.n_diff += o.n_diff
        self.nonfinite_diff += o.nonfinite_diff
        self.chunks += o.chunks
        self.chunks_same_bytes += o.chunks_same_bytes


def _as_f64(a: np.ndarray) -> np.ndarray | None:
    if a.dtype.kind == "c":
        return a.astype(np.complex128, copy=False)
    x = numeric_view(np.asarray(a))
    return None if x is None else x.astype(np.float64, copy=False)


def compare_values(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> ValueDiff:
    """The :class:`ValueDiff` of two equally shaped arrays."""
    d = ValueDiff(chunks=1)
    x, y = _as_f64(a), _as_f64(b)
    if x is None or y is None:  # complex and other types: equal or not, element by element
        ne = ~((a == b) | ((a != a) & (b != b)))
        d.n_diff = int(np.count_nonzero(ne))
        return d
    x, y = x.reshape(-1), y.reshape(-1)
    same = x == y
    if x.dtype.kind in "fc":
        same |= np.isnan(x) & np.isnan(y)
    if same.all():
        return d
    with np.errstate(over="ignore", invalid="ignore"):  # Inf - Inf, or beyond float64's range
        diff = np.abs(x - y)
    diff[same] = 0.0
    bad = ~np.isfinite(diff)  # NaN or Inf on one side only (or Inf of opposite signs)
    d.nonfinite_diff = int(np.count_nonzero(bad))
    if d.nonfinite_diff:
        diff[bad] = 0.0
    if rtol:
        with np.errstate(invalid="ignore"):  # Inf in b: those elements are counted in ``bad``
            ok = diff <= atol + rtol * np.abs(y)
    else:
        ok = diff <= atol
    d.n_diff = int(np.count_nonzero(~ok & ~bad)) + d.nonfinite_diff
    d.max_abs_diff = float(diff.max())
    d.sum_sq = float(np.square(diff).sum())
    denom = np.maximum(np.abs(x), np.abs(y))
    pos = (denom > 0) & np.isfinite(denom)
    if pos.any():
        d.max_rel_diff = float((diff[pos] / denom[pos]).max())
    return d


@dataclasses.dataclass
class DiffResult:
    """The outcome of :func:`diff`: tensors ``added`` (only in ``b``), ``removed`` (only in
    ``a``), ``changed`` (``{name: details}``) and ``unchanged``."""

    changed: dict[str, dict[str, Any]]
    added: list[str]
    removed: list[str]
    unchanged: list[str]

    @property
    def equal(self) -> bool:
        """Whether nothing was added, removed or changed."""
        return not (self.changed or self.added or self.removed)

    def to_json(self) -> dict[str, Any]:
        """``{"changed": {name: {...}}, "added": [...], "removed": [...], "unchanged": [...]}``."""
        return {"changed": self.changed, "added": self.added, "removed": self.removed, "unchanged": self.unchanged}


def _fingerprint(t: Tensor) -> str | None:
    """Shape, dtype, chunking and codecs of a stored tensor: equal fingerprints mean equal
    chunk bytes encode equal values."""
    m = t.zarr()
    if m is None:
        return None
    doc = m.to_json()
    for k in ("attributes", "dimension_names"):
        doc.pop(k, None)
    return json.dumps(doc, sort_keys=True, default=str)


def _pairs_task(atol: float, rtol: float, other: dict[str, Tensor], same_codec: set[str]
                ) -> Callable[[list[ChunkUnit]], list[tuple[str, ValueDiff]]]:
    scratch = Scratch()

    def task(units: list[ChunkUnit]) -> list[tuple[str, ValueDiff]]:
        fast = [u for u in units if u.tensor.name in same_codec]
        slow = [u for u in units if u.tensor.name not in same_codec]
        out: list[tuple[str, ValueDiff]] = []
        if fast:
            twins = [dataclasses.replace(u, tensor=other[u.tensor.name]) for u in fast]
            ra, rb = fetch_raw(fast), fetch_raw(twins)
            try:
                for i, u in enumerate(fast):
                    x, y = ra.values[i], rb.values[i]
                    if same_bytes(x, y):
                        d = ValueDiff(chunks=1, chunks_same_bytes=1)
                    else:
                        a, b = decode(u, x, scratch, 0), decode(twins[i], y, scratch, 1)
                        d = compare_values(a, b, atol, rtol)
                        del a, b
                    ra.release(i)
                    rb.release(i)
                    out.append((u.tensor.name, d))
            finally:
                ra.release_all()
                rb.release_all()
        if slow:
            raws = fetch_raw(slow)
            try:
                for i, u in enumerate(slow):
                    a = decode(u, raws.values[i], scratch)  # or a view of the stored bytes
                    b = other[u.tensor.name].read(u.region)
                    out.append((u.tensor.name, compare_values(a, b, atol, rtol)))
                    del a
                    raws.release(i)
            finally:
                raws.release_all()
        return out
    return task


def _finite(v: float) -> float | None:
    """``v``, or ``None`` when it overflowed (JSON has no Infinity)."""
    return v if math.isfinite(v) else None


def diff_checkpoints(a: Checkpoint, b: Checkpoint, *, atol: float = 0.0, rtol: float = 0.0,
                     workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> DiffResult:
    """Compare two opened checkpoints (see :func:`diff`)."""
    ta, tb = a.by_name(), b.by_name()
    removed = [n for n in ta if n not in tb]
    added = [n for n in tb if n not in ta]
    changed: dict[str, dict[str, Any]] = {}
    compare: list[Tensor] = []
    for n, x in ta.items():
        y = tb.get(n)
        if y is None:
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            changed[n] = {"reason": "shape" if x.shape != y.shape else "dtype",
                          "shape_a": list(x.shape), "shape_b": list(y.shape),
                          "dtype_a": x.dtype.name, "dtype_b": y.dtype.name}
        else:
            compare.append(x)
    same_codec = {t.name for t in compare if (fp := _fingerprint(t)) is not None and fp == _fingerprint(tb[t.name])}
    acc = {t.name: ValueDiff() for t in compare}
    total = sum(t.nbytes for t in compare)
    done = [0]

    def step(units: list[ChunkUnit]) -> None:
        done[0] += sum(u.nbytes for u in units)
        if progress is not None:
            progress(done[0], total)

    units = (u for t in compare for u in chunk_units(t))
    task = _pairs_task(atol, rtol, tb, same_codec)
    nworkers = workers or default_workers(a.remote or b.remote)
    for res in run_chunks(group_units(units), task, workers=nworkers, progress=step, weight=task_bytes):
        for name, d in res:
            acc[name].add(d)
    unchanged = []
    for t in compare:
        d = acc[t.name]
        if d.n_diff == 0:
            unchanged.append(t.name)
            continue
        changed[t.name] = {
            "reason": "values", "shape": list(t.shape), "dtype": t.dtype.name,
            "max_abs_diff": _finite(d.max_abs_diff), "max_rel_diff": _finite(d.max_rel_diff),
            "l2": _finite(math.sqrt(d.sum_sq)),
            "n_diff": d.n_diff, "nonfinite_diff": d.nonfinite_diff, "size": math.prod(t.shape),
            "chunks": d.chunks, "chunks_same_bytes": d.chunks_same_bytes,
        }
    order = {n: i for i, n in enumerate(ta)}
    changed = dict(sorted(changed.items(), key=lambda kv: order[kv[0]]))
    return DiffResult(changed, added, removed, unchanged)


def diff(a: PathLike, b: PathLike, *, step_a: int | None = None, step_b: int | None = None,
         atol: float = 0.0, rtol: float = 0.0, include: list[str] | None = None,
         storage_options_a: dict[str, Any] | None = None, storage_options_b: dict[str, Any] | None = None,
         workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> DiffResult:
    """Compare checkpoints ``a`` and ``b`` (items, steps or manager roots -- ``step_a``/``step_b``
    pick steps; any stores and layouts), streaming chunk by chunk.

    Changed tensors get ``max_abs_diff``, ``max_rel_diff`` (relative to the larger magnitude
    of the two values), ``l2`` (norm of the difference over finite differences), ``n_diff``
    (elements outside the tolerance) and ``nonfinite_diff`` (elements NaN or Inf on one side
    only); or ``reason`` ``"shape"``/``"dtype"`` when those differ.
    """
    with open_checkpoint(a, step=step_a, storage_options=storage_options_a, include=include) as ca, \
            open_checkpoint(b, step=step_b, storage_options=storage_options_b, include=include) as cb:
        return diff_checkpoints(ca, cb, atol=atol, rtol=rtol, workers=workers, progress=progress)
