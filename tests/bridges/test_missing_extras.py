"""A feature whose optional package is missing says which extra installs it, in one line:
``MissingDependencyError`` (a ``ModuleNotFoundError`` and an ``OcdbtError``) naming
``pip install 'ocdbt-py[EXTRA]'``, for every optional dependency the library imports."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import zarr3
from ocdbt_py import bridges, checkpoint
from ocdbt_py.errors import MissingDependencyError, OcdbtError

ROOT = Path(__file__).resolve().parents[2]


def _extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.M))


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import m`` fail as if ``m`` were not installed."""
    for name in list(sys.modules):
        if any(name == m or name.startswith(m + ".") for m in modules):
            monkeypatch.delitem(sys.modules, name)
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)


def _check(e: MissingDependencyError, extra: str) -> None:
    assert isinstance(e, ModuleNotFoundError) and isinstance(e, OcdbtError)
    assert f"pip install 'ocdbt-py[{extra}]'" in str(e) and "\n" not in str(e), str(e)
    assert e.extra == extra and extra in _extras(), f"no extra {extra!r} in pyproject.toml"


def test_to_dask_without_dask(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checkpoint.save(tmp_path / "ck", {"w": np.ones(4, np.float32)})
    _hide(monkeypatch, "dask")
    with pytest.raises(MissingDependencyError) as info:
        bridges.to_dask(tmp_path / "ck")
    _check(info.value, "dask")
    a = zarr3.create(tmp_path / "a", shape=(4,), chunks=(2,), dtype="float32")
    with pytest.raises(MissingDependencyError) as info:
        a.to_dask()
    _check(info.value, "dask")


def test_to_torch_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "torch")
    with pytest.raises(MissingDependencyError) as info:
        bridges.to_torch({"w": np.ones(2)})
    _check(info.value, "torch")


def test_yaml_map_without_pyyaml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ocdbt_py.bridges.namemap import load_name_map

    f = tmp_path / "m.yaml"
    f.write_text("- [a, b]\n")
    _hide(monkeypatch, "yaml")
    with pytest.raises(ValueError, match=re.escape("pip install 'ocdbt-py[yaml]'")):
        load_name_map(str(f))


def test_multitier_without_jax(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ocdbt_py.checkpoint.manager import MultiTierCheckpointManager

    _hide(monkeypatch, "jax")
    with pytest.raises(MissingDependencyError) as info:
        MultiTierCheckpointManager(tmp_path / "local", tmp_path / "persistent", global_mesh=None)
    _check(info.value, "jax")


@pytest.mark.parametrize("scheme,module,extra", [("s3", "s3fs", "s3"), ("gs", "gcsfs", "gcs"),
                                                 ("az", "adlfs", "azure")])
def test_object_store_without_its_backend(monkeypatch: pytest.MonkeyPatch, scheme: str, module: str,
                                          extra: str) -> None:
    from ocdbt_py.errors import StorageError
    from ocdbt_py.kvstore import open_kvstore

    _hide(monkeypatch, module)
    opts = {"anon": True} if scheme != "az" else {"account_name": "a"}
    with pytest.raises(StorageError, match=re.escape(f"pip install 'ocdbt-py[{extra}]'")):
        open_kvstore(f"{scheme}://bucket/x", {**opts, "backend": "fsspec"})


@pytest.mark.parametrize("codec,module,extra", [("blosc", "blosc", "blosc"), ("lz4", "lz4", "lz4")])
def test_codec_without_its_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, codec: str, module: str,
                                   extra: str) -> None:
    import json

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [1024], "chunks": [1024], "dtype": "<f4", "order": "C", "fill_value": 0,
        "filters": None, "compressor": {"id": codec, **({"cname": "lz4", "clevel": 5, "shuffle": 1}
                                                          if codec == "blosc" else {"acceleration": 1})}}))
    raw = np.zeros(1024, dtype="<f4").tobytes()  # compressible: a real compressed frame, not a stored copy
    if codec == "blosc":  # a real chunk, encoded while the package is still there
        import blosc

        chunk = blosc.compress(raw, typesize=4)
    else:
        import lz4.block

        chunk = lz4.block.compress(raw)
    (tmp_path / "a" / "0").write_bytes(chunk)
    _hide(monkeypatch, module)
    if codec == "blosc":
        import zarr3.codecs.blosc as blosc_codec

        monkeypatch.setattr(blosc_codec, "_blosc_mod", None)  # loaded by an earlier test
    with pytest.raises(ImportError, match=re.escape(f"pip install 'ocdbt-py[{extra}]'")):
        zarr3.open(tmp_path / "a")[...]
    assert extra in _extras()


def test_a_broken_install_is_not_reported_as_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the package itself missing means "install the extra"; an installed package whose own
    dependency is missing is reported as it is."""
    (tmp_path / "half_installed_pkg.py").write_text("import dependency_nobody_has  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        MissingDependencyError.require("half_installed_pkg", "x", "a test")
    assert not isinstance(info.value, MissingDependencyError) and info.value.name == "dependency_nobody_has"
    with pytest.raises(MissingDependencyError):
        MissingDependencyError.require("no_such_pkg_anywhere", "x", "a test")
