"""Deterministic per-step items and metrics for the CheckpointManager interop tests.

Imported both by the test module (no JAX) and by ``_interop_worker.py`` (JAX + Orbax), so
either side can rebuild what any step should hold from its step number alone.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

#: Losses and accuracies by step: the best-2 by loss (min) of steps 0-5 are 2 and 5, so
#: ``max_to_keep=2, keep_period=4, best_fn=loss, best_mode='min'`` keeps [0, 2, 4, 5].
LOSSES = [6.0, 5.0, 1.0, 4.0, 3.0, 0.5, 2.5, 0.75, 7.0, 0.25]
ACCS = [0.1, 0.3, 0.2, 0.9, 0.5, 0.4, 0.8, 0.35, 0.95, 0.6]


def params(step: int) -> dict[str, Any]:
    """A pytree of several dtypes; the kernel (8 KiB) is stored out of line."""
    rng = np.random.default_rng(1000 + step)
    return {
        "dense": {
            "kernel": rng.standard_normal((64, 32)).astype(np.float32),
            "bias": (np.arange(16, dtype=np.int32) * (step + 1)),
        },
        "emb": rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16),
        "mask": np.arange(10) % (step + 2) == 0,
        "count": np.asarray(step * 7, np.int64),
    }


def opt_state(step: int) -> dict[str, Any]:
    """A second pytree item."""
    return {
        "mu": np.full((8, 8), step * 0.5, np.float64),
        "nu": {"a": (np.arange(12, dtype=np.uint8) * (step + 3)).reshape(3, 4),
               "b": np.linspace(0, step, 5).astype(np.float16)},
    }


def config(step: int) -> dict[str, Any]:
    """A JSON item."""
    return {"step": step, "lr": [0.1, 0.01], "name": f"run-{step}", "nested": {"ok": True, "none": None}}


def metrics(step: int) -> dict[str, Any]:
    """The metrics saved with ``step``."""
    return {"loss": LOSSES[step], "acc": ACCS[step]}


BUILDERS = {"params": params, "opt_state": opt_state}


def expected(step: int, items: dict[str, str], with_metrics: bool) -> dict[str, Any]:
    """What a composite step holds: ``items`` maps item names to ``"params"``,
    ``"opt_state"`` (pytrees) or ``"json"`` (:func:`config`)."""
    out: dict[str, Any] = {}
    for name, kind in items.items():
        out[name] = config(step) if kind == "json" else BUILDERS[kind](step)
    if with_metrics:
        out["metrics"] = metrics(step)
    return out


def compare(got: Any, want: Any, path: str = "") -> list[str]:
    """Differences between a restored tree and the expected one (exact: dtype, shape, bits).

    Leaves may come back as NumPy or JAX arrays or NumPy scalars; containers must match
    (dict keys, list lengths).  JSON values compare with ``==``.
    """
    where = path or "<root>"
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{where}: {type(got).__name__} instead of a dict"]
        if set(got) != set(want):
            return [f"{where}: keys {sorted(got)} != {sorted(want)}"]
        errs: list[str] = []
        for k in want:
            errs += compare(got[k], want[k], f"{path}.{k}" if path else str(k))
        return errs
    if isinstance(want, (list, tuple)) and not isinstance(want, np.ndarray):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return [f"{where}: {got!r} != {want!r}"]
        errs = []
        for i, (g, w) in enumerate(zip(got, want)):
            errs += compare(g, w, f"{path}[{i}]")
        return errs
    if isinstance(want, np.ndarray):
        if not hasattr(got, "dtype") or not hasattr(got, "shape"):
            return [f"{where}: {type(got).__name__} instead of an array"]
        g = np.asarray(got)
        if g.dtype != want.dtype or g.shape != want.shape:
            return [f"{where}: {g.dtype}{g.shape} != {want.dtype}{want.shape}"]
        if g.tobytes() != want.tobytes():
            return [f"{where}: values differ"]
        return []
    if got != want or type(got) is not type(want):
        return [f"{where}: {got!r} != {want!r}"]
    return []
