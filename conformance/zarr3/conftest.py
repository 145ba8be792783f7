"""Test setup for zarr3: import the package from this checkout.

The editable install can register ``zarr3`` as a namespace package (when it was installed
before ``zarr3/__init__.py`` existed); putting the repository root first on ``sys.path``
makes ``import zarr3`` load the real package either way.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
_mod = sys.modules.get("zarr3")
if _mod is not None and getattr(_mod, "__file__", None) is None:
    for _name in [n for n in sys.modules if n == "zarr3" or n.startswith("zarr3.")]:
        del sys.modules[_name]
