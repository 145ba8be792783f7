""":class:`~ocdbt_py.kvstore.KvStore` wrappers for tests and benchmarks (injected faults,
:mod:`.faults`; added latency with request counts, :mod:`.latency`) and the behaviour suite
every backend passes, :class:`StoreTests` / :class:`ReadOnlyStoreTests` (:mod:`.store_tests`).

An outside backend runs the suite as zarr-python's ``zarr.testing`` is run::

    from ocdbt_py.testing import StoreTests

    class TestMyStore(StoreTests):
        def make_empty(self):
            return MyStore(...)

The suite needs pytest (``pip install ocdbt-py[testing]``); it is imported only when asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StoreTests", "ReadOnlyStoreTests", "SEED", "BAD_KEYS"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # optional: the suite imports pytest, which only test runs have
        from ocdbt_py.testing import store_tests

        return getattr(store_tests, name)
    raise AttributeError(name)
