"""``ocp.path``: step naming (:mod:`.step`) and save atomicity (:mod:`.atomicity`)."""

from __future__ import annotations

from ocdbt_py.orbax.path import atomicity, step

__all__ = ["atomicity", "step"]
