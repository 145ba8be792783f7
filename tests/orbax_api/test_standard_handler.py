"""``StandardSave``/``StandardRestore`` checked as Orbax checks them, run on both libraries:
unsupported leaf types refused, ``None`` target leaves not read, ``strict=False`` padding and
truncating, and Orbax's topology-mismatch wording."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import ocdbt_py.orbax as ours

LIBS = ["ocdbt_py.orbax", "orbax.checkpoint"]


def _lib(name: str):
    if name == "orbax.checkpoint":
        pytest.importorskip("orbax.checkpoint")
    return importlib.import_module(name)


def _outcome(fn):
    try:
        r = fn()
    except ValueError as e:
        return "ValueError", str(e).split(" for key")[0]
    return "ok", {k: (None if v is None else tuple(np.shape(v))) for k, v in r.items()}


@pytest.mark.parametrize("lib", LIBS)
def test_unsupported_types_and_none_leaves(lib, tmp_path) -> None:
    ocp = _lib(lib)
    h = ocp.StandardCheckpointHandler()
    with pytest.raises(ValueError, match="Unsupported type"):
        h.save(tmp_path / "bad", args=ocp.args.StandardSave({"s": "text", "a": np.ones(2)}))
    h.save(tmp_path / "c", args=ocp.args.StandardSave({"a": np.arange(4), "b": 1.5}))
    h.finalize(tmp_path / "c")
    got = {
        "str": _outcome(lambda: h.restore(tmp_path / "c", args=ocp.args.StandardRestore({"a": "x", "b": 0.0}))),
        "np-scalar": _outcome(lambda: h.restore(tmp_path / "c", args=ocp.args.StandardRestore(
            {"a": np.zeros(4, np.int64), "b": np.float32(0)}))),
        "none": _outcome(lambda: h.restore(tmp_path / "c", args=ocp.args.StandardRestore({"a": None, "b": 0.0}))),
        "all-none": _outcome(lambda: h.restore(tmp_path / "c", args=ocp.args.StandardRestore({"a": None, "b": None}))),
    }
    assert got == {
        "str": ("ValueError", "Unsupported type: <class 'str'>"),
        "np-scalar": ("ValueError", "Unsupported type: <class 'numpy.float32'>"),
        "none": ("ok", {"a": None, "b": ()}),
        "all-none": ("ok", {"a": None, "b": None}),
    }


def test_pytree_none_item_leaf_is_not_read(tmp_path) -> None:
    ours.PyTreeCheckpointer().save(tmp_path / "p", {"a": np.arange(3), "b": {"c": 2}})
    got = ours.PyTreeCheckpointer().restore(tmp_path / "p", args=ours.args.PyTreeRestore({"a": None, "b": {"c": 0}}))
    assert list(got) == ["a", "b"] and got["a"] is None and got["b"] == {"c": 2}
    # restore_args of None (no constraint) still read the leaf
    got = ours.PyTreeCheckpointer().restore(tmp_path / "p", args=ours.args.PyTreeRestore(
        restore_args={"a": ours.RestoreArgs(), "b": {"c": ours.RestoreArgs()}}))
    assert got["a"].tolist() == [0, 1, 2]


def test_strict_false_pads_and_truncates(tmp_path) -> None:
    # (Orbax's own test_change_shape runs the same in conformance/orbax_suite)
    jax = pytest.importorskip("jax")
    ocp = ours
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    h = ocp.StandardCheckpointHandler()
    h.save(tmp_path / "c", args=ocp.args.StandardSave({"x": jax.device_put(np.arange(6), sharding)}))
    h.finalize(tmp_path / "c")
    for n, want in ((4, [0, 1, 2, 3]), (8, [0, 1, 2, 3, 4, 5, 0, 0])):
        target = {"x": jax.ShapeDtypeStruct((n,), np.arange(6).dtype, sharding=sharding)}
        with pytest.raises(ValueError, match="not compatible with|stored with shape"):
            h.restore(tmp_path / "c", args=ocp.args.StandardRestore(target))
        got = h.restore(tmp_path / "c", args=ocp.args.StandardRestore(target, strict=False))
        assert isinstance(got["x"], jax.Array) and got["x"].tolist() == want


def test_topology_mismatch_wording(tmp_path, monkeypatch) -> None:
    jax = pytest.importorskip("jax")
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("x",))
    arr = jax.device_put(np.zeros(2), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    h = ours.StandardCheckpointHandler()
    h.save(tmp_path / "c", args=ours.args.StandardSave({"a": arr}))
    fallback = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    monkeypatch.setattr(jax, "devices", lambda *a: [])
    with pytest.raises(ValueError, match="Topology mismatch detected"):
        h.restore(tmp_path / "c")
    # StandardRestore(fallback_sharding=...): the leaves whose saved devices are missing go there
    for item in (None, {"a": jax.ShapeDtypeStruct((2,), arr.dtype)}):
        got = h.restore(tmp_path / "c", args=ours.args.StandardRestore(item, fallback_sharding=fallback))
        assert got["a"].sharding == fallback and got["a"].tolist() == [0.0, 0.0]
