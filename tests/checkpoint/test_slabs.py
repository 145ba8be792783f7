"""Small single-chunk arrays restored a run at a time into shared slabs (``restore.slabs``):
the same values, independent writeable aligned arrays, bounded sharing, and damage in any one
chunk of a run reported against that array."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ocdbt_py import checkpoint
from ocdbt_py.checkpoint.restore import slabs
from ocdbt_py.checkpoint.restore.api import open_item_dir, resolve
from ocdbt_py.errors import CorruptionError


def _tree() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    t: dict[str, Any] = {f"w{i:03d}": rng.standard_normal(1024 + i, dtype=np.float32) for i in range(40)}
    t["odd_i8"] = np.arange(3, dtype=np.int8)  # 3 bytes: a wider dtype after it is padded
    t["f64"] = rng.standard_normal(5)
    t["flags"] = np.array([True, False, True, True, False, False, True])
    t["bf16"] = rng.standard_normal(33).astype(ml_dtypes.bfloat16)
    t["grid"] = rng.integers(0, 1000, (17, 9), dtype=np.int64)
    t["one_u16"] = np.array([7], np.uint16)
    t["zero_d"] = np.array(3.5, np.float64)
    t["wide"] = rng.standard_normal(600_000, dtype=np.float32)  # 2.4 MB: more than a slab holds
    return t


def _item(path: Path) -> Any:
    return open_item_dir(resolve(str(path)).kv)


def _location(path: Path, name: str) -> Any:
    item = _item(path)
    reader = item.reader
    meta = reader.metadata(item.data_param(next(leaf for leaf in item.leaves if leaf.names == (name,))))
    key = f"{name}/{meta.chunk_key((0,) * len(meta.shape))}"
    src = reader.local_source()
    assert src is not None and src.table is not None
    return src.table[key]


@pytest.mark.parametrize("use_zarr3", [False, True])
@pytest.mark.parametrize("use_compression", [True, False])
def test_values_and_independent_arrays(tmp_path: Path, use_zarr3: bool, use_compression: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree()
    checkpoint.save(tmp_path / "ck", tree, use_zarr3=use_zarr3, use_compression=use_compression)
    runs: list[int] = []
    real = slabs._decode_run

    def spy(codec: int, members: list[int], *rest: Any) -> bool:
        ok = real(codec, members, *rest)
        runs.append(len(members) if ok else 0)
        return ok

    monkeypatch.setattr(slabs, "_decode_run", spy)
    got = checkpoint.restore(tmp_path / "ck")
    assert set(got) == set(tree)
    for k, v in tree.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)
        assert got[k].flags.writeable and got[k].flags.aligned and got[k].flags.c_contiguous, k
    if not use_zarr3:  # (Zarr 3 arrays are shards: their chunks are not back to back)
        # the run path did the work: the 40 float32 neighbours came out of a few calls
        assert sum(runs) >= 40 and len([n for n in runs if n]) <= 8, runs
        assert len([v for v in got.values() if v.base is not None]) >= 40
    shared = [v for v in got.values() if v.base is not None]
    for v in shared:  # a restored array keeps at most one slab alive
        assert v.base.nbytes <= max(slabs.SLAB_BYTES, v.nbytes)
    # writing one array leaves its slab neighbours alone
    before = {k: v.copy() for k, v in got.items()}
    got["w001"][...] = 0
    got["odd_i8"][...] = -1
    for k in got:
        if k not in ("w001", "odd_i8"):
            np.testing.assert_array_equal(got[k], before[k], err_msg=k)


def _damage(path: Path, name: str, at: int, data: bytes) -> None:
    loc = _location(path, name)
    with open(loc.file, "r+b") as f:
        f.seek(loc.offset + at)
        f.write(data)


def test_a_damaged_frame_in_a_run_names_its_array(tmp_path: Path) -> None:
    checkpoint.save(tmp_path / "ck", _tree())
    _damage(tmp_path / "ck", "w020", 0, b"\0\0\0\0")  # not a zstd frame any more
    with pytest.raises(CorruptionError, match="w020"):
        checkpoint.restore(tmp_path / "ck")


@pytest.mark.parametrize("declared", [4096, 9000])
def test_a_frame_declaring_another_size_names_its_array(tmp_path: Path, declared: int) -> None:
    """w010 holds 1034 float32 (4136 bytes): its frame header is made to declare ``declared``
    bytes (less, then more): decoding it with its neighbours would shift every later array."""
    checkpoint.save(tmp_path / "ck", _tree())
    loc = _location(tmp_path / "ck", "w010")
    with open(loc.file, "rb") as f:
        f.seek(loc.offset)
        head = f.read(16)
    assert head[:4] == b"\x28\xb5\x2f\xfd"
    fhd = head[4]
    single, fcs_flag = (fhd >> 5) & 1, fhd >> 6
    assert fcs_flag == 1 and not (fhd & 3), "expected a 2-byte content size and no dictionary id"
    pos = 5 + (0 if single else 1)
    _damage(tmp_path / "ck", "w010", pos, (declared - 256).to_bytes(2, "little"))
    with pytest.raises(CorruptionError, match="w010"):
        checkpoint.restore(tmp_path / "ck")


def test_raw_chunk_of_the_wrong_length_is_not_copied_as_a_run() -> None:
    """Uncompressed neighbours are copied as one run only when every chunk is exactly its
    array's size."""
    src = np.arange(6 * 256, dtype=np.uint8)
    datas = [src.data[i * 256: (i + 1) * 256] for i in range(6)]
    datas[3] = src.data[3 * 256: 4 * 256 - 1]
    nbytes = [256] * 6
    assert not slabs._decode_run(slabs.RAW, list(range(6)), datas, nbytes, src.data, np.empty(6 * 256, np.uint8))
    out = np.empty(3 * 256, np.uint8)
    assert slabs._decode_run(slabs.RAW, [0, 1, 2], datas, nbytes, src.data[:768], out)
    np.testing.assert_array_equal(out, src[:768])


def _plan(nb: list[int], align: list[int], buf: list[int], rel: list[int], stored: list[int],
          codec: list[int] | None = None) -> list[slabs.Slab]:
    n = len(nb)
    return slabs.plan_slabs(np.arange(n), np.array(codec or [slabs.ZSTD] * n), np.array(nb), np.array(align),
                            np.array(buf), np.array(rel), np.array(stored))


def test_plan_slabs_bounds_orders_and_runs() -> None:
    # ten arrays of a third of a slab plus one byte over two buffers, given out of file order
    size = slabs.SLAB_BYTES // 3 + 1
    order = [7, 2, 9, 0, 4, 1, 8, 3, 6, 5]
    planned = _plan([size] * 10, [4] * 10, [k % 2 for k in order], [(k // 2) * 1000 for k in order], [1000] * 10)
    assert sorted(i for slab in planned for i in slab.idx) == list(range(10))
    for slab in planned:
        assert len(slab.idx) <= 2  # 2 of them (+ padding) fit in a slab, 3 do not
        files = [((order[i] % 2), order[i] // 2) for i in slab.idx]
        assert files == sorted(files)  # file order within a slab
        assert all(o % 4 == 0 for o in slab.offsets)  # padded to the dtype's alignment
        assert slab.total == slab.offsets[-1] + size
        # the size is odd: every array is padded, so no two are back to back
        assert [(lo, hi) for lo, hi, *_ in slab.runs] == [(k, k + 1) for k in range(len(slab.idx))]
    one = _plan([3 * slabs.SLAB_BYTES], [1], [0], [0], [10])
    assert len(one) == 1 and one[0].idx == [0]  # larger than a slab: a slab of its own


def test_plan_slabs_runs_follow_adjacency_and_codec() -> None:
    # buffer 0: arrays 0,1,2 back to back, a gap, then 3; buffer 1: 4; array 5 is raw
    planned = _plan([64] * 6, [4] * 6, [0, 0, 0, 0, 1, 0], [0, 10, 20, 40, 0, 50], [10] * 6,
                    [slabs.ZSTD] * 5 + [slabs.RAW])
    assert [slab.codec for slab in planned] == [slabs.ZSTD, slabs.RAW]
    z = planned[0]
    assert z.idx == [0, 1, 2, 3, 4] and z.offsets == [0, 64, 128, 192, 256]
    assert z.runs == [(0, 3, 0, 0, 30), (3, 4, 0, 40, 50), (4, 5, 1, 0, 10)]
    assert planned[1].idx == [5] and planned[1].runs == [(0, 1, 0, 50, 60)]
