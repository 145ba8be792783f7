"""The topology a multi-tier checkpoint was written on, and the replica structure of a mesh.

A local-tier step holds only the shards its process's devices had, so it can be restored
directly only on the same topology.  Like Orbax's emergency checkpoint manager, each local
step records it in ``process_metadata/``:

* ``global_process_metadata.json``: the device ids of each JAX process, e.g.
  ``[[0, 1, 2, 3], [2048, 2049, 2050, 2051]]``;
* ``mesh_metadata.json``: the device ids of the global mesh, flattened in mesh order.

:class:`Topology` compares them with the running job.  :class:`ReplicaLayout` says which
processes form each data-parallel replica (slices of the mesh along the replica axis).
:func:`state_fingerprint` digests the state's leaf paths, shapes, dtypes and shardings, so a
local step is also refused when the state is now sharded differently.

Only :meth:`Topology.current`, :meth:`ReplicaLayout.of` and :func:`state_fingerprint` import
JAX; the rest works on plain lists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import GLOBAL_PROCESS_METADATA, MESH_METADATA
from ocdbt_py.checkpoint.meta import LeafMetadata, metadata
from ocdbt_py.checkpoint.saving.jax_arrays import sharding_json
from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore.base import KvStore

__all__ = ["PROCESS_METADATA", "GLOBAL_PROCESS_METADATA", "MESH_METADATA", "Topology", "ReplicaLayout",
           "state_fingerprint"]

#: The item of a local step holding the topology files (a name Orbax reserves).
PROCESS_METADATA = "process_metadata"
_LIMIT = 16 << 20


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise CorruptionError(f"{what} is not a list of device ids")
    return [int(v) for v in value]


@dataclasses.dataclass(frozen=True)
class Topology:
    """Device ids per process and the global mesh's flattened device ids."""

    process_devices: tuple[tuple[int, ...], ...]
    mesh_devices: tuple[int, ...]

    @classmethod
    def current(cls, mesh: Any) -> Topology:
        """The running job's topology for ``mesh`` (a ``jax.sharding.Mesh``)."""
        # optional: JAX is imported only for trees that hold JAX objects
        import jax

        per: dict[int, list[int]] = {}
        for d in jax.devices():
            per.setdefault(int(d.process_index), []).append(int(d.id))
        count = int(jax.process_count())
        procs = tuple(tuple(sorted(per.get(i, []))) for i in range(count))
        return cls(procs, tuple(int(d.id) for d in mesh.devices.flat))

    def files(self) -> dict[str, bytes]:
        """The two JSON files, by name."""
        return {
            GLOBAL_PROCESS_METADATA: json.dumps([list(p) for p in self.process_devices]).encode(),
            MESH_METADATA: json.dumps(list(self.mesh_devices)).encode(),
        }

    def write(self, kv: KvStore) -> None:
        """Write the two files into ``kv`` (the ``process_metadata`` directory)."""
        for name, data in self.files().items():
            kv.set(name, data)

    @classmethod
    def read(cls, kv: KvStore) -> Topology | None:
        """The recorded topology (``None`` when either file is missing)."""
        procs = read_json(kv, GLOBAL_PROCESS_METADATA, _LIMIT)
        mesh = read_json(kv, MESH_METADATA, _LIMIT)
        if procs is None or mesh is None:
            return None
        if not isinstance(procs, list):
            raise CorruptionError(f"{GLOBAL_PROCESS_METADATA} is not a list", path=kv.url)
        per = tuple(tuple(_int_list(p, GLOBAL_PROCESS_METADATA)) for p in procs)
        return cls(per, tuple(_int_list(mesh, MESH_METADATA)))

    def mismatch(self, now: Topology, process_index: int) -> str | None:
        """Why a step recorded with this topology cannot be restored locally now (``None``:
        it can)."""
        if len(self.process_devices) != len(now.process_devices):
            return (f"it was written by a job of {len(self.process_devices)} processes, "
                    f"this job has {len(now.process_devices)}")
        if self.mesh_devices != now.mesh_devices:
            return (f"the mesh's device ids were {_short(self.mesh_devices)}, "
                    f"now {_short(now.mesh_devices)}")
        if self.process_devices[process_index] != now.process_devices[process_index]:
            return (f"process {process_index} had devices {_short(self.process_devices[process_index])}, "
                    f"now {_short(now.process_devices[process_index])}")
        return None


def _short(ids: Sequence[int]) -> str:
    ids = list(ids)
    return str(ids) if len(ids) <= 16 else f"[{', '.join(map(str, ids[:16]))}, ... ({len(ids)} devices)]"


@dataclasses.dataclass(frozen=True)
class ReplicaLayout:
    """The data-parallel replicas of a mesh: slices along the replica axis.

    ``replicas[r]`` lists the processes whose devices lie in replica ``r`` and
    ``replica_devices[r]`` those devices' ids; every process's mesh devices lie in one
    replica.
    """

    axis_index: int
    axis_name: str
    replicas: tuple[tuple[int, ...], ...]
    replica_devices: tuple[frozenset[int], ...]

    @classmethod
    def of(cls, mesh: Any, axis_index: int) -> ReplicaLayout:
        """The replicas of ``mesh`` along its axis ``axis_index``."""

        devices = np.asarray(mesh.devices)
        if not 0 <= axis_index < devices.ndim:
            raise ValueError(f"replica_axis_index {axis_index} is out of range for a mesh of shape "
                             f"{tuple(devices.shape)}")
        count = devices.shape[axis_index]
        replicas: list[tuple[int, ...]] = []
        ids: list[frozenset[int]] = []
        owner: dict[int, int] = {}
        for r in range(count):
            part = np.take(devices, r, axis=axis_index).reshape(-1)
            procs = sorted({int(d.process_index) for d in part})
            for p in procs:
                if p in owner:
                    raise ValueError(f"process {p} has devices in replicas {owner[p]} and {r} of the mesh; "
                                     "each process must belong to one replica")
                owner[p] = r
            replicas.append(tuple(procs))
            ids.append(frozenset(int(d.id) for d in part))
        return cls(axis_index, str(mesh.axis_names[axis_index]), tuple(replicas), tuple(ids))

    @property
    def count(self) -> int:
        """The number of replicas."""
        return len(self.replicas)

    def replica_of(self, process_index: int) -> int | None:
        """The replica of a process (``None`` if it has no device in the mesh)."""
        for r, procs in enumerate(self.replicas):
            if process_index in procs:
                return r
        return None


def _sharding_description(sharding: Any) -> Any:

    described = sharding_json(sharding) if sharding is not None else None
    if described is not None:
        return json.loads(described)
    return repr(sharding)


def state_fingerprint(tree: Any) -> str:
    """A digest of the leaf paths, shapes, dtypes and shardings of a tree of ``jax.Array`` or
    ``jax.ShapeDtypeStruct`` leaves (equal for a state and its abstract state)."""
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    doc = []
    for path, leaf in flat:
        doc.append([jax.tree_util.keystr(path), [int(d) for d in leaf.shape], str(leaf.dtype),
                    _sharding_description(getattr(leaf, "sharding", None))])
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _key_part(k: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _recorded_leaves(tree: Any, out: dict[tuple[str, ...], Any]) -> None:
    if isinstance(tree, LeafMetadata):
        out[tuple(str(p) for p in tree.path)] = tree
    elif isinstance(tree, dict):
        for v in tree.values():
            _recorded_leaves(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _recorded_leaves(v, out)


def _as_doc(sharding: Any) -> Any:
    if isinstance(sharding, (str, bytes)):
        try:
            return json.loads(sharding)
        except ValueError:
            return sharding
    return sharding


def foreign_state_problem(item_path: str, target: Any) -> str | None:
    """Why a local step's state item written without our fingerprint (by Orbax's emergency
    ``CheckpointManager``) cannot be read locally onto ``target`` (``None``: it can).

    A local step holds only the regions its process's devices had, so the tree, every leaf's
    shape and dtype, and the sharding Orbax recorded in ``_sharding`` must equal the
    target's: otherwise this process would look for regions it never wrote.
    """
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    recorded: dict[tuple[str, ...], Any] = {}
    _recorded_leaves(metadata(item_path, stored_sizes=False), recorded)
    wanted = {tuple(_key_part(k) for k in path): leaf
              for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]}
    if set(recorded) != set(wanted):
        diff = sorted(set(recorded) ^ set(wanted))[:3]
        return f"its tree differs from the restore target's (e.g. {['.'.join(p) for p in diff]})"
    for path, leaf in wanted.items():
        md = recorded[path]
        name = ".".join(path)
        if md.shape is None or tuple(md.shape) != tuple(int(d) for d in leaf.shape) or md.dtype != leaf.dtype:
            return f"{name} is {md.dtype}{list(md.shape or ())}, the target {leaf.dtype}{list(leaf.shape)}"
        want = sharding_json(getattr(leaf, "sharding", None))
        if want is None or _as_doc(md.sharding) != json.loads(want):
            return f"{name} was saved with another sharding than the target's"
    return None
