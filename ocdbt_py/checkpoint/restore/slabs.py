"""Decoding many small single-chunk arrays at once: neighbours in a data file share one slab.

A restore of thousands of small arrays spends as much time on per-array Python (one codec
call, one allocation, one release of the GIL and its convoy between the decode threads) as on
zstd itself.  OCDBT data files hold the chunks of consecutively written arrays back to back,
so when a batch of single-chunk arrays is taken in file order, runs of chunks are adjacent in
the buffer they were fetched into.  The batch is planned with NumPy (no Python per array) into

* *slabs*: one allocation for the outputs of up to :data:`SLAB_BYTES` of arrays, each array a
  view of its own slot (aligned for its dtype); a slab is freed once every array of it is;
* *runs*: chunks adjacent both in their buffer and in the slab.  A run of zstd frames is
  decoded with **one** call straight into the slab (zstd decodes consecutive frames back to
  back); a run of raw chunks is one copy.

The single call is only trusted where the result cannot differ from decoding each chunk on its
own: every frame must declare exactly its array's byte size (zstd itself refuses a frame whose
content differs from what its header declares), and the run must produce exactly the slots'
total and nothing more.  If any of that fails, the arrays of the run are decoded one by one,
which reports the damaged chunk precisely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import zstandard

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.zstd import ZstdCodec, zstd_decompress_into
from zarr3.engine.alloc import empty

__all__ = ["SLAB_BYTES", "ZSTD", "RAW", "Slab", "run_codec", "plan_slabs", "fill_slab"]

#: Outputs of one slab at most (besides alignment padding; one larger array: a slab alone).
#: Measured against 1, 4 and 8 MiB (fresh processes, alternating): 2 MiB restores 4000 x 64 KiB
#: 6% and 2000 x 16 KiB 4% faster than 1 MiB, as fast as 4 or 8 MiB; a kept array holds its slab.
SLAB_BYTES = 2 << 20
#: Run codecs (see :func:`run_codec`); ``0``: the array is decoded on its own
ZSTD, RAW = 1, 2


class Slab(NamedTuple):
    """One allocation and the arrays placed in it."""

    codec: int
    #: batch indices of its arrays, in slot (= file) order
    idx: list[int]
    #: each array's offset in the slab
    offsets: list[int]
    #: bytes to allocate
    total: int
    #: ``(lo, hi, buffer, start, stop)``: arrays ``idx[lo:hi]`` are stored back to back in
    #: ``buffer`` (a number given by the caller) at ``[start, stop)`` and placed back to back
    runs: list[tuple[int, int, int, int, int]]


def run_codec(chain: Any) -> int:
    """:data:`ZSTD` or :data:`RAW` for a chain whose stored chunk is the array's native bytes,
    zstd-compressed or as is (runs of those can be decoded at once); else ``0``."""
    if not getattr(chain, "direct", False):
        return 0
    bb = chain.bb
    if not bb:
        return RAW
    if len(bb) == 1 and type(bb[0]) is ZstdCodec:
        return ZSTD
    return 0


def plan_slabs(idx: np.ndarray, codec: np.ndarray, nbytes: np.ndarray, align: np.ndarray,
               buf: np.ndarray, rel: np.ndarray, stored: np.ndarray) -> list[Slab]:
    """Slabs for the arrays ``idx`` (batch indices), given per array its run ``codec`` (not
    ``0``), output bytes, dtype alignment, the ``buf`` number and offset ``rel`` its stored
    bytes were fetched to, and their length ``stored``."""
    if not len(idx):
        return []
    order = np.lexsort((rel, buf, codec))
    idx, codec, nb, al, buf, rel, stored = (a[order] for a in (idx, codec, nbytes, align, buf, rel, stored))
    ends = np.cumsum(nb)
    starts = ends - nb
    # a slab ends where its codec does or where it would pass SLAB_BYTES (one array at least)
    cuts = [0]
    codec_cut = set((np.flatnonzero(codec[1:] != codec[:-1]) + 1).tolist())
    n = len(idx)
    while cuts[-1] < n:
        s = cuts[-1]
        e = max(s + 1, int(np.searchsorted(ends, starts[s] + SLAB_BYTES, "right")))
        nxt = [c for c in codec_cut if s < c < e]
        cuts.append(min(nxt) if nxt else min(e, n))
    # back to back in the buffer (and, unpadded, in the slab)
    adjacent = np.zeros(n, bool)
    adjacent[1:] = (buf[1:] == buf[:-1]) & (rel[1:] == rel[:-1] + stored[:-1])
    out = []
    for s, e in zip(cuts[:-1], cuts[1:]):
        offs = starts[s:e] - starts[s]
        if (offs % al[s:e]).any():
            offs = _padded(nb[s:e], al[s:e])
        adj = adjacent[s:e].copy()
        adj[0] = False
        adj[1:] &= offs[1:] == offs[:-1] + nb[s:e - 1]
        lo_of = np.flatnonzero(~adj)
        his = np.append(lo_of[1:], e - s)
        runs = [(lo, hi, int(buf[s + lo]), int(rel[s + lo]), int(rel[s + hi - 1] + stored[s + hi - 1]))
                for lo, hi in zip(lo_of.tolist(), his.tolist())]
        out.append(Slab(int(codec[s]), idx[s:e].tolist(), offs.tolist(), int(offs[-1] + nb[e - 1]), runs))
    return out


def _padded(nb: np.ndarray, al: np.ndarray) -> np.ndarray:
    offs = np.empty(len(nb), np.int64)
    o = 0
    for k, (n, a) in enumerate(zip(nb.tolist(), al.tolist())):
        o = -(-o // a) * a
        offs[k] = o
        o += n
    return offs


def fill_slab(slab: Slab, buffers: Sequence[Any], datas: Sequence[Any], nbytes: Sequence[int],
              one_by_one: Callable[[int, np.ndarray, int], None]) -> np.ndarray:
    """Allocate ``slab`` and decode its arrays into it: each run of more than one array at
    once where that is exact (``buffers``: the fetched buffers by number; ``datas`` and
    ``nbytes``: each array's stored bytes and output size, by batch index), any other array by
    ``one_by_one(batch index, slab, offset)``.  Returns the slab's memory."""
    mem = empty((slab.total,), np.uint8, f"restoring {len(slab.idx)} arrays")
    idx, offsets = slab.idx, slab.offsets
    for lo, hi, b, start, stop in slab.runs:
        if hi - lo > 1:
            o0 = offsets[lo]
            members = idx[lo:hi]
            target = mem[o0:offsets[hi - 1] + nbytes[members[-1]]]
            if _decode_run(slab.codec, members, datas, nbytes, buffers[b][start:stop], target):
                continue
        for k in range(lo, hi):
            one_by_one(idx[k], mem, offsets[k])
    return mem


def _decode_run(codec: int, members: list[int], datas: Sequence[Any], nbytes: Sequence[int],
                src: Any, target: np.ndarray) -> bool:
    """Decode the adjacent stored chunks ``src`` of ``members`` into ``target`` with one call;
    ``False`` (nothing trusted) when a chunk does not hold exactly its array's size or the run
    fails."""
    if codec == RAW:
        if any(len(datas[i]) != nbytes[i] for i in members):
            return False
        target[:] = np.frombuffer(src, np.uint8)
        return True
    fcs = zstandard.frame_content_size
    try:
        for i in members:
            if fcs(datas[i]) != nbytes[i]:
                return False
        zstd_decompress_into(src, target.data)
    except (zstandard.ZstdError, CorruptionError):
        return False
    return True
