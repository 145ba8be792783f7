"""Shared fixtures of the security tests: a directory outside the store root holding a secret
that no read may return and no write may touch."""

from __future__ import annotations

from pathlib import Path

import pytest

SECRET = b"TOP-SECRET-TOKEN-0123456789"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """``<tmp>/outside/victim`` holding :data:`SECRET`, next to (not below) the test's roots."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "victim").write_bytes(SECRET)
    return d
