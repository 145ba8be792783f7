"""Shared helpers for the writer tests: TensorStore oracles and whole-database checks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ocdbt_py
from ocdbt_py.maintenance.verify import verify
from ocdbt_py.timeutil import format_nanoseconds

Model = dict[bytes, bytes]


def ts_module() -> Any:
    """Import tensorstore or skip the calling test."""
    import pytest

    return pytest.importorskip("tensorstore")


def ts_kv(path: str | os.PathLike[str], version: int | str | None = None) -> Any:
    """A TensorStore OCDBT kvstore on a local directory (at ``version`` if given)."""
    ts = ts_module()
    spec: dict[str, Any] = {"driver": "ocdbt", "base": f"file://{os.fspath(path)}/"}
    if version is not None:
        spec["version"] = version
    return ts.KvStore.open(spec).result()


def ts_snapshot(path: str | os.PathLike[str], version: int | str | None = None) -> Model:
    """Every key and value as TensorStore reads them."""
    kv = ts_kv(path, version)
    keys = kv.list().result()
    futures = [kv.read(k) for k in keys]
    out = {}
    for k, f in zip(keys, futures):
        r = f.result()
        assert r.state == "value", (k, r.state)
        out[bytes(k)] = bytes(r.value)
    return out


def our_snapshot(path: str | os.PathLike[str], version: int | str | None = None) -> Model:
    """Every key and value as ocdbt_py reads them."""
    db = ocdbt_py.open(path, version=version)
    return dict(db.items())


def ts_generations(path: str | os.PathLike[str]) -> list[int]:
    """Generation numbers TensorStore's manifest dump shows as inline (the newest ones)."""
    ts = ts_module()
    base = ts.KvStore.open(f"file://{os.fspath(path)}/").result()
    dump = ts.ocdbt.dump(base).result()
    return [v["generation_number"] for v in dump["versions"]]


def assert_verified(path: str | os.PathLike[str]) -> None:
    """``ocdbt verify`` finds nothing wrong."""
    report = verify(os.fspath(path))
    assert report.ok, report.format()


def check_versions(
    path: str | os.PathLike[str], models: Mapping[int, Model], *, tensorstore: bool = True,
    time_travel: bool = True, exact: bool = True,
) -> None:
    """Every generation in ``models`` reads back as its model, with ocdbt_py and TensorStore.

    With ``exact``, also checks that the database has exactly the generations in ``models``
    (plus, possibly, the empty generation 1).  Checks that time travel by commit time finds each generation, and that
    ``verify`` passes.
    """
    db = ocdbt_py.open(path)
    infos = db.versions()
    gens = [v.generation for v in infos]
    expected = sorted(models)
    assert [g for g in gens if g in models] == expected, (gens, expected)
    for v in infos if exact else ():
        if v.generation not in models:
            assert v.generation == 1 and v.num_keys == 0, v
    times = {v.generation: v.commit_time_ns for v in infos}
    for g in expected:
        want = models[g]
        assert our_snapshot(path, g) == want, f"ocdbt_py, generation {g}"
        if tensorstore:
            assert ts_snapshot(path, g) == want, f"tensorstore, generation {g}"
            if time_travel:
                t = format_nanoseconds(times[g])
                assert sorted(ts_kv(path, t).list().result()) == sorted(want), f"time {t}"
        if time_travel:
            assert set(ocdbt_py.open(path, version=format_nanoseconds(times[g])).list()) == set(want)
    if tensorstore:
        assert ts_snapshot(path) == models[expected[-1]]
    assert_verified(path)


def data_files(path: str | os.PathLike[str], prefix: str = "d") -> list[Path]:
    """The data files below ``path/prefix``."""
    root = Path(path) / prefix
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []
