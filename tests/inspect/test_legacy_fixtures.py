"""``stats``/``diff``/``du`` on the committed checkpoints of older Orbax releases (0.5.10 with
msgpack inline values, 0.9.1, 0.11.5; OCDBT and per-array directories, Zarr v2 and v3):
statistics equal NumPy's over our restore of the same checkpoint (itself checked against
those releases' own restores in ``conformance/checkpoint``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.inspect import diff, du, stats
from tests.inspect.conftest import numpy_stats

FIXTURES = Path(__file__).resolve().parents[2] / "conformance" / "fixtures" / "checkpoint"


def _cases() -> list[tuple[str, str]]:
    out = []
    for v in sorted(p.name for p in FIXTURES.glob("orbax-*")):
        info = json.loads((FIXTURES / v / "corpus.json").read_text())
        out += [(v, c["path"]) for c in info["cases"].values()]
    return out


def _numeric(tree: Any, prefix: str, out: dict[str, np.ndarray]) -> None:
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else None
    if items is None:
        a = np.asarray(tree)
        if a.dtype.kind in "biuf" or a.dtype.name in ("bfloat16",):
            out[prefix] = a
        return
    for k, v in items:
        _numeric(v, f"{prefix}.{k}" if prefix else str(k), out)


@pytest.mark.parametrize("version,rel", _cases())
def test_legacy_checkpoint(version: str, rel: str) -> None:
    path = FIXTURES / version / rel
    restored = checkpoint.restore(path)
    want: dict[str, np.ndarray] = {}
    _numeric(restored, "", want)
    got = stats(path)
    assert got, "no tensors found"
    matched = 0
    for name, s in got.items():
        a = want.get(name)
        if a is None and len(got) == 1 and len(want) == 1:  # a bare array (ArrayCheckpointHandler)
            a = next(iter(want.values()))
        assert a is not None, (name, sorted(want))
        w = numpy_stats(a)
        g = s.to_json()
        assert g["shape"] == list(a.shape), name
        for k in ("nan", "inf", "zeros", "size", "min", "max"):
            assert g[k] == w[k], (name, k)
        for k in ("mean", "std"):
            assert g[k] == pytest.approx(w[k], rel=1e-9, abs=1e-12), (name, k)
        matched += 1
    assert matched == len(got)
    assert diff(path, path).equal
    u = du(path)
    assert set(u.tensors) == set(got)
