"""fsspec's own abstract filesystem tests (``fsspec.tests.abstract``) against ``ocdbt://``."""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import pytest
from fsspec.tests import abstract

from ocdbt_py.bridges.fsspec_ocdbt import OcdbtFileSystem


class OcdbtFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    """A writable filesystem over a fresh database per test; keys below ``root/``."""

    @pytest.fixture
    def fs(self, tmp_path: Path) -> Any:
        return OcdbtFileSystem(str(tmp_path / "db"), mode="a")

    @pytest.fixture
    def fs_path(self) -> str:
        return "root"

    @pytest.fixture
    def fs_join(self) -> Any:
        return posixpath.join

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False


class TestOcdbtCopy(abstract.AbstractCopyTests, OcdbtFixtures):  # type: ignore[misc]
    pass


class TestOcdbtGet(abstract.AbstractGetTests, OcdbtFixtures):  # type: ignore[misc]
    pass


class TestOcdbtPut(abstract.AbstractPutTests, OcdbtFixtures):  # type: ignore[misc]
    pass


class TestOcdbtOpen(abstract.AbstractOpenTests, OcdbtFixtures):  # type: ignore[misc]
    pass


class TestOcdbtPipe(abstract.AbstractPipeTests, OcdbtFixtures):  # type: ignore[misc]
    pass
