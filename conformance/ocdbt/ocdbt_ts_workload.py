"""Deterministic write workloads applied to an OCDBT database through TensorStore.

Shared by the conformance tests and ``conformance/fixtures/ocdbt/make_fixtures.py``.  A
workload mixes bulk loads, overwrites, deletes of present and absent keys, ``delete_range``,
the empty key, zero-byte values, binary keys and (optionally) a 65535-byte key, and returns
the dict model of every generation it committed.
"""

from __future__ import annotations

import os
import random
from typing import Any

__all__ = ["ts_open", "apply_workload", "Model"]

#: The database state after each transaction of a workload, in commit order.
Model = list[dict[bytes, bytes]]


def ts_open(root: str, config: dict[str, Any] | None = None, **extra: Any) -> Any:
    """Open (creating if needed) the OCDBT database at directory ``root`` with TensorStore."""
    import tensorstore as ts

    spec: dict[str, Any] = {"driver": "ocdbt", "base": f"file://{os.path.abspath(root)}/", **extra}
    if config is not None:
        spec["config"] = config
    return ts.KvStore.open(spec).result()


def _key(rng: random.Random, n: int) -> bytes:
    kind = rng.random()
    if kind < 0.45:
        return f"dir{rng.randrange(3)}/sub{rng.randrange(4)}/k{rng.randrange(n):04d}".encode()
    if kind < 0.75:
        return bytes(rng.choice(b"\x00\x01ab\x7f\x80\xfe\xff") for _ in range(rng.randrange(1, 6)))
    if kind < 0.9:
        return b"params." + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 8)))
    return b"\xff" * rng.randrange(1, 4)


_SIZES = (0, 0, 1, 2, 7, 100, 101, 300, 1025, 5000)


def _value(rng: random.Random, inline_limit: int, sizes: tuple[int, ...]) -> bytes:
    choices = list(sizes)
    if inline_limit <= max(sizes):
        choices += [inline_limit, inline_limit + 1]
    n = rng.choice(choices)
    pattern = bytes(rng.randrange(256) for _ in range(min(n, 64)))
    return (pattern * (n // 64 + 1))[:n]


def apply_workload(
    root: str,
    config: dict[str, Any] | None,
    *,
    seed: int,
    commits: int,
    bulk: int = 40,
    big_key: bool = False,
    empty_key: bool = True,
    value_sizes: tuple[int, ...] = _SIZES,
    **spec_extra: Any,
) -> Model:
    """Apply ``commits`` commits (the first a bulk load of ``bulk`` keys) and return the model.

    Value lengths are drawn from ``value_sizes`` plus the inline limit and one more byte.

    The model has one state per transaction; the last one is the latest generation's.
    """
    import tensorstore as ts

    rng = random.Random(seed)
    kv = ts_open(root, config, **spec_extra)
    inline_limit = (config or {}).get("max_inline_value_bytes", 100)
    state: dict[bytes, bytes] = {}
    model: Model = []
    for c in range(commits):
        # non-atomic: TensorStore may split one transaction into several generations (an atomic
        # transaction that writes a key and then deletes a range starting at it crashes
        # TensorStore 0.1.86 with max_decoded_node_bytes=1)
        txn = ts.Transaction()
        t = kv.with_transaction(txn)
        ops = bulk if c == 0 else rng.randrange(1, 7)
        for _ in range(ops):
            r = rng.random()
            if c == 0 or r < 0.55 or not state:
                k = _key(rng, 60)
                v = _value(rng, inline_limit, value_sizes)
                t.write(k, v).result()
                state[k] = v
            elif r < 0.7:  # overwrite
                k = rng.choice(sorted(state))
                v = _value(rng, inline_limit, value_sizes)
                t.write(k, v).result()
                state[k] = v
            elif r < 0.82:  # delete a present key
                k = rng.choice(sorted(state))
                t.delete_range(ts.KvStore.KeyRange(k, k + b"\x00")).result()
                del state[k]
            elif r < 0.88:  # delete an absent key
                k = _key(rng, 60) + b"#absent"
                t.delete_range(ts.KvStore.KeyRange(k, k + b"\x00")).result()
                state.pop(k, None)
            else:  # delete_range over part of the key space
                keys = sorted(state)
                i = rng.randrange(len(keys))
                j = min(len(keys), i + rng.randrange(1, 6))
                lo = keys[i]
                hi = keys[j] if j < len(keys) else lo + b"\xff\xff"
                t.delete_range(ts.KvStore.KeyRange(lo, hi)).result()
                for k in keys:
                    if lo <= k < hi:
                        del state[k]
        if c == 1 and empty_key:
            t.write(b"", b"").result()
            state[b""] = b""
        if c == 2 and big_key:
            k = b"B" * 65535
            v = b"value of the longest key"
            t.write(k, v).result()
            state[k] = v
        if c == commits - 2 and big_key:
            t.delete_range(ts.KvStore.KeyRange(b"B" * 65535, b"B" * 65535 + b"\x00")).result()
            state.pop(b"B" * 65535, None)
        txn.commit_async().result()
        model.append(dict(state))
    return model
