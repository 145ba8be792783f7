""":class:`~ocdbt_py.kvstore.KvStore` wrappers for tests and benchmarks: injected faults
(:mod:`.faults`) and added latency with request counts (:mod:`.latency`)."""
