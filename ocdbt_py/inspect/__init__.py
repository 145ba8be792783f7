"""Seeing inside a checkpoint without restoring it: per-tensor statistics (:func:`stats`),
differences between two checkpoints (:func:`diff`), where the bytes are (:func:`du`) and a
self-contained HTML page (:func:`report`).  Everything streams chunk by chunk from any fsspec
URL; no JAX."""

from __future__ import annotations

from ocdbt_py.inspect.diff import DiffResult, diff
from ocdbt_py.inspect.du import DiskUsage, Usage, du
from ocdbt_py.inspect.report import report
from ocdbt_py.inspect.stats import TensorStats, stats

__all__ = ["stats", "diff", "du", "report", "TensorStats", "DiffResult", "DiskUsage", "Usage"]
