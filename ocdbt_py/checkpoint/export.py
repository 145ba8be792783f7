"""Streaming a checkpoint's tensors out, one slab at a time: the plan, the slabs, ``.npz``.

``.safetensors`` (one file or Hugging Face's sharded layout) is written by
:mod:`ocdbt_py.bridges.safetensors_export` on top of this module.

The safetensors header is built from metadata alone (shapes and dtypes, no data), then each
tensor is read in slabs along its first axis (whole chunk rows, at most :data:`SLAB_BYTES`)
and appended, so peak memory is about one slab, not the model.  The format is tiny and
written here directly: an 8-byte little-endian header length, a JSON header mapping each name
to ``{"dtype", "shape", "data_offsets"}`` (plus optional ``"__metadata__"`` of strings), then
the raw little-endian C-order bytes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zipfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from ocdbt_py.checkpoint.dtypes import ML_DTYPE_NAMES, dtype_from_name
from ocdbt_py.checkpoint.layout import Kind
from ocdbt_py.checkpoint.meta import LeafMetadata, item_metadata
from ocdbt_py.checkpoint.restore.api import PathLike, resolve
from ocdbt_py.checkpoint.restore.item import ARRAY, INLINE, SCALAR, STRING, Leaf, PyTreeItem
from ocdbt_py.errors import NotFoundError, StorageError, UnsupportedError
from ocdbt_py.kvstore.prefixed import PrefixStore

__all__ = ["export_npz", "plan", "SAFETENSORS_DTYPES", "ExportedTensor"]

#: Bytes read and written per step for one tensor.
SLAB_BYTES = 32 << 20

#: NumPy/ml_dtypes dtype name -> safetensors dtype code.
SAFETENSORS_DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e8m0fnu": "F8_E8M0",
    "complex64": "C64",
}

Rename = Callable[[str], "str | None"] | Mapping[str, "str | None"]


@dataclasses.dataclass
class ExportedTensor:
    """One tensor planned for export."""

    name: str
    param: str
    item: PyTreeItem
    leaf: Leaf
    shape: tuple[int, ...]
    stored_dtype: np.dtype
    dtype: np.dtype
    chunks: tuple[int, ...] | None
    #: the dotted name in the checkpoint (before any rename)
    source: str = ""

    @property
    def nbytes(self) -> int:
        """Output size in bytes."""
        return math.prod(self.shape) * self.dtype.itemsize


def _resolve_dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    if isinstance(dtype, str):
        return dtype_from_name(dtype)
    return np.dtype(dtype)


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or (dt.name in ML_DTYPE_NAMES and dt.name.startswith(("bfloat", "float")))


def _apply_rename(rename: Rename | None, name: str) -> str | None:
    if rename is None:
        return name
    if callable(rename):
        return rename(name)
    return rename.get(name, name)


def _items(path: PathLike, item: str | None, step: int | None,
           storage_options: dict[str, Any] | None) -> Iterator[tuple[str, PyTreeItem]]:
    r = resolve(path, step=step, storage_options=storage_options)
    if r.kind == Kind.PYTREE:
        if item is not None:
            raise ValueError(f"item={item!r} applies to a step directory")
        yield "", PyTreeItem(r.kv, listing=r.listing)
        return
    if r.kind != Kind.STEP:
        raise UnsupportedError(f"{r.kv.url} holds no arrays to export (a {r.kind.value} item)")
    items = r.items()
    names = [item] if item is not None else [n for n, k in items.items() if k == Kind.PYTREE]
    single = r.single_item(items)
    for n in names:
        if n not in items or items[n] != Kind.PYTREE:
            raise NotFoundError(f"{r.kv.url} has no PyTree item {n!r}")
        prefix = "" if (item is not None or n == single) else n
        yield prefix, PyTreeItem(PrefixStore(r.kv, n))


def plan(path: PathLike, *, dtype: Any = None, rename: Rename | None = None, item: str | None = None,
         step: int | None = None, storage_options: dict[str, Any] | None = None,
         strings: dict[str, str] | None = None) -> list[ExportedTensor]:
    """The tensors an export would write, from metadata only (no data read)."""
    cast = _resolve_dtype(dtype)
    out: list[ExportedTensor] = []
    seen: dict[str, str] = {}
    for prefix, it in _items(path, item, step, storage_options):
        md_tree = item_metadata(it, stored_sizes=False)
        flat: dict[str, Any] = {}
        _flatten_md(md_tree, flat)
        for leaf in it.leaves:
            full = f"{prefix}.{leaf.param_name}" if prefix else leaf.param_name
            if leaf.kind == STRING:
                if strings is not None:
                    new = _apply_rename(rename, full)
                    if new is not None:
                        strings[new] = it.string_value(leaf)
                continue
            if leaf.kind not in (ARRAY, SCALAR, INLINE):
                continue
            name = _apply_rename(rename, full)
            if name is None:
                continue
            if name in seen:
                raise ValueError(f"two tensors would be named {name!r} ({seen[name]!r} and {full!r})")
            seen[name] = full
            if leaf.kind == INLINE:
                arr = np.asarray(leaf.value)
                if arr.dtype.kind not in "biufc" and arr.dtype.name not in SAFETENSORS_DTYPES:
                    continue
                shape, sdt, chunks = arr.shape, arr.dtype, None
            else:
                md = flat[leaf.param_name]
                shape, sdt, chunks = tuple(md.shape), md.dtype, md.chunks
            target = cast if cast is not None and _is_float(sdt) else sdt
            out.append(ExportedTensor(name, it.data_param(leaf), it, leaf, shape, sdt, target, chunks, full))
    return out


def _flatten_md(tree: Any, out: dict[str, Any]) -> None:

    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, LeafMetadata):
            out[x.name] = x
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def ticker(progress: Callable[[int, int], None] | None, total: int) -> Callable[[int], None]:
    """``add(nbytes)``: counts bytes written and reports ``progress(done, total)`` (a no-op without one)."""
    if progress is None:
        return lambda n: None
    done = [0]

    def add(n: int) -> None:
        done[0] += n
        progress(done[0], total)

    return add


def _slabs(t: ExportedTensor) -> Iterator[np.ndarray]:
    """The tensor's data in row slabs along axis 0, each a C-contiguous array of ``t.dtype``."""
    if t.leaf.kind == INLINE:
        yield np.ascontiguousarray(np.asarray(t.leaf.value).reshape(t.shape).astype(t.dtype, copy=False))
        return
    reader = t.item.reader
    if not t.shape or t.nbytes <= SLAB_BYTES or t.shape[0] <= 1:
        a = reader.read_rows([(t.param, None, None)])[0][1]
        yield a.astype(t.dtype, copy=False) if a.dtype != t.dtype else a
        return
    row_bytes = max(1, math.prod(t.shape[1:]) * max(t.stored_dtype.itemsize, t.dtype.itemsize))
    step = max(1, SLAB_BYTES // row_bytes)
    c0 = reader.metadata(t.param).chunk_shape[0] or 1  # grid (shard) rows: the unit of storage
    if step >= c0:
        step -= step % c0
    else:
        step = c0  # never split a chunk row across two reads
    for start in range(0, t.shape[0], step):
        a = reader.read_rows([(t.param, start, min(start + step, t.shape[0]))])[0][1]
        yield a.astype(t.dtype, copy=False) if a.dtype != t.dtype else a


def _le_bytes(a: np.ndarray) -> np.ndarray:
    """The array's little-endian C-order bytes as a flat uint8 array (no copy when possible)."""
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


class _AtomicFile:
    """A file written under a temporary name and renamed into place on success."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self.tmp = f"{self.path}.tmp-{os.getpid()}"
        self.f: BinaryIO = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish()

    def finish(self, ok: bool) -> None:
        self.f.close()
        if ok:
            os.replace(self.tmp, self.path)
        else:
            try:
                os.remove(self.tmp)
            except OSError:
                pass


def _write_to(out: str | os.PathLike[str] | BinaryIO, body: Callable[[BinaryIO], None], nbytes: int | None = None
              ) -> None:
    """Run ``body(file)``; a path is written atomically (no half-written file on errors).

    ``nbytes``: the size of what will be written; a path whose filesystem has less room is
    refused (:class:`StorageError`) before anything is written, so a checkpoint declaring
    terabytes it does not store (absent chunks read as the fill value) ends at once."""
    if not isinstance(out, (str, os.PathLike)):
        body(out)
        return
    if nbytes is not None:
        where = os.path.dirname(os.path.abspath(os.fspath(out)))
        try:
            st = os.statvfs(where)
        except (OSError, AttributeError):  # no statvfs (Windows) or no such directory: let the write say
            st = None
        if st is not None and nbytes > st.f_bavail * st.f_frsize:
            raise StorageError(f"writing {os.fspath(out)} needs {nbytes:,} bytes but {where} has "
                               f"{st.f_bavail * st.f_frsize:,} free; nothing was written")
    af = _AtomicFile(out)
    ok = False
    try:
        body(af.f)
        ok = True
    finally:
        af.finish(ok)


def _npz_widen(dt: np.dtype) -> np.dtype | None:
    """ml_dtypes types are widened (losslessly) for .npz, which NumPy could not load otherwise:
    bfloat16/float8/float6/float4 to float32, int4/int2 to int8, uint4/uint2 to uint8."""
    if dt.name not in ML_DTYPE_NAMES:
        return None
    if dt.name.startswith("uint"):
        return np.dtype(np.uint8)
    if dt.name.startswith("int"):
        return np.dtype(np.int8)
    return np.dtype(np.float32)


def export_npz(
    ckpt: PathLike,
    out: str | os.PathLike[str] | BinaryIO,
    *,
    dtype: Any = None,
    rename: Rename | None = None,
    item: str | None = None,
    step: int | None = None,
    storage_options: dict[str, Any] | None = None,
    compress: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Write every array into a ``.npz`` archive (``np.load`` reads it), streaming.

    Names and options are as for :func:`export_safetensors`.  NumPy's ``.npy`` format cannot
    name ml_dtypes types, so bfloat16 and float8 tensors are widened to float32 and int4 to
    int8 (losslessly) unless ``dtype`` says otherwise.  ``progress(done_bytes, total_bytes)`` is
    called as slabs are written.
    """
    tensors = plan(ckpt, dtype=dtype, rename=rename, item=item, step=step, storage_options=storage_options)
    for t in tensors:
        wide = _npz_widen(t.dtype)
        if wide is not None:
            t.dtype = wide
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    tick = ticker(progress, sum(t.nbytes for t in tensors))

    def body(f: BinaryIO) -> None:
        with zipfile.ZipFile(f, "w", compression=mode, allowZip64=True) as zf:
            for t in tensors:
                with zf.open(t.name + ".npy", "w", force_zip64=True) as member:
                    hdr = {"descr": np.lib.format.dtype_to_descr(t.dtype), "fortran_order": False,
                           "shape": t.shape}
                    np.lib.format.write_array_header_2_0(member, hdr)
                    for slab in _slabs(t):
                        member.write(_le_bytes(slab).data)
                        tick(slab.nbytes)

    # stored (uncompressed) members: at least the tensors' bytes; compressed: unknown
    _write_to(out, body, None if compress else sum(t.nbytes for t in tensors))
    return [t.name for t in tensors]
