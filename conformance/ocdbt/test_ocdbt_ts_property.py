"""Property test: random operation sequences applied through TensorStore and to a dict model,
then read back by ocdbt-py at every generation."""

from __future__ import annotations

import bisect
import os
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ocdbt_ts_workload import ts_open

import ocdbt_py

ts = pytest.importorskip("tensorstore")

pytestmark = [pytest.mark.tensorstore, pytest.mark.timeout(600)]

_keys = st.one_of(
    st.binary(max_size=4),
    st.sampled_from([b"", b"a", b"a/", b"a/b", b"a/b/c", b"\x00", b"\xff", b"\xff\xff", b"key" * 30]),
)
_values = st.one_of(
    st.binary(max_size=24),
    st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 400), st.integers(0, 255)),
)
_op = st.one_of(
    st.tuples(st.just("write"), _keys, _values),
    st.tuples(st.just("delete"), _keys),
    st.tuples(st.just("delete_range"), _keys, _keys),
)
_config = st.fixed_dictionaries(
    {
        "max_decoded_node_bytes": st.sampled_from([1, 128, 8 << 20]),
        "max_inline_value_bytes": st.sampled_from([0, 8, 100]),
        "version_tree_arity_log2": st.integers(1, 4),
        "compression": st.sampled_from([None, {"id": "zstd"}]),
        "manifest_kind": st.sampled_from(["single", "numbered"]),
    }
)


def _apply(kv: Any, ops: list[tuple[Any, ...]], state: dict[bytes, bytes]) -> None:
    txn = ts.Transaction()
    t = kv.with_transaction(txn)
    for op in ops:
        if op[0] == "write":
            t.write(op[1], op[2]).result()
            state[op[1]] = op[2]
        elif op[0] == "delete":
            t.delete_range(ts.KvStore.KeyRange(op[1], op[1] + b"\x00")).result()
            state.pop(op[1], None)
        else:
            lo, hi = sorted(op[1:])
            t.delete_range(ts.KvStore.KeyRange(lo, hi)).result()
            # an empty exclusive_max means "unbounded" to TensorStore
            for k in [k for k in state if lo <= k and (k < hi or not hi)]:
                del state[k]
    txn.commit_async().result()


def _latest_generation(root: str) -> int | None:
    """The newest generation TensorStore wrote, or ``None`` before its first manifest (a first
    transaction that changes nothing, such as an empty delete_range, writes none)."""
    base = ts.KvStore.open(f"file://{root}/").result()
    try:
        dump = ts.ocdbt.dump(base).result()
    except ValueError as e:
        if "NOT_FOUND" not in str(e):
            raise
        return None
    return int(dump["versions"][-1]["generation_number"])


@given(_config, st.lists(st.lists(_op, min_size=1, max_size=6), min_size=1, max_size=6), st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_operations_match_model(
    config: dict[str, Any], commits: list[list[tuple[Any, ...]]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "db")
        kv = ts_open(root, config)
        state: dict[bytes, bytes] = {}
        expected: dict[int, dict[bytes, bytes]] = {}
        for ops in commits:
            _apply(kv, ops, state)
            gen = _latest_generation(root)
            if gen is None:
                assert not state  # nothing was ever written
                continue
            expected[gen] = dict(state)
        if not expected:  # no manifest at all: we say so too
            with pytest.raises(ocdbt_py.NotFoundError):
                ocdbt_py.open(root)
            return
        db = ocdbt_py.open(root)
        gens = [v.generation for v in db.versions()]
        assert gens == list(range(1, gens[-1] + 1))
        assert set(expected) <= set(gens)
        for g in gens:
            s = db.at(g)
            ours = dict(s.items())
            theirs_kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{root}/", "version": g}).result()
            theirs = {k: theirs_kv.read(k).result().value for k in theirs_kv.list().result()}
            assert ours == theirs, g
            if g in expected:
                assert ours == expected[g], g
        # ranges, prefixes and byte ranges against the model of the latest generation
        s = db.at(gens[-1])
        model = expected[gens[-1]]
        keys = sorted(model)
        assert list(s.list()) == keys
        lo, hi = sorted(data.draw(st.tuples(_keys, _keys)))
        assert list(s.list(start=lo, stop=hi)) == keys[bisect.bisect_left(keys, lo) : bisect.bisect_left(keys, hi)]
        p = data.draw(_keys)
        assert list(s.list(prefix=p)) == [k for k in keys if k.startswith(p)]
        probes = data.draw(st.lists(_keys, max_size=8))
        assert s.get_many(probes) == [model.get(k) for k in probes]
        for k in keys[:4]:
            v = model[k]
            a = data.draw(st.integers(0, len(v)))
            b = data.draw(st.integers(a, len(v)))
            assert s.get(k, (a, b)) == v[a:b] == theirs_kv.read(k, byte_range=slice(a, b)).result().value


def test_a_first_commit_that_changes_nothing_writes_no_manifest() -> None:
    """The case hypothesis found: TensorStore writes no manifest for a first transaction that
    changes nothing (an empty delete_range); we then find no database either."""
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "db")
        kv = ts_open(root, {"max_inline_value_bytes": 0, "manifest_kind": "single"})
        _apply(kv, [("delete_range", b"\x00", b"\x00")], {})
        assert _latest_generation(root) is None
        with pytest.raises(ocdbt_py.NotFoundError):
            ocdbt_py.open(root)
        _apply(kv, [("write", b"a", b"1")], {})
        assert _latest_generation(root) == 2 and ocdbt_py.open(root).get(b"a") == b"1"
