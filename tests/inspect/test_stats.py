"""``stats()`` and ``ocdbt stats`` against NumPy on checkpoints with planted NaN/Inf/zeros in
float32, float16, bfloat16, float8 (e5m2, e4m3fn), int8 and int4, in every layout we write."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.inspect import stats
from ocdbt_py.inspect.source import open_checkpoint
from ocdbt_py.inspect.stats import Moments, chunk_moments
from tests.inspect.conftest import assert_stats_match, planted_tree


def _json(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to_json() for k, v in result.items()}


def test_planted_values_match_numpy(planted_ckpt: tuple[Path, dict[str, Any]]) -> None:
    path, tree = planted_ckpt
    with open_checkpoint(path) as ck:  # the test means something only if arrays span many chunks
        t = ck.by_name()["params.float32"]
        assert t.meta is not None and t.meta.nchunks is not None and t.meta.nchunks > 4
    assert_stats_match(_json(stats(path)), tree)


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_give_the_same_result(planted_ckpt: tuple[Path, dict[str, Any]], workers: int) -> None:
    path, tree = planted_ckpt
    assert_stats_match(_json(stats(path, workers=workers)), tree)


@pytest.mark.parametrize("zarr3,compression", [(False, False), (True, True), (True, False)])
def test_layouts(tmp_path: Path, zarr3: bool, compression: bool) -> None:
    tree = planted_tree(seed=3)
    checkpoint.save(tmp_path / "c", tree, use_zarr3=zarr3, use_compression=compression, chunk_byte_size=4096)
    assert_stats_match(_json(stats(tmp_path / "c")), tree)


def test_include_globs_and_a_step_directory(tmp_path: Path) -> None:
    tree = planted_tree(seed=1)
    checkpoint.save(tmp_path / "s", {"model": tree, "meta": checkpoint.JsonItem({"a": 1})}, composite=True)
    got = stats(tmp_path / "s", include=["model.params.float*"])
    assert sorted(got) == sorted(f"model.params.{n}" for n in ("float32", "float16", "float8_e5m2",
                                                               "float8_e4m3fn"))
    assert got["model.params.float32"].nan == 3


def test_progress_reaches_the_total(planted_ckpt: tuple[Path, dict[str, Any]]) -> None:
    calls: list[tuple[int, int]] = []
    stats(planted_ckpt[0], progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1] > 0
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_moments_merge_like_one_pass() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(10_001) * 1e3 + 1e6  # a large mean: naive sum-of-squares would lose digits
    acc = Moments()
    for part in np.array_split(x, 7):
        acc.add(chunk_moments(part))
    assert acc.n == x.size
    assert acc.mean == pytest.approx(x.mean(), rel=1e-14)
    assert math.sqrt(acc.m2 / acc.n) == pytest.approx(x.std(), rel=1e-10)
    empty = chunk_moments(np.array([np.nan, np.inf], np.float32))
    assert (empty.n, empty.nan, empty.inf) == (0, 1, 1)


def test_histograms_count_every_finite_value(planted_ckpt: tuple[Path, dict[str, Any]]) -> None:
    path, tree = planted_ckpt
    got = stats(path, histograms=True)
    for name, s in got.items():
        assert s.histogram is not None
        assert sum(s.histogram) == s.size - s.nan - s.inf, name
    # a clean normal sample peaks in the middle
    h = got["clean"].histogram
    assert h is not None and max(h) == max(h[len(h) // 4: 3 * len(h) // 4])


def test_cli_human_and_json(cli: Any, planted_ckpt: tuple[Path, dict[str, Any]]) -> None:
    path, tree = planted_ckpt
    r = cli("stats", path)
    assert r.status == 0, r.err
    first = r.out.splitlines()[0]
    assert first.startswith("!! 5 of 9 tensors hold NaN or Inf")
    assert "!!   params.float32: 3 NaN, 2 Inf" in r.out
    assert any(line.startswith("    clean ") for line in r.out.splitlines())
    r = cli("stats", "--json", "--quiet", path)
    assert r.status == 0 and r.err == ""
    assert_stats_match(json.loads(r.out), tree)
    r = cli("stats", "--json", "--include", "clean", path)
    assert list(json.loads(r.out)) == ["clean"]


def test_cli_errors(cli: Any, tmp_path: Path, planted_ckpt: tuple[Path, dict[str, Any]]) -> None:
    r = cli("stats", tmp_path / "nothing")
    assert r.status == 1 and "Traceback" not in r.err
    r = cli("stats", "--workers", "0", planted_ckpt[0])
    assert r.status == 2 and "--workers" in r.err
    r = cli("stats", "--step", "3", planted_ckpt[0])  # --step on an item directory
    assert r.status == 2 and "step" in r.err


def test_run_chunks_bounds_what_is_in_flight() -> None:
    import threading
    import time

    from ocdbt_py.inspect.source import run_chunks

    lock = threading.Lock()
    live = [0, 0]  # bytes in flight now, most seen

    def fn(w: int) -> int:
        with lock:
            live[0] += w
            live[1] = max(live[1], live[0])
        time.sleep(0.002)
        with lock:
            live[0] -= w
        return w

    weights = [10, 30, 5, 50, 20, 20, 5, 40] * 5
    got = list(run_chunks(weights, fn, workers=4, weight=lambda w: w, budget=60))
    assert got == weights  # in order
    assert live[1] <= 60 + 50  # the budget, plus at most the one task that exceeds it alone
    assert list(run_chunks([3, 1, 2], lambda w: w * 2, workers=1)) == [6, 2, 4]


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, cli: Any,
                                         planted_ckpt: tuple[Path, dict[str, Any]]) -> None:
    drawn: list[str] = []

    class FakeProgress:
        def __init__(self, label: str, *, enabled: bool) -> None:
            drawn.append(label)

        def __enter__(self) -> FakeProgress:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def update(self, done: int, total: int | None = None, detail: str = "") -> None:
            drawn.append(detail)

    import ocdbt_py.cli.progress as progress

    monkeypatch.setattr(progress, "Progress", FakeProgress)
    monkeypatch.setattr(progress, "want_progress", lambda setting, stream=None: True)
    assert cli("stats", planted_ckpt[0]).status == 0
    assert drawn[0] == "stats" and len(drawn) > 1 and " of " in drawn[-1]  # "12.0 KiB of 12.0 KiB"
    assert drawn[-1].split(" of ")[0] == drawn[-1].split(" of ")[1]
    drawn.clear()
    assert cli("stats", "--quiet", planted_ckpt[0]).status == 0
    assert drawn == []


def test_other_kinds(tmp_path: Path) -> None:
    """bool, uint64, complex (counts only), float64 near its limits; diff of complex values."""
    from ocdbt_py.inspect import diff

    t = {"b": np.array([True, False, True]), "u": np.array([0, 2**64 - 1, 5], np.uint64),
         "c": np.array([1 + 2j, np.nan, 0], np.complex64), "f": np.array([1e308, -1e308, np.inf, 0.0])}
    checkpoint.save(tmp_path / "k", t)
    got = _json(stats(tmp_path / "k"))
    assert got["b"]["mean"] == pytest.approx(2 / 3) and got["b"]["zeros"] == 1
    assert got["u"]["max"] == float(2**64 - 1) and got["u"]["min"] == 0
    assert (got["c"]["nan"], got["c"]["zeros"], got["c"]["min"]) == (1, 1, None)
    assert (got["f"]["inf"], got["f"]["min"], got["f"]["max"], got["f"]["mean"]) == (1, -1e308, 1e308, 0.0)
    t2 = dict(t, c=np.array([1 + 3j, np.nan, 0], np.complex64))
    checkpoint.save(tmp_path / "k2", t2)
    c = diff(tmp_path / "k", tmp_path / "k2").changed["c"]
    assert (c["n_diff"], c["max_abs_diff"]) == (1, 1.0)
