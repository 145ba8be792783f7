"""Orbax's ``jax.monitoring`` events and scalars under Orbax's metric names (internal).

Recorded only when JAX is loaded (ocdbt_py.orbax never imports it for this): listeners a
program registered with ``jax.monitoring`` see the manager as they see Orbax's.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["record_event", "record_scalar"]


def _monitoring() -> Any:
    if "jax" not in sys.modules:
        return None
    import jax  # loaded already (checked above)

    return jax.monitoring


def record_event(name: str, **kwargs: Any) -> None:
    """``jax.monitoring.record_event(name, **kwargs)`` when JAX is loaded."""
    mon = _monitoring()
    if mon is not None:
        mon.record_event(name, **kwargs)


def record_scalar(name: str, value: float, **kwargs: Any) -> None:
    """``jax.monitoring.record_scalar(name, value, **kwargs)`` when JAX is loaded."""
    mon = _monitoring()
    if mon is not None:
        mon.record_scalar(name, value, **kwargs)
