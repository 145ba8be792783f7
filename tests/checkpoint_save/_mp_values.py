"""The global arrays the multi-process save tests write, and their partition specs."""

from __future__ import annotations

import numpy as np

#: name -> PartitionSpec entries over a (devices // 2, 2) mesh ("data", "model").
SPECS: dict[str, tuple] = {
    "kernel": ("data", "model"),
    "embed": ("data",),
    "bias": (),
    "cols": (None, "model"),
    "wide": (("data", "model"),),
}


def global_values() -> dict[str, np.ndarray]:
    """Deterministic global values (the same in every process and in the checker)."""
    import ml_dtypes

    return {
        "kernel": np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32),
        "embed": (np.arange(64 * 4) % 251).reshape(64, 4).astype(ml_dtypes.bfloat16),
        "bias": np.linspace(-1, 1, 16).astype(np.float32),
        "cols": np.arange(16 * 8, dtype=np.int32).reshape(16, 8),
        "wide": np.arange(16 * 3, dtype=np.float32).reshape(16, 3) / 4,
        "np_leaf": np.arange(10, dtype=np.int16),
    }
