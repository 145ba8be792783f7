"""Saved shardings as Orbax's metadata describes them, without devices.

``NamedShardingMetadata`` (mesh shape, axis names and types, partition spec and the ids of
the mesh's devices) and ``SingleDeviceShardingMetadata`` (the device's name) are what the
item's ``_sharding`` file records per array; ``to_jax_sharding()`` rebuilds the JAX sharding
on this process's devices (a ``ValueError`` when the saved devices do not exist here), and
``from_jax_sharding`` / ``to_serialized_string`` go the other way.  JAX is imported only by
the methods that build or read JAX objects.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from typing import Any

import numpy as np

__all__ = ["ShardingMetadata", "NamedShardingMetadata", "SingleDeviceShardingMetadata", "DeviceMetadata",
           "DeviceMetadataMesh", "ShardingTypes", "from_jax_sharding", "from_serialized_string", "from_description"]


class ShardingTypes:
    """The ``sharding_type`` names of the ``_sharding`` file."""

    NAMED_SHARDING = "NamedSharding"
    SINGLE_DEVICE_SHARDING = "SingleDeviceSharding"
    POSITIONAL_SHARDING = "PositionalSharding"


def _cpu_name(s: str) -> str:
    """JAX 0.10 names CPU devices ``cpu:N`` where older versions wrote ``TFRT_CPU_N``."""
    return s.replace("TFRT_CPU_", "cpu:")


@dataclasses.dataclass
class DeviceMetadata:
    """One device of a saved mesh, by id."""

    id: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceMetadata:
        """From ``{"id": n}``."""
        return cls(id=data["id"])

    @classmethod
    def from_jax_device(cls, device: Any) -> DeviceMetadata:
        """From a ``jax.Device``."""
        return cls(id=device.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMetadata) and self.id == other.id

    __hash__ = None  # type: ignore[assignment]


def _map_nested(fn: Any, node: Any, is_leaf: Any) -> Any:
    if is_leaf(node):
        return fn(node)
    if isinstance(node, (list, tuple)):
        return [_map_nested(fn, x, is_leaf) for x in node]
    return fn(node)


@dataclasses.dataclass
class DeviceMetadataMesh:
    """The devices of a saved mesh, nested as the mesh's device array."""

    mesh: Any

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceMetadataMesh:
        """From ``{"mesh": nested lists of {"id": n}}``."""
        return cls(mesh=_map_nested(DeviceMetadata.from_dict, data["mesh"],
                                    lambda x: isinstance(x, dict) and "id" in x))

    @classmethod
    def from_jax_mesh(cls, mesh: Any) -> DeviceMetadataMesh:
        """From a ``jax.sharding.Mesh``."""
        devices = mesh.devices.tolist() if isinstance(mesh.devices, np.ndarray) else mesh.devices
        return cls(mesh=_map_nested(DeviceMetadata.from_jax_device, devices, lambda x: hasattr(x, "id")))

    def ids(self) -> list[int]:
        """The device ids, flattened in mesh order."""
        out: list[int] = []

        def walk(node: Any) -> None:
            if isinstance(node, DeviceMetadata):
                out.append(node.id)
            elif isinstance(node, (list, tuple)):
                for x in node:
                    walk(x)

        walk(self.mesh)
        return out

    def to_jax_device_mesh(self) -> Any:
        """The nested ``jax.Device`` objects (a ``ValueError`` when one does not exist here)."""
        import jax  # builds JAX objects

        by_id = {d.id: d for d in jax.devices()}

        def device(m: DeviceMetadata) -> Any:
            if m.id not in by_id:
                raise ValueError("The available devices are different from the devices used to save the checkpoint. "
                                 f"Please restore checkpoint by passing new shardings for target devices. "
                                 f"Original={self.mesh}, current available={jax.devices()}")
            return by_id[m.id]

        return _map_nested(device, self.mesh, lambda x: isinstance(x, DeviceMetadata))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMetadataMesh) and self.mesh == other.mesh

    __hash__ = None  # type: ignore[assignment]


class ShardingMetadata(abc.ABC):
    """A saved ``jax.sharding.Sharding`` (named or single-device), without devices."""

    @classmethod
    @abc.abstractmethod
    def from_jax_sharding(cls, jax_sharding: Any) -> ShardingMetadata:
        """The metadata of a JAX sharding."""

    @abc.abstractmethod
    def to_jax_sharding(self) -> Any:
        """The JAX sharding on this process's devices."""

    @classmethod
    @abc.abstractmethod
    def from_deserialized_dict(cls, deserialized_dict: dict[str, Any]) -> ShardingMetadata:
        """From one entry of the ``_sharding`` file, parsed."""

    @abc.abstractmethod
    def to_serialized_string(self) -> str:
        """The ``_sharding`` entry (JSON text)."""


def _spec_element(e: Any) -> Any:
    if isinstance(e, (list, tuple)):
        return tuple(e)
    return e


@dataclasses.dataclass
class NamedShardingMetadata(ShardingMetadata):
    """A saved ``jax.sharding.NamedSharding``: mesh ``shape``, ``axis_names``,
    ``partition_spec``, optional ``axis_types`` and ``device_mesh`` (without it,
    ``to_jax_sharding`` uses ``jax.devices()`` in order)."""

    shape: Any
    axis_names: list[str]
    partition_spec: tuple[Any, ...]
    axis_types: tuple[Any, ...] | None = None
    device_mesh: DeviceMetadataMesh | None = None

    @classmethod
    def from_jax_sharding(cls, jax_sharding: Any) -> NamedShardingMetadata:
        """The metadata of a ``NamedSharding``."""
        mesh = jax_sharding.mesh
        return cls(shape=np.array(list(mesh.shape.values())), axis_names=list(mesh.axis_names),
                   axis_types=tuple(mesh.axis_types) if hasattr(mesh, "axis_types") else None,
                   partition_spec=tuple(jax_sharding.spec), device_mesh=DeviceMetadataMesh.from_jax_mesh(mesh))

    def to_jax_sharding(self) -> Any:
        """The ``NamedSharding`` over the saved devices (``ValueError`` when missing here)."""
        import jax  # builds JAX objects

        devices = self.device_mesh.to_jax_device_mesh() if self.device_mesh else jax.devices()
        arr = np.empty(int(np.prod(self.shape)), dtype=object)
        flat: list[Any] = []

        def walk(node: Any) -> None:
            if isinstance(node, (list, tuple)):
                for x in node:
                    walk(x)
            else:
                flat.append(node)

        walk(devices)
        arr[:] = flat[:arr.size]
        kwargs: dict[str, Any] = {}
        if self.axis_types is not None:
            kwargs["axis_types"] = tuple(self.axis_types)
        mesh = jax.sharding.Mesh(arr.reshape(tuple(int(s) for s in self.shape)), tuple(self.axis_names), **kwargs)
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*self.partition_spec))

    @classmethod
    def from_deserialized_dict(cls, deserialized_dict: dict[str, Any]) -> NamedShardingMetadata:
        """From a ``_sharding`` entry of type ``NamedSharding``."""
        d = deserialized_dict
        if not all(k in d for k in ("shape", "axis_names", "partition_spec")):
            raise ValueError(f"Sharding data not found in deserialized_dict: {d}")
        axis_types = None
        if d.get("axis_types"):
            axis_types = tuple(_axis_type(s) for s in d["axis_types"])
        mesh = d.get("device_mesh")
        return cls(shape=np.array(d["shape"]), axis_names=list(d["axis_names"]),
                   partition_spec=tuple(_spec_element(e) for e in d["partition_spec"]), axis_types=axis_types,
                   device_mesh=DeviceMetadataMesh.from_dict(mesh) if mesh else None)

    def to_serialized_string(self) -> str:
        """The ``_sharding`` entry, as Orbax writes it."""
        doc: dict[str, Any] = {"sharding_type": ShardingTypes.NAMED_SHARDING,
                               "shape": np.asarray(self.shape).tolist(), "axis_names": list(self.axis_names)}
        if self.axis_types is not None:
            doc["axis_types"] = [str(a) for a in self.axis_types]
        doc["partition_spec"] = list(self.partition_spec)
        if self.device_mesh:
            doc["device_mesh"] = dataclasses.asdict(self.device_mesh)
        return json.dumps(doc)

    def __repr__(self) -> str:
        return (f"NamedShardingMetadata(shape={self.shape}, axis_names={self.axis_names}, "
                f"axis_types={self.axis_types}, partition_spec={self.partition_spec}) device_mesh={self.device_mesh}")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, NamedShardingMetadata) and np.array_equal(self.shape, other.shape)
                and list(self.axis_names) == list(other.axis_names) and self.axis_types == other.axis_types
                and tuple(self.partition_spec) == tuple(other.partition_spec)
                and self.device_mesh == other.device_mesh)

    __hash__ = None  # type: ignore[assignment]


def _axis_type(name: str) -> Any:
    """A ``jax.sharding.AxisType`` from its saved name (the name itself without JAX)."""
    import sys

    if "jax" not in sys.modules:
        return name
    import jax  # loaded already (checked above)

    for t in getattr(jax.sharding, "AxisType", ()):
        if str(t) == name or t.name == name:
            return t
    return name


@dataclasses.dataclass
class SingleDeviceShardingMetadata(ShardingMetadata):
    """A saved ``jax.sharding.SingleDeviceSharding``: the device's name (``cpu:0``...)."""

    device_str: str

    @classmethod
    def from_jax_sharding(cls, jax_sharding: Any) -> SingleDeviceShardingMetadata:
        """The metadata of a ``SingleDeviceSharding``."""
        return cls(device_str=str(next(iter(jax_sharding.device_set))))

    def to_jax_sharding(self) -> Any:
        """The sharding on the local device of that name (``ValueError`` when missing here)."""
        import jax  # builds JAX objects

        wanted = _cpu_name(self.device_str)
        for d in jax.local_devices():
            if _cpu_name(str(d)) == wanted:
                return jax.sharding.SingleDeviceSharding(d)
        raise ValueError(f"Device {wanted} was not found in jax.local_devices().")

    @classmethod
    def from_deserialized_dict(cls, deserialized_dict: dict[str, Any]) -> SingleDeviceShardingMetadata:
        """From a ``_sharding`` entry of type ``SingleDeviceSharding``."""
        if deserialized_dict.get("device_str") is None:
            raise ValueError(f"Device str not found in deserialized_dict: {deserialized_dict}")
        return cls(device_str=deserialized_dict["device_str"])

    def to_serialized_string(self) -> str:
        """The ``_sharding`` entry, as Orbax writes it."""
        return json.dumps({"sharding_type": ShardingTypes.SINGLE_DEVICE_SHARDING, "device_str": self.device_str})

    def __repr__(self) -> str:
        return f"SingleDeviceShardingMetadata(device_str={self.device_str})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SingleDeviceShardingMetadata) and _cpu_name(self.device_str) == _cpu_name(
            other.device_str)

    __hash__ = None  # type: ignore[assignment]


def from_jax_sharding(jax_sharding: Any) -> ShardingMetadata | None:
    """The metadata of a named or single-device JAX sharding (``None`` for other kinds)."""
    import jax  # the argument is a JAX object

    if isinstance(jax_sharding, jax.sharding.NamedSharding):
        return NamedShardingMetadata.from_jax_sharding(jax_sharding)
    if isinstance(jax_sharding, jax.sharding.SingleDeviceSharding):
        return SingleDeviceShardingMetadata.from_jax_sharding(jax_sharding)
    return None


def from_description(desc: Any) -> ShardingMetadata | None:
    """The metadata of one parsed ``_sharding`` entry (``None`` for kinds not described)."""
    if not isinstance(desc, dict):
        return None
    kind = desc.get("sharding_type")
    try:
        if kind == ShardingTypes.NAMED_SHARDING:
            return NamedShardingMetadata.from_deserialized_dict(desc)
        if kind == ShardingTypes.SINGLE_DEVICE_SHARDING:
            return SingleDeviceShardingMetadata.from_deserialized_dict(desc)
    except (ValueError, KeyError, TypeError):
        return None
    return None


def from_serialized_string(serialized: str) -> ShardingMetadata:
    """The metadata of a ``_sharding`` entry's JSON text."""
    doc = json.loads(serialized)
    kind = doc.get("sharding_type") if isinstance(doc, dict) else None
    if kind == ShardingTypes.NAMED_SHARDING:
        return NamedShardingMetadata.from_deserialized_dict(doc)
    if kind == ShardingTypes.SINGLE_DEVICE_SHARDING:
        return SingleDeviceShardingMetadata.from_deserialized_dict(doc)
    if kind == ShardingTypes.POSITIONAL_SHARDING:
        raise ValueError("jax.sharding.PositionalSharding has been deprecated. Please use jax.NamedSharding instead.")
    raise NotImplementedError(f"Conversion for {kind} has not been implemented.")
