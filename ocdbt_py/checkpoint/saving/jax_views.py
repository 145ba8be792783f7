"""Whether an asynchronous save may keep views of CPU ``jax.Array`` buffers instead of copies.

On CPU devices ``np.asarray`` of a shard is a view of the device buffer itself.  A JAX array
cannot be written in place, so the only ways the caller can change what such a view shows
are donating the array to a computation (which may then reuse the buffer for its output) or
``delete()``-ing it (which frees the buffer).  XLA's CPU client does neither to a buffer that
NumPy still references: a donating computation falls back to writing a new buffer (the
donated array stays alive and unchanged), and a deleted array's memory is released only when
the last view goes.  So a view held until the save has written it is as good a snapshot as a
copy, costs nothing when the caller does not donate, and costs one device-side copy inside
the caller's next donating step when it does, instead of a host copy in ``save()``
(``Continuous()`` with the 8-device JAX model of ``bench/bench_manager.py``: +7.2% / +9.9%
per step with copies, +1.4% / +1.4% with views).

Not covered: a ``jax.Array`` that aliases memory the caller can still write (a zero-copy
``jax.dlpack.from_dlpack`` import); writing it breaks JAX's own immutability as well.

That behaviour belongs to the installed jaxlib, so it is checked once per process before it
is relied on (:func:`views_pin_cpu_buffers`); where the check fails, saves copy as before.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

__all__ = ["views_pin_cpu_buffers"]


@functools.lru_cache(maxsize=1)
def views_pin_cpu_buffers() -> bool:
    """True when a NumPy view of a CPU ``jax.Array`` keeps a donating computation from reusing
    the array's buffer (checked once: a 1 KiB array, a donating ``jit`` call while a view is
    held; the view must be zero-copy, still show the old values, and the array must survive).
    Any error or other outcome gives ``False``."""
    # optional: only called for trees that hold JAX arrays on CPU devices
    import jax

    try:
        cpu = jax.devices("cpu")[0]
        bump = jax.jit(lambda x: x + 1, donate_argnums=0)
        x = bump(jax.device_put(np.zeros(256, np.float32), cpu))  # a computation's output
        view = np.asarray(x.addressable_data(0))
        if view.ctypes.data != x.addressable_data(0).unsafe_buffer_pointer():
            return False  # not a view on this version: nothing to rely on
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "donated buffers were not usable", where emitted
            y = bump(x)
            y.block_until_ready()
        return (not x.is_deleted()) and bool((view == 1).all()) and bool((np.asarray(y) == 2).all())
    except Exception:  # noqa: BLE001 - any failure means: copy, as before
        return False
