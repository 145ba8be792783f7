"""Zarr groups (v3 ``zarr.json`` with ``node_type: group``; v2 ``.zgroup`` + ``.zattrs``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ocdbt_py.errors import ReadOnlyError
from ocdbt_py.kvstore import KvStore, PrefixStore, validate_key
from zarr3.array import Array, create, load_metadata, resolve_store
from zarr3.errors import ArrayNotFoundError, MetadataError, NodeExistsError
from zarr3.metadata_v2 import ArrayMetadataV2, GroupMetadataV2
from zarr3.metadata_v3 import ArrayMetadataV3, GroupMetadataV3

__all__ = ["Group", "open_group", "create_group"]

GroupMetadata = GroupMetadataV3 | GroupMetadataV2


class Group:
    """A Zarr group: attributes plus child arrays and groups below its path."""

    def __init__(self, store: KvStore, metadata: GroupMetadata, *, mode: str = "r"):
        self._store = store
        self._meta = metadata
        self._mode = mode

    @property
    def store(self) -> KvStore:
        """The store, scoped to the group's path."""
        return self._store

    @property
    def metadata(self) -> GroupMetadata:
        """Parsed group metadata."""
        return self._meta

    @property
    def zarr_format(self) -> int:
        """2 or 3."""
        return int(self._meta.zarr_format)

    @property
    def attrs(self) -> dict[str, Any]:
        """Group attributes (a copy)."""
        return self._meta.attrs

    def __repr__(self) -> str:
        return f"<zarr3.Group {self._store.url} zarr_format={self.zarr_format}>"

    def _child(self, name: str) -> KvStore:
        validate_key(name)
        return PrefixStore(self._store, name)

    def __getitem__(self, name: str) -> Array | Group:
        kv = self._child(name)
        try:
            meta = load_metadata(kv, self.zarr_format)
        except ArrayNotFoundError:
            raise KeyError(name) from None
        if isinstance(meta, (ArrayMetadataV3, ArrayMetadataV2)):
            return Array(kv, meta, mode=self._mode)
        return Group(kv, meta, mode=self._mode)

    def __contains__(self, name: str) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def keys(self) -> list[str]:
        """Sorted names of the direct children that are arrays or groups (like zarr-python)."""
        dirs, _ = self._store.list_dir("")
        names = []
        keys = ("zarr.json",) if self.zarr_format == 3 else (".zarray", ".zgroup")
        for d in sorted(dirs):
            if any(self._store.get(f"{d}/{k}", (0, 0)) is not None for k in keys):
                names.append(d)
        return names

    def __iter__(self) -> Iterator[str]:
        """Iterate over member names, as zarr-python groups do."""
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def members(self) -> tuple[tuple[str, Array | Group], ...]:
        """``(name, node)`` pairs of the direct children, as zarr-python's ``Group.members()``."""
        return tuple((name, self[name]) for name in self.keys())

    def arrays(self) -> Iterator[tuple[str, Array]]:
        """``(name, array)`` pairs of the child arrays."""
        return ((n, a) for n, a in self.members() if isinstance(a, Array))

    def groups(self) -> Iterator[tuple[str, Group]]:
        """``(name, group)`` pairs of the child groups."""
        return ((n, g) for n, g in self.members() if isinstance(g, Group))

    def array_keys(self) -> list[str]:
        """Names of the child arrays."""
        return [n for n, _ in self.arrays()]

    def group_keys(self) -> list[str]:
        """Names of the child groups."""
        return [n for n, _ in self.groups()]

    def create_array(self, name: str, **kwargs: Any) -> Array:
        """Create an array below this group (arguments as for :func:`zarr3.create`)."""
        if self._mode == "r":
            raise ReadOnlyError(f"{self._store.url} was opened read-only")
        kwargs.setdefault("zarr_format", self.zarr_format)
        return create(self._child(name), **kwargs)

    def create_group(self, name: str, *, attributes: Mapping[str, Any] | None = None) -> Group:
        """Create a child group."""
        if self._mode == "r":
            raise ReadOnlyError(f"{self._store.url} was opened read-only")
        return create_group(self._child(name), attributes=attributes, zarr_format=self.zarr_format)


def open_group(
    store: Any,
    path: str = "",
    *,
    mode: str = "r",
    zarr_format: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Group:
    """Open an existing group (v3 ``zarr.json`` or v2 ``.zgroup``)."""
    kv = resolve_store(store, path, mode=mode, storage_options=storage_options)
    meta = load_metadata(kv, zarr_format)
    if not isinstance(meta, (GroupMetadataV3, GroupMetadataV2)):
        raise MetadataError("node_type", "array", f"{kv.url} is an array; use zarr3.open()")
    return Group(kv, meta, mode=mode)


def create_group(
    store: Any,
    path: str = "",
    *,
    attributes: Mapping[str, Any] | None = None,
    zarr_format: int = 3,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Group:
    """Create a group and return it open for writing."""
    kv = resolve_store(store, path, mode="w", storage_options=storage_options)
    if any(v is not None for v in kv.get_many(["zarr.json", ".zarray", ".zgroup"])) and not overwrite:
        raise NodeExistsError(f"an array or group already exists at {kv.url}")
    attrs = dict(attributes) if attributes else None
    meta: GroupMetadata
    if zarr_format == 3:
        meta = GroupMetadataV3(attrs)
        kv.set("zarr.json", meta.to_bytes())
    elif zarr_format == 2:
        meta = GroupMetadataV2(attrs)
        kv.set(".zgroup", meta.to_bytes())
        data = meta.attrs_bytes()
        if data is not None:
            kv.set(".zattrs", data)
    else:
        raise ValueError(f"zarr_format must be 2 or 3, not {zarr_format!r}")
    return Group(kv, meta, mode="a")
