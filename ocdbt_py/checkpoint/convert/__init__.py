"""Converting checkpoints between layouts, codecs, chunkings and stores (``ocdbt cp``).

:func:`copy` (also ``ocdbt_py.checkpoint.copy``) reads any Orbax checkpoint and writes it in
any layout Orbax writes.  Modules: :mod:`.encoding` (source encodings, destination specs,
how each chunk moves), :mod:`.arrays` (chunk tasks and verification), :mod:`.item` (one
PyTree item), :mod:`.journal` (resume records), :mod:`.api` (``copy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ocdbt_py.checkpoint.convert.api import copy

__all__ = ["copy"]


def __getattr__(name: str) -> Any:
    if name == "copy":
        from ocdbt_py.checkpoint.convert.api import copy

        return copy
    raise AttributeError(f"module 'ocdbt_py.checkpoint.convert' has no attribute {name!r}")
