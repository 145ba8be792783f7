"""Orbax's metadata objects as ``ocdbt_py.orbax`` returns them: ``ArrayMetadata``,
``ScalarMetadata``, ``StringMetadata``, ``TreeMetadata``, saved shardings, and
``construct_restore_args`` over them.  Orbax (when installed) is the oracle for what its
handlers return for the same checkpoint."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import ocdbt_py.orbax as ocp
from ocdbt_py.checkpoint import LeafMetadata
from ocdbt_py.orbax.metadata import (
    ArrayMetadata,
    NamedShardingMetadata,
    ScalarMetadata,
    SingleDeviceShardingMetadata,
    StorageMetadata,
    StringMetadata,
    TreeMetadata,
)

TREE = {"n": np.arange(6, dtype=np.int16).reshape(2, 3), "i": 3, "f": 2.5, "s": "hello", "none": None, "ed": {},
        "l": [1, np.ones(2)]}


def test_value_equality_as_orbax() -> None:
    a = ArrayMetadata(name="x", directory=pathlib.Path("/a"), shape=(2,), sharding=None, dtype=np.dtype("f4"))
    # name and directory do not count; shape, sharding, dtype and storage do
    assert a == ArrayMetadata(name="y", directory=None, shape=(2,), sharding=None, dtype=np.dtype("f4"))
    assert a != ArrayMetadata(name="x", directory=None, shape=(3,), sharding=None, dtype=np.dtype("f4"))
    assert a != dataclass_replace(a, storage=StorageMetadata(chunk_shape=(1,)))
    s = ScalarMetadata(name="a", directory=None, dtype=np.int32)
    assert s == ScalarMetadata(name="b", directory=pathlib.Path("/x"), dtype=np.dtype("int32"))
    assert s != ScalarMetadata(name="a", directory=None, dtype=np.int64)
    assert s != a and a != s
    assert StringMetadata(name="a", directory=None) == StringMetadata(name="b", directory=pathlib.Path("/"))
    assert StringMetadata(name="a", directory=None) != s
    assert repr(a).startswith("ArrayMetadata :  name=x,  directory=/a,  shape=(2,),")
    assert repr(s) == ("ScalarMetadata(name='a', directory=None, shape=(), sharding=None, "
                       "dtype=<class 'numpy.int32'>, storage=None)")


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_pytree_metadata_leaves_and_tree_interface(tmp_path) -> None:
    path = tmp_path / "ck"
    ckptr = ocp.PyTreeCheckpointer()
    ckptr.save(path, args=ocp.args.PyTreeSave(TREE, custom_metadata={"run": 7}))
    meta = ckptr.metadata(path).item_metadata
    assert isinstance(meta, TreeMetadata)
    assert meta.custom_metadata == {"run": 7} and meta.use_zarr3 is False
    assert set(meta.keys()) == set(TREE) and "n" in meta and len(meta) == len(TREE)
    n = meta["n"]
    assert type(n) is ArrayMetadata
    assert (n.name, n.directory, n.shape, n.dtype, n.sharding) == ("n", path, (2, 3), np.dtype("int16"), None)
    assert n.storage == StorageMetadata(chunk_shape=(2, 3))
    assert type(meta["i"]) is ScalarMetadata and meta["i"].dtype == np.dtype("int64")
    assert type(meta["f"]) is ScalarMetadata and meta["f"].dtype == np.dtype("float64")
    assert type(meta["s"]) is StringMetadata and meta["s"].name == "s"
    assert meta["none"] is None and meta["ed"] == {}
    assert type(meta["l"][0]) is ScalarMetadata and meta["l"][1].name == "l.1"
    assert meta.get("missing", 5) == 5
    # the native API keeps its own LeafMetadata
    from ocdbt_py.checkpoint import metadata

    assert isinstance(metadata(path)["n"], LeafMetadata)


def test_standard_metadata_and_handlers(tmp_path) -> None:
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(tmp_path / "s", {"a": np.float32(1.5), "b": np.zeros(3)})
    ckptr.wait_until_finished()
    m = ocp.StandardCheckpointHandler().metadata(tmp_path / "s")
    assert isinstance(m, TreeMetadata)
    assert type(m["a"]) is ArrayMetadata and m["a"].shape == ()  # StandardSave: NumPy scalars as 0-d arrays
    assert ocp.JsonCheckpointHandler().metadata(tmp_path / "s") is None


def test_composite_metadata_unknown_items_are_none(tmp_path) -> None:
    ckptr = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    ckptr.save(tmp_path / "c", args=ocp.args.Composite(state=ocp.args.StandardSave({"a": 1}),
                                                       meta=ocp.args.JsonSave({"k": 1})))
    known = ocp.CompositeCheckpointHandler(state=ocp.StandardCheckpointHandler(),
                                           meta=ocp.JsonCheckpointHandler()).metadata(tmp_path / "c")
    assert isinstance(known.item_metadata, ocp.args.Composite)
    assert known.item_metadata.state["a"] == ScalarMetadata(name="a", directory=None, dtype=np.int64)
    assert known.item_metadata.state["a"].directory == tmp_path / "c" / "state"
    assert known.item_metadata.meta is None  # JSON items keep no metadata, as Orbax's handler
    unknown = ocp.CompositeCheckpointHandler().metadata(tmp_path / "c")
    assert dict(unknown.item_metadata) == {"state": None, "meta": None}
    assert isinstance(unknown.performance_metrics, ocp.logging.step_statistics.SaveStepStatistics)
    with pytest.raises(FileNotFoundError):
        ocp.CompositeCheckpointHandler().metadata(tmp_path / "missing")


def test_construct_restore_args_from_metadata(tmp_path) -> None:
    ckptr = ocp.PyTreeCheckpointer()
    ckptr.save(tmp_path / "ck", TREE)
    meta = ckptr.metadata(tmp_path / "ck").item_metadata
    ra = ocp.checkpoint_utils.construct_restore_args(meta)
    assert isinstance(ra, TreeMetadata)
    assert ra["n"] == ocp.RestoreArgs(restore_type=np.ndarray, dtype=np.dtype("int16"))
    assert ra["i"] == ocp.RestoreArgs(restore_type=int, dtype=np.dtype("int64"))
    assert ra["s"] == ocp.RestoreArgs(restore_type=str)
    with pytest.raises(ValueError, match="Unsupported type"):
        ocp.checkpoint_utils.construct_restore_args({"x": object()})


def test_sharding_metadata_serialization_round_trip() -> None:
    desc = {"sharding_type": "NamedSharding", "shape": [2, 4], "axis_names": ["a", "b"], "partition_spec": ["a", None],
            "device_mesh": {"mesh": [[{"id": i} for i in range(4)], [{"id": i} for i in range(4, 8)]]}}
    import json

    m = ocp.metadata.sharding.from_serialized_string(json.dumps(desc))
    assert isinstance(m, NamedShardingMetadata) and m.axis_names == ["a", "b"] and m.partition_spec == ("a", None)
    assert m == ocp.metadata.sharding.from_serialized_string(m.to_serialized_string())
    assert m.device_mesh is not None and m.device_mesh.ids() == list(range(8))
    one = SingleDeviceShardingMetadata(device_str="TFRT_CPU_0")
    assert one == SingleDeviceShardingMetadata(device_str="cpu:0")
    assert one == ocp.metadata.sharding.from_serialized_string(one.to_serialized_string())


def test_same_as_orbax_with_jax(tmp_path) -> None:
    """Orbax as the oracle: the same checkpoint's metadata, field by field, and JAX pytree
    behaviour (``jax.tree.map`` over it gives a ``TreeMetadata`` again)."""
    jax = pytest.importorskip("jax")
    orbax = pytest.importorskip("orbax.checkpoint")
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("a", "b"))
    x = jax.device_put(np.arange(8.0).reshape(2, 4),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a", "b")))
    tree = {**TREE, "j": x}
    ocp.PyTreeCheckpointer().save(tmp_path / "ck", tree)
    ours = ocp.PyTreeCheckpointer().metadata(tmp_path / "ck").item_metadata
    theirs = orbax.PyTreeCheckpointer().metadata(tmp_path / "ck").item_metadata
    flat_o = jax.tree_util.tree_flatten_with_path(ours)[0]
    flat_t = jax.tree_util.tree_flatten_with_path(theirs)[0]
    assert [p for p, _ in flat_o] == [p for p, _ in flat_t]
    for (_, a), (_, b) in zip(flat_o, flat_t):
        assert type(a).__name__ == type(b).__name__
        assert a.name == b.name and str(a.directory) == str(b.directory)
        if hasattr(b, "shape"):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)
            assert (a.storage is None) == (b.storage is None)
            if b.storage is not None:
                assert (a.storage.chunk_shape, a.storage.write_shape) == (b.storage.chunk_shape, b.storage.write_shape)
        if getattr(b, "sharding", None) is not None:
            assert a.sharding.to_jax_sharding() == b.sharding.to_jax_sharding() == x.sharding
            assert repr(a.sharding) == repr(b.sharding)
    mapped = jax.tree.map(lambda m: m.shape if hasattr(m, "shape") else None, ours)
    assert isinstance(mapped, TreeMetadata) and mapped["j"] == (2, 4) and mapped.tree["l"][1] == (2,)
    ra = ocp.checkpoint_utils.construct_restore_args(ours)
    assert isinstance(ra["j"], ocp.ArrayRestoreArgs) and ra["j"].global_shape == (2, 4)
    restored = ocp.PyTreeCheckpointer().restore(tmp_path / "ck", args=ocp.args.PyTreeRestore(restore_args=ra.tree))
    assert restored["j"].sharding == x.sharding
    # the metadata itself as the restore item (Orbax's documented use), as Orbax restores it
    for item in (ours, ours.tree):
        got = ocp.PyTreeCheckpointer().restore(tmp_path / "ck", args=ocp.args.PyTreeRestore(item=item))
        want = orbax.PyTreeCheckpointer().restore(tmp_path / "ck", args=orbax.args.PyTreeRestore(item=theirs))
        assert type(got) is type(want) is dict and set(got) == set(want)
        for k in want:
            assert type(got[k]).__name__ == type(want[k]).__name__, k
        assert got["j"].sharding == want["j"].sharding == x.sharding and got["s"] == "hello"
