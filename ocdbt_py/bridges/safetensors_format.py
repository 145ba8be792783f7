"""The safetensors file format, read and written here with explicit limits.

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
end of the header), plus an optional ``"__metadata__"`` object of strings, then the raw
little-endian C-order tensor bytes.  Hugging Face's sharded layout adds
``model.safetensors.index.json``: ``{"metadata": {"total_size": n}, "weight_map": {name: file}}``.

Nothing here trusts the file: the header length is capped (:data:`MAX_HEADER_BYTES`, as the
``safetensors`` library does), the JSON is checked entry by entry, every tensor's byte span
must match its shape and dtype, lie inside the file and overlap no other.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.dtypes import dtype_from_name
from ocdbt_py.checkpoint.export import SAFETENSORS_DTYPES
from ocdbt_py.errors import CorruptionError, UnsupportedError

__all__ = [
    "SAFETENSORS_DTYPES",
    "MAX_HEADER_BYTES",
    "MAX_INDEX_BYTES",
    "TensorInfo",
    "Header",
    "parse_header",
    "build_header",
    "parse_index",
    "numpy_dtype",
]

#: Largest header accepted (the ``safetensors`` library's own limit).
MAX_HEADER_BYTES = 100_000_000
#: Largest ``*.index.json`` accepted.
MAX_INDEX_BYTES = 64 << 20
#: Most dimensions a tensor may have.
MAX_RANK = 64

_CODES = {code: name for name, code in SAFETENSORS_DTYPES.items()}


def numpy_dtype(code: str) -> np.dtype:
    """The NumPy (or ml_dtypes) dtype of a safetensors dtype code (little-endian)."""
    name = _CODES.get(code)
    if name is None:
        raise UnsupportedError(f"safetensors dtype {code!r} has no NumPy equivalent here "
                               f"(known: {', '.join(sorted(_CODES))})")
    dt = dtype_from_name(name)
    return dt.newbyteorder("<") if dt.byteorder == ">" else dt


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a safetensors file: byte span relative to the start of the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class Header:
    """A parsed header: tensors in file order, the ``__metadata__`` strings, the data start."""

    tensors: list[TensorInfo]
    metadata: dict[str, str]
    data_start: int


def _int(x: Any, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise CorruptionError(f"{what} must be a non-negative integer, not {x!r}")
    return x


def _entry(name: str, e: Any, data_start: int, where: str) -> TensorInfo:
    if not isinstance(e, dict):
        raise CorruptionError(f"{where}: entry {name!r} is not an object")
    code = e.get("dtype")
    if not isinstance(code, str):
        raise CorruptionError(f"{where}: tensor {name!r} has no dtype")
    dt = numpy_dtype(code)
    shape = e.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise CorruptionError(f"{where}: tensor {name!r} has no valid shape (a list of at most {MAX_RANK} ints)")
    dims = tuple(_int(d, f"{where}: a dimension of {name!r}") for d in shape)
    offs = e.get("data_offsets")
    if not isinstance(offs, list) or len(offs) != 2:
        raise CorruptionError(f"{where}: tensor {name!r} has no data_offsets [begin, end]")
    begin, end = (_int(o, f"{where}: data_offsets of {name!r}") for o in offs)
    if end < begin or end - begin != math.prod(dims) * dt.itemsize:
        raise CorruptionError(f"{where}: tensor {name!r} spans bytes [{begin}, {end}), but shape {list(dims)} "
                              f"of {code} needs {math.prod(dims) * dt.itemsize}")
    return TensorInfo(name, dt, dims, data_start + begin, data_start + end)


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, refusing a name given twice (``json`` keeps the last silently,
    so two readers could disagree on which tensor a name means)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def parse_header(head: bytes, file_size: int, where: str) -> Header | int:
    """Parse a header from the first bytes of a file of ``file_size`` bytes.

    Returns the number of leading bytes needed when ``head`` is too short, else the
    :class:`Header`.  Raises :class:`CorruptionError` for anything malformed.
    """
    if len(head) < 8:
        if file_size < 8:
            raise CorruptionError(f"{where} is {file_size} bytes, too short for a safetensors file")
        return 8
    n = int.from_bytes(head[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise CorruptionError(f"{where}: header of {n} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size:
        raise CorruptionError(f"{where}: header of {n} bytes runs past the end of the {file_size}-byte file")
    if len(head) < 8 + n:
        return 8 + n
    try:
        doc = json.loads(head[8:8 + n].decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise CorruptionError(f"{where}: header names {e.args[0]!r} twice (which one is meant?)") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptionError(f"{where}: header is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise CorruptionError(f"{where}: header is not a JSON object")
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise CorruptionError(f"{where}: __metadata__ must map strings to strings")
    data_start = 8 + n
    tensors = sorted((_entry(k, v, data_start, where) for k, v in doc.items()), key=lambda t: (t.start, t.stop))
    pos = data_start
    for t in tensors:
        if t.start < pos:
            raise CorruptionError(f"{where}: tensor {t.name!r} overlaps the tensor before it")
        pos = max(pos, t.stop)
    if pos > file_size:
        raise CorruptionError(f"{where}: tensor data runs past the end of the {file_size}-byte file")
    return Header(tensors, dict(meta), data_start)


def build_header(tensors: list[tuple[str, np.dtype, tuple[int, ...]]], metadata: Mapping[str, str] | None) -> bytes:
    """The 8-byte length and JSON header (padded to 8 bytes) for tensors in this order."""
    header: dict[str, Any] = {}
    offset = 0
    for name, dt, shape in tensors:
        code = SAFETENSORS_DTYPES.get(dt.name)
        if code is None:
            raise UnsupportedError(
                f"tensor {name!r} has dtype {dt.name}, which safetensors cannot hold; leave it out "
                f"(rename= returning None, or 'ocdbt export --exclude'), or export to .npz"
            )
        nbytes = math.prod(shape) * dt.itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def _plain_file_name(name: Any, where: str) -> str:
    if (not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..")
            or name.startswith(".") or "\x00" in name):
        raise CorruptionError(f"{where}: shard file name {name!r} is not a plain file name in the same directory")
    return name


def parse_index(raw: bytes, where: str) -> dict[str, str]:
    """``weight_map`` (tensor name -> shard file name) of a ``*.safetensors.index.json``."""
    if len(raw) > MAX_INDEX_BYTES:
        raise CorruptionError(f"{where} is larger than the {MAX_INDEX_BYTES}-byte limit")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptionError(f"{where} is not valid JSON: {e}") from e
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict):
        raise CorruptionError(f"{where} has no weight_map object")
    return {str(k): _plain_file_name(v, where) for k, v in wm.items()}


