"""``ocp.checkpoint_utils``: ``construct_restore_args`` (restore arguments from a target tree)
and the evaluation-loop helpers ``checkpoints_iterator`` / ``wait_for_new_checkpoint``."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.meta import list_steps
from ocdbt_py.checkpoint.pytree import flatten_with_names
from ocdbt_py.errors import NotFoundError
from ocdbt_py.orbax.type_handlers import ArrayRestoreArgs, RestoreArgs

__all__ = ["construct_restore_args", "wait_for_new_checkpoint", "checkpoints_iterator"]


def _restore_args(x: Any, sharding: Any, set_global_shape: bool) -> RestoreArgs:
    if "jax" in sys.modules:
        import jax  # only when the caller has loaded JAX

        if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
            s = sharding if sharding is not None else getattr(x, "sharding", None)
            return ArrayRestoreArgs(sharding=s, global_shape=tuple(x.shape) if set_global_shape else None,
                                    dtype=x.dtype)
    if isinstance(x, (np.ndarray, np.generic)):
        return RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return RestoreArgs(restore_type=type(x))
    return RestoreArgs(restore_type=type(x) if x is not None else None)


def construct_restore_args(target: Any, sharding_tree: Any = None, set_global_shape: bool = True,
                           support_layout: bool = False) -> Any:
    """A tree of :class:`ArrayRestoreArgs` (JAX leaves: their sharding, shape and dtype) and
    :class:`RestoreArgs` (NumPy and Python leaves) shaped like ``target``."""
    flat, rebuild = flatten_with_names(target)
    shardings: dict[Any, Any] = {}
    if sharding_tree is not None:
        shardings = dict(flatten_with_names(sharding_tree)[0])
    return rebuild([_restore_args(x, shardings.get(names), set_global_shape) for names, x in flat])


def _steps(checkpoint_dir: Any) -> list[int]:
    try:
        return [s.step for s in list_steps(checkpoint_dir)]
    except NotFoundError:
        return []


def _wait(checkpoint_dir: Any, until_step: int | None, after: int | None, seconds_to_sleep: float,
          timeout: float | None) -> int:
    """The newest step (``>= until_step``, ``> after``), or -1 once ``timeout`` passed."""
    start = time.monotonic()
    while True:
        steps = [s for s in _steps(checkpoint_dir) if after is None or s > after]
        if steps and (until_step is None or max(steps) >= until_step):
            return max(steps)
        if timeout is not None and time.monotonic() - start + seconds_to_sleep > timeout:
            return -1
        time.sleep(seconds_to_sleep)


@contextlib.contextmanager
def wait_for_new_checkpoint(checkpoint_dir: Any, *, until_step: int | None = None, seconds_to_sleep: int = 1,
                            timeout: int | None = None, timeout_fn: Callable[[], bool] | None = None,
                            **ignored: Any) -> Iterator[int]:
    """Wait for a finalized step (``>= until_step`` when given) and yield it (``-1`` after
    ``timeout``).  Orbax snapshots the step while the caller holds it; ocdbt_py does not
    (keep ``max_to_keep`` large enough for readers)."""
    yield _wait(checkpoint_dir, until_step, None, seconds_to_sleep, timeout)


def checkpoints_iterator(checkpoint_dir: Any, *, min_interval_secs: int = 0, seconds_to_sleep: int = 1,
                         timeout: int | None = None, timeout_fn: Callable[[], bool] | None = None,
                         **ignored: Any) -> Iterator[int]:
    """Yield each new finalized step as it appears (the newest one when several arrived);
    stop after ``timeout`` seconds without one unless ``timeout_fn()`` returns ``False``."""
    last: int | None = None
    while True:
        started = time.monotonic()
        step = _wait(checkpoint_dir, None, last, seconds_to_sleep, timeout)
        if step == -1:
            if timeout_fn is None or timeout_fn():
                return
            continue
        last = step
        yield step
        pause = min_interval_secs - (time.monotonic() - started)
        if pause > 0:
            time.sleep(pause)
