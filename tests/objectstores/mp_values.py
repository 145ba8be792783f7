"""The global arrays the multi-process object-store save writes, and their partition specs."""

from __future__ import annotations

import numpy as np

#: name -> PartitionSpec entries over a (devices // 2, 2) mesh ("data", "model").
SPECS: dict[str, tuple] = {
    "kernel": ("data", "model"),
    "embed": ("data",),
    "bias": (),
}


def global_values() -> dict[str, np.ndarray]:
    """Deterministic values, the same in every process and in the checker."""
    return {
        "kernel": np.random.default_rng(5).standard_normal((32, 16)).astype(np.float32),
        "embed": (np.arange(32 * 4) % 97).reshape(32, 4).astype(np.int32),
        "bias": np.linspace(-1, 1, 8).astype(np.float32),
    }
