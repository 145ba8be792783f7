"""Decoding many small single-chunk arrays at once: neighbours in a data file share one slab.

A restore of thousands of small arrays spends as much time on per-array Python (one codec
call, one allocation, one release of the GIL and its convoy between the decode threads) as on
zstd itself.  OCDBT data files hold the chunks of consecutively written arrays back to back,
so when a batch of single-chunk arrays is taken in file order, runs of chunks are adjacent in
the buffer they were fetched into.  For each run of adjacent chunks

* one *slab* is allocated for the outputs of up to :data:`SLAB_BYTES` of arrays, and each
  array is a view of its own aligned slot in it (the slab is freed once every array of it
  is);
* when the chunks are zstd frames, the whole run is decoded with **one** call straight into
  the slab (zstd decodes consecutive frames back to back); when they are stored raw, the run is
  one copy.

The single call is only trusted where the result cannot differ from decoding each chunk on its
own: every frame must declare exactly its array's byte size (zstd itself refuses a frame whose
content differs from what its header declares), the run must produce exactly the slots' total
and nothing more, and slots are contiguous (a slot that must be padded to its dtype's
alignment starts a new run).  If any of that fails, the arrays of the slab are decoded one
by one, which reports the damaged chunk precisely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zstandard

from ocdbt_py.errors import CorruptionError
from zarr3._alloc import empty
from zarr3.codecs.zstd import ZstdCodec, zstd_decompress_into

__all__ = ["SLAB_BYTES", "Slot", "run_codec", "plan_slabs", "decode_slab"]

#: Outputs of one slab at most (a restored array keeps at most this much memory alive)
SLAB_BYTES = 1 << 20

#: One array of a slab: ``(batch index, output bytes, alignment of its dtype, buffer, offset in
#: buffer, stored bytes)``, where the stored bytes are ``buffer[offset:offset + len(stored)]``
Slot = tuple[int, int, int, Any, int, Any]


def run_codec(chain: Any) -> str | None:
    """``"zstd"`` or ``"raw"`` for a chain whose stored chunk is the array's native bytes,
    zstd-compressed or as is (runs of those can be decoded at once); else ``None``."""
    if not getattr(chain, "direct", False):
        return None
    bb = chain.bb
    if not bb:
        return "raw"
    if len(bb) == 1 and type(bb[0]) is ZstdCodec:
        return "zstd"
    return None


def plan_slabs(slots: list[Slot]) -> list[list[Slot]]:
    """Group ``slots`` (any order) into slabs: file order, at most :data:`SLAB_BYTES` of
    outputs each (one array larger than that has a slab of its own)."""
    slots = sorted(slots, key=lambda s: (id(s[3]), s[4]))
    slabs: list[list[Slot]] = []
    cur: list[Slot] = []
    acc = 0
    for s in slots:
        nb = s[1]
        start = -(-acc // s[2]) * s[2]
        if cur and start + nb > SLAB_BYTES:
            slabs.append(cur)
            cur, start = [], 0
        cur.append(s)
        acc = start + nb
    if cur:
        slabs.append(cur)
    return slabs


def _runs(slabs: Sequence[Slot], offsets: list[int]) -> list[tuple[int, int]]:
    """``[lo, hi)`` index ranges of ``slabs`` whose chunks are adjacent in one buffer and whose
    slots are adjacent in the slab."""
    out: list[tuple[int, int]] = []
    lo = 0
    for k in range(1, len(slabs) + 1):
        if k < len(slabs):
            _, nb0, _, buf0, off0, raw0 = slabs[k - 1]
            _, _, _, buf1, off1, _ = slabs[k]
            if buf1 is buf0 and off1 == off0 + len(raw0) and offsets[k] == offsets[k - 1] + nb0:
                continue
        out.append((lo, k))
        lo = k
    return out


def decode_slab(slab: list[Slot], codec: str, make: Callable[[int, np.ndarray], np.ndarray],
                one_by_one: Callable[[int, np.ndarray], None]) -> None:
    """Allocate ``slab``'s memory, hand each array its view (``make(i, bytes_view)`` returns
    the array placed in the output), and fill them: a run of adjacent chunks at once where
    that is exact, else ``one_by_one(i, array)``."""
    offsets = []
    total = 0
    for s in slab:
        start = -(-total // s[2]) * s[2]
        offsets.append(start)
        total = start + s[1]
    mem = empty((total,), np.uint8, f"restoring {len(slab)} arrays")
    arrays = [make(s[0], mem[o:o + s[1]]) for s, o in zip(slab, offsets)]
    for lo, hi in _runs(slab, offsets):
        if hi - lo > 1 and _decode_run(slab[lo:hi], codec, mem[offsets[lo]:offsets[hi - 1] + slab[hi - 1][1]]):
            continue
        for k in range(lo, hi):
            one_by_one(slab[k][0], arrays[k])


def _decode_run(run: Sequence[Slot], codec: str, target: np.ndarray) -> bool:
    """Decode the adjacent chunks of ``run`` into ``target`` with one call; ``False`` (nothing
    trusted) when any frame does not declare exactly its slot's size or the run fails."""
    buf = run[0][3]
    start = run[0][4]
    stop = run[-1][4] + len(run[-1][5])
    if codec == "raw":
        if any(len(s[5]) != s[1] for s in run):
            return False
        target[:] = np.frombuffer(buf, np.uint8, stop - start, start)
        return True
    fcs = zstandard.frame_content_size
    try:
        for s in run:
            if fcs(s[5]) != s[1]:
                return False
        zstd_decompress_into(buf[start:stop], memoryview(target))  # type: ignore[arg-type]
    except (zstandard.ZstdError, CorruptionError):
        return False
    return True
