"""Hypothesis stateful test: random commits and transactions against a dict model.

Every generation is kept in the model history; at the end every generation must read back
as its model through ocdbt_py, and a sample of generations through TensorStore.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import ocdbt_py
from tests.ocdbt_write.helpers import assert_verified

try:
    import tensorstore  # noqa: F401

    HAVE_TS = True
except ImportError:  # pragma: no cover
    HAVE_TS = False

keys = st.one_of(
    st.sampled_from([b"", b"a", b"ab", b"abc", b"b", b"\x00", b"\xff", b"\xff\xff"]),
    st.builds(lambda p, s: p + s, st.sampled_from([b"k/", b"k/x/", b"z"]), st.binary(max_size=3)),
)
values = st.one_of(st.binary(max_size=40), st.builds(lambda n, b: bytes([b]) * n,
                                                     st.integers(0, 3000), st.integers(0, 255)))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keys, values),
        st.tuples(st.just("delete"), keys, st.none()),
        st.tuples(st.just("range"), keys, st.one_of(st.none(), keys)),
    ),
    min_size=1, max_size=12,
)
CONFIGS = [
    {},
    {"max_decoded_node_bytes": 120, "max_inline_value_bytes": 8, "version_tree_arity_log2": 1},
    {"max_decoded_node_bytes": 600, "compression": None, "manifest_kind": "numbered",
     "version_tree_arity_log2": 2},
    {"max_inline_value_bytes": 0, "target_data_file_size": 300, "assume_config": True},
]


def _apply(model: dict[bytes, bytes], op: tuple[str, Any, Any]) -> None:
    kind, a, b = op
    if kind == "put":
        model[a] = b
    elif kind == "delete":
        model.pop(a, None)
    else:
        for k in [k for k in model if k >= a and (b is None or k < b)]:
            del model[k]


class WriterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ocdbt-stateful-"))
        self.path = self.dir / "db"
        self.model: dict[bytes, bytes] = {}
        self.history: dict[int, dict[bytes, bytes]] = {}
        self.db: Any = None
        self.config: dict[str, Any] = {}

    @initialize(config=st.sampled_from(CONFIGS))
    def setup(self, config: dict[str, Any]) -> None:
        self.config = config
        self.db = ocdbt_py.open(self.path, mode="a", config=config)

    def _record(self, gen: int) -> None:
        if gen not in self.history:
            self.history[gen] = dict(self.model)
        else:
            assert self.history[gen] == self.model  # no new generation: nothing changed
        if 1 not in self.history and not self.config.get("assume_config"):
            self.history[1] = {}

    @rule(k=keys, v=values)
    def put(self, k: bytes, v: bytes) -> None:
        self.model[k] = v
        self._record(self.db.put(k, v))

    @rule(k=keys)
    def delete(self, k: bytes) -> None:
        self.model.pop(k, None)
        self._record(self.db.delete(k))

    @rule(lo=keys, hi=st.one_of(st.none(), keys))
    def delete_range(self, lo: bytes, hi: bytes | None) -> None:
        _apply(self.model, ("range", lo, hi))
        self._record(self.db.delete_range(lo, hi))

    @rule(batch=ops)
    def transaction(self, batch: list[tuple[str, Any, Any]]) -> None:
        with self.db.transaction() as t:
            view = dict(self.model)
            for op in batch:
                kind, a, b = op
                if kind == "put":
                    t.put(a, b)
                elif kind == "delete":
                    t.delete(a)
                else:
                    t.delete_range(a, b)
                _apply(view, op)
                probe = a
                assert t.get(probe) == view.get(probe)
        self.model = view
        self._record(t.generation)

    @rule(batch=ops)
    def aborted_transaction(self, batch: list[tuple[str, Any, Any]]) -> None:
        before = self.db.generation
        with pytest.raises(KeyError), self.db.transaction() as t:
            for kind, a, b in batch:
                if kind == "put":
                    t.put(a, b)
                elif kind == "range":
                    t.delete_range(a, b)
            raise KeyError("abort")
        assert self.db.generation == before

    @precondition(lambda self: self.db is not None)
    @rule()
    def reopen(self) -> None:
        # writer options (assume_config, target_data_file_size) are not stored: pass them again
        self.db = ocdbt_py.open(self.path, mode="a", config=self.config)

    @precondition(lambda self: self.db is not None)
    @invariant()
    def matches_model(self) -> None:
        assert dict(self.db.items()) == self.model

    def teardown(self) -> None:
        try:
            if self.history:
                self._check_history()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _check_history(self) -> None:
        db = ocdbt_py.open(self.path)
        assert [v.generation for v in db.versions()] == sorted(self.history)
        for g, m in self.history.items():
            assert dict(db.at(g).items()) == m, f"generation {g}"
        assert_verified(self.path)
        if HAVE_TS:
            from tests.ocdbt_write.helpers import ts_snapshot

            gens = sorted(self.history)
            for g in sorted({gens[0], gens[len(gens) // 2], gens[-1]}):
                assert ts_snapshot(self.path, g) == self.history[g], f"tensorstore, generation {g}"


WriterMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=15, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestWriterMachine = WriterMachine.TestCase
