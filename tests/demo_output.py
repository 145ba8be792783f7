"""What ``make demo`` leaves behind, for tests that run the README's tours against it.

The demo runs once per test session in a child process (as ``make demo`` runs it: no JAX or
TensorStore in its process; the Orbax cross-check skipped to save time, ``tests/test_demo.py``
runs it) and each caller gets its own copy, since tour lines write (``put``, ``rm``, ``gc``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CACHE: dict[str, Path] = {}

#: The directory name the demo uses by default, as the README's tours write it.
DEMO_DIR = "demo-output"


def demo_output(cwd: Path) -> Path:
    """Put a fresh copy of the demo's output in ``cwd/demo-output`` and return that path."""
    if "done" not in _CACHE:
        base = Path(tempfile.mkdtemp(prefix="ocdbt-demo-"))
        p = subprocess.run([sys.executable, "-m", "ocdbt_py.demo", "--skip-orbax"], cwd=base,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        _CACHE["done"] = base / DEMO_DIR
    dest = cwd / DEMO_DIR
    shutil.copytree(_CACHE["done"], dest)
    return dest
