"""ocdbt-py: a pure-Python reader and writer for TensorStore's OCDBT format.

>>> import ocdbt_py
>>> db = ocdbt_py.open("/path/to/checkpoint")          # doctest: +SKIP
>>> for key in db.list(prefix=b"params."):             # doctest: +SKIP
...     print(key, len(db.get(key)))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ocdbt_py.errors import (
    ConditionFailedError,
    CorruptionError,
    InvalidKeyError,
    NotFoundError,
    OcdbtError,
    ReadOnlyError,
    StorageError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from ocdbt_py.store import OcdbtStore, open

__version__ = "0.1.0"

__all__ = [
    "open",
    "OcdbtStore",
    "OcdbtError",
    "CorruptionError",
    "NotFoundError",
    "UnsupportedError",
    "ReadOnlyError",
    "InvalidKeyError",
    "ConditionFailedError",
    "StorageError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Lazy: keeps `import ocdbt_py` cheap (no numpy/zstandard until a store is opened).
    if name in ("open", "OcdbtStore"):
        from ocdbt_py import store

        return getattr(store, name)
    raise AttributeError(f"module 'ocdbt_py' has no attribute {name!r}")
