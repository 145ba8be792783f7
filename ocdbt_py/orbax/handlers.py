"""``ocp.handlers``: what each kind of item is and how it maps onto the native API.

A handler turns its save arguments into what :func:`ocdbt_py.checkpoint.save` writes (a tree,
or a :class:`~ocdbt_py.checkpoint.JsonItem`, plus save options) and its restore arguments into
a native restore target.  :class:`CompositeCheckpointHandler` holds one handler per item.
Handlers are used through a checkpointer or the manager; their own ``save``/``restore``
methods work on a directory too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import shutil
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import STEP_METADATA, TMP_SUFFIX
from ocdbt_py.checkpoint.layout import step_metadata as read_step_doc
from ocdbt_py.checkpoint.meta import metadata
from ocdbt_py.checkpoint.pytree import flatten_with_names
from ocdbt_py.checkpoint.restore.api import resolve, restore
from ocdbt_py.checkpoint.saving import async_save
from ocdbt_py.checkpoint.saving.api import FilesItem, JsonItem, SaveHandle, save
from ocdbt_py.checkpoint.saving.layout_writer import (
    ARRAY_HANDLER,
    JSON_HANDLER,
    PYTREE_HANDLER,
    STANDARD_HANDLER,
    checkpoint_metadata,
    json_item,
)
from ocdbt_py.errors import NotFoundError, UnsupportedError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.orbax import args as args_lib
from ocdbt_py.orbax import type_handlers
from ocdbt_py.orbax._convert import (
    PLACEHOLDER,
    apply_reshapes,
    apply_save_args,
    jax_sharding,
    put_placeholders,
    restore_target,
    strip_placeholders,
)
from ocdbt_py.orbax._foreign import refuse_orbax_object
from ocdbt_py.orbax._saved_shardings import saved_sharding_target, settled_target
from ocdbt_py.orbax.checkpoint_utils import construct_restore_args
from ocdbt_py.orbax.metadata import StepMetadata
from ocdbt_py.orbax.metadata_tree import TreeMetadata, read_tree_metadata
from ocdbt_py.orbax.metadata_value import Metadata
from ocdbt_py.orbax.path import atomicity
from ocdbt_py.orbax.registry import (
    CheckpointHandlerRegistry,
    DefaultCheckpointHandlerRegistry,
    create_default_handler_registry,
)
from ocdbt_py.orbax.step_statistics import from_stored
from ocdbt_py.orbax.transform_utils import apply_transformations
from ocdbt_py.orbax.type_handlers import RestoreArgs
from ocdbt_py.orbax.utils import is_primary_host, is_scalar

__all__ = [
    "CheckpointHandlerRegistry",
    "DefaultCheckpointHandlerRegistry",
    "create_default_handler_registry",
    "CheckpointHandler",
    "AsyncCheckpointHandler",
    "StandardCheckpointHandler",
    "PyTreeCheckpointHandler",
    "JsonCheckpointHandler",
    "ArrayCheckpointHandler",
    "CompositeCheckpointHandler",
    "StandardSaveArgs",
    "StandardRestoreArgs",
    "PyTreeSaveArgs",
    "PyTreeRestoreArgs",
    "JsonSaveArgs",
    "JsonRestoreArgs",
    "ArraySaveArgs",
    "ArrayRestoreArgs",
    "CompositeArgs",
    "CompositeResults",
]

Location = str | os.PathLike[str] | KvStore

StandardSaveArgs = args_lib.StandardSave
StandardRestoreArgs = args_lib.StandardRestore
PyTreeSaveArgs = args_lib.PyTreeSave
PyTreeRestoreArgs = args_lib.PyTreeRestore
JsonSaveArgs = args_lib.JsonSave
JsonRestoreArgs = args_lib.JsonRestore
ArraySaveArgs = args_lib.ArraySave
ArrayRestoreArgs = args_lib.ArrayRestore  # as Orbax's ``handlers``: not ``type_handlers.ArrayRestoreArgs``
CompositeArgs = args_lib.Composite
CompositeResults = args_lib.Composite


class NativeItem:
    """One item as the native save takes it: ``value`` (tree or JsonItem) and options."""

    def __init__(self, value: Any, kind: str | None = None, options: Mapping[str, Any] | None = None,
                 chunk_sizes: Mapping[str, int] | None = None):
        self.value = value
        self.kind = kind  # "standard" / "pytree" / None for JSON
        self.options = dict(options or {})
        self.chunk_sizes = dict(chunk_sizes or {})


def _local_dir(location: Location, item: str | None) -> pathlib.Path:
    """The local directory of ``location`` (and of its item ``item``)."""
    if isinstance(location, KvStore):
        path = location.local_path(item or "")
        if path is None:
            raise UnsupportedError(f"a custom handler's item needs a local directory, not {location.url}")
        return pathlib.Path(path)
    base = os.fspath(location)
    if "://" in base and not base.startswith("file://"):
        raise UnsupportedError(f"a custom handler's item needs a local directory, not {base}")
    p = pathlib.Path(base.removeprefix("file://"))
    return p / item if item else p


class CheckpointHandler:
    """Base of the handlers: ``save_args``/``restore_args`` are its argument classes.

    A subclass that implements Orbax's handler protocol itself -- ``save(directory, args)``
    (or ``async_save``) writing files into an item directory, ``restore(directory, args)``
    reading them, optionally ``metadata(directory)`` -- is a *custom* handler: the manager
    and ``CompositeCheckpointHandler`` call it with the item's directory inside the step
    (local directories only), as Orbax does.  Register its argument classes with
    ``ocp.args.register_with_handler``.
    """

    save_args: type[args_lib.CheckpointArgs] = args_lib.CheckpointArgs
    restore_args: type[args_lib.CheckpointArgs] = args_lib.CheckpointArgs
    _builtin = False

    _typestr: str | None = None

    @classmethod
    def typestr(cls) -> str:
        """The handler's type name, as recorded in ``_CHECKPOINT_METADATA`` (Orbax's name for
        the built-in handlers, whose checkpoints are Orbax's)."""
        own = cls.__dict__.get("_typestr")
        return own if own is not None else f"{cls.__module__}.{cls.__qualname__}"

    def _custom(self) -> bool:
        return type(self) is not CheckpointHandler and not self._builtin

    def _overrides(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(CheckpointHandler, name)

    def _write_custom(self, directory: pathlib.Path, args: Any) -> None:
        """Run the custom handler's own save into ``directory``."""
        if self._overrides("save"):
            self.save(directory, args=args)
        elif self._overrides("async_save"):
            async def run() -> Any:
                return await self.async_save(directory, args=args)

            for f in asyncio.run(run()) or []:
                f.result()
        else:
            raise NotImplementedError(f"{type(self).__name__} implements neither save nor async_save")

    def to_native(self, args: args_lib.CheckpointArgs) -> NativeItem:
        """The native form of ``args`` (a save argument of this handler)."""
        if not self._custom():
            raise NotImplementedError
        return NativeItem(FilesItem(lambda d: self._write_custom(pathlib.Path(d), args), handler=self.typestr()))

    async def async_save(self, directory: Location, args: args_lib.CheckpointArgs | None = None) -> list[Any] | None:
        """Orbax's asynchronous save: start writing ``args`` into ``directory`` and return the
        futures to wait on (``result(timeout)``) before the checkpoint is finalized.

        A built-in handler makes its host copies, then writes in the background (one future);
        a custom handler that only implements ``save`` runs it and returns no futures
        (asynchronous custom handlers override this)."""
        if args is None:
            raise ValueError("nothing to save: pass args=")
        if self._custom():
            if not self._overrides("save"):
                raise NotImplementedError(f"{type(self).__name__} implements neither save nor async_save")
            self.save(directory, args=args)
            return []
        return [_HandleFuture(self.start_save(directory, args, force=True, custom_metadata=None, blocking=False))]

    def restore_from(self, location: Location, args: args_lib.CheckpointArgs | None, item: str | None = None) -> Any:
        """Restore the item at ``location`` (a step directory when ``item`` names one of its items)."""
        if self._custom() and self._overrides("restore"):
            return self.restore(_local_dir(location, item), args=args)
        return restore(location, None, item=item)

    def start_save(self, directory: Location, args: args_lib.CheckpointArgs, *, force: bool,
                   custom_metadata: dict[str, Any] | None, blocking: bool) -> SaveHandle:
        """Start writing ``args`` as the checkpoint at ``directory`` (one item)."""
        if self._custom():
            path = _local_dir(directory, None)

            def work() -> None:
                if force and path.exists():
                    shutil.rmtree(path)
                path.mkdir(parents=True, exist_ok=True)
                init = time.time_ns()
                self._write_custom(path, args)
                (path / STEP_METADATA).write_bytes(checkpoint_metadata(self.typestr(), init_ns=init,
                                                                       commit_ns=time.time_ns(),
                                                                       custom_metadata=custom_metadata))

            return async_save.start(str(path), work, blocking=True, started=time.perf_counter())
        native = self.to_native(args)
        options = dict(native.options)
        options["handler"] = native.kind
        if native.chunk_sizes:
            options["leaf_chunk_byte_sizes"] = native.chunk_sizes
        return save(directory, native.value, force=force, custom_metadata=custom_metadata, blocking=blocking,
                    **options)

    def save(self, directory: Location, args: args_lib.CheckpointArgs) -> None:
        """Write ``args`` to ``directory`` (replacing it), blocking."""
        self.start_save(directory, args, force=True, custom_metadata=None, blocking=True)

    def restore(self, directory: Location, args: args_lib.CheckpointArgs | None = None) -> Any:
        """Restore what ``directory`` holds."""
        return self.restore_from(directory, args)

    def metadata(self, directory: Location) -> Any:
        """The stored tree's :class:`~ocdbt_py.orbax.metadata.TreeMetadata` (shapes, dtypes,
        shardings), reading no array data; ``None`` for handlers that keep no metadata."""
        if not self._builtin:
            return None
        return read_tree_metadata(directory)

    def item_metadata(self, location: Location, item: str | None) -> Any:
        """An item's metadata: a custom handler's own ``metadata`` (``None`` without one)."""
        if self._custom():
            return self.metadata(_local_dir(location, item)) if self._overrides("metadata") else None
        if not self._builtin:
            return None
        return read_tree_metadata(location, item)

    def finalize(self, directory: Location) -> None:
        """Nothing to do: the native save commits atomically."""

    def close(self) -> None:
        """Nothing to release."""


AsyncCheckpointHandler = CheckpointHandler


class PyTreeCheckpointHandler(CheckpointHandler):
    """Trees of arrays, scalars and strings (``PyTreeSave``/``PyTreeRestore``)."""

    save_args: type[args_lib.CheckpointArgs] = args_lib.PyTreeSave
    restore_args: type[args_lib.CheckpointArgs] = args_lib.PyTreeRestore
    kind = "pytree"
    _builtin = True
    _typestr = PYTREE_HANDLER

    def __init__(self, aggregate_filename: str | None = None, *, use_ocdbt: bool = True, use_zarr3: bool = False,
                 use_compression: bool = True, **ignored: Any):
        self.use_ocdbt = bool(use_ocdbt)
        self.use_zarr3 = bool(use_zarr3)
        self.use_compression = bool(use_compression)

    def to_native(self, args: args_lib.CheckpointArgs) -> NativeItem:
        """The item (cast per ``save_args``), chunk sizes and Zarr options."""
        if not isinstance(args, (args_lib.PyTreeSave, args_lib.StandardSave)):
            raise TypeError(f"{type(self).__name__} saves {self.save_args.__name__}, not {type(args).__name__}")
        tree, sizes = apply_save_args(args.item, args.save_args)
        opts: dict[str, Any] = {"use_zarr3": self.use_zarr3, "use_ocdbt": self.use_ocdbt,
                                "use_compression": self.use_compression}
        target = getattr(args, "ocdbt_target_data_file_size", None)
        if target is not None:
            opts["ocdbt_target_data_file_size"] = target
        if args.custom_metadata is not None:
            opts["pytree_custom_metadata"] = args.custom_metadata
        return NativeItem(tree, self.kind, opts, sizes)

    def _restore_transformed(self, location: Location, args: Any, item: str | None) -> Any:
        """``PyTreeRestore(transforms={...})``: the original tree, transformed into ``args.item``'s."""
        return _restore_transformed_impl(location, args, item)

    def restore_from(self, location: Location, args: args_lib.CheckpointArgs | None, item: str | None = None) -> Any:
        """Restore with ``args.item`` / ``args.restore_args`` as the target."""
        fallback = args.fallback_sharding if isinstance(args, args_lib.StandardRestore) else None
        if args is None or (getattr(args, "item", None) is None and getattr(args, "restore_args", None) is None):
            # as Orbax: arrays saved from JAX come back on their saved shardings (JAX loaded)
            return restore(location, saved_sharding_target(location, item, fallback=fallback), item=item)
        if isinstance(args, args_lib.PyTreeRestore) and args.restore_args is None and _all_restore_args(args.item):
            # PyTreeRestore(tree of RestoreArgs) positionally: Orbax takes it as the restore arguments
            args = dataclasses.replace(args, item=None, restore_args=args.item)
        if isinstance(args, args_lib.PyTreeRestore) and args.item is not None and _has_metadata(args.item):
            # the checkpoint's own metadata as the target (Orbax's documented use): restored as
            # construct_restore_args of it says (arrays saved from JAX onto their saved shardings)
            tree = args.item.tree if isinstance(args.item, TreeMetadata) else args.item
            ra = args.restore_args if args.restore_args is not None else construct_restore_args(tree)
            args = dataclasses.replace(args, item=None, restore_args=ra.tree if isinstance(ra, TreeMetadata) else ra)
        reshapes: dict[tuple[str, ...], Any] = {}  # strict=False leaves restored at another shape
        cache: dict[str, Any] = {}

        def stored(names: tuple[str, ...]) -> Any:
            if "tree" not in cache:
                cache["tree"] = metadata(location, item=item)
            node = cache["tree"]
            for n in names:
                node = node[int(n)] if isinstance(node, (list, tuple)) else node[n]
            return node

        if isinstance(args, args_lib.PyTreeRestore):
            if args.legacy_transform_fn is not None:
                raise UnsupportedError("PyTreeRestore(legacy_transform_fn=...) is not supported; use transforms=")
            if args.transforms:
                return self._restore_transformed(location, args, item)
            if args.transforms is not None and not args.partial_restore:
                # transforms={}: the item's keys, taken from the checkpoint (the others left out)
                args = dataclasses.replace(args, partial_restore=True)
            target = restore_target(args.item, args.restore_args, stored, reshapes)
        elif isinstance(args, args_lib.StandardRestore):
            _check_standard_item(args.item, restoring=True)
            target = args.item
            if not args.strict and target is not None:
                target = restore_target(target, _standard_restore_args(target), stored, reshapes)
        else:
            raise TypeError(f"{type(self).__name__} restores {self.restore_args.__name__}, not {type(args).__name__}")
        given = getattr(args, "item", None)
        nones = _none_paths(given)  # as Orbax: a None item leaf is not read, and comes back None
        target = _as_placeholders(target, nones)
        if target is not None:  # as Orbax: the tree checked, abstract leaves without sharding on the saved ones
            partial = bool(getattr(args, "partial_restore", False))
            target = settled_target(location, item, target, partial=partial, present=lambda x: x is PLACEHOLDER,
                                    fallback=fallback)
        target, holes = strip_placeholders(target)
        if isinstance(target, dict) and not target and holes:
            restored: Any = {}  # every leaf a placeholder: nothing to read
        else:
            restored = apply_reshapes(restore(location, target, item=item), reshapes)
        return _put_nones(put_placeholders(restored, holes), nones, given)


def _place(value: Any, a: Any) -> Any:
    """``value`` cast and placed as its restore argument says (``ArrayRestoreArgs``: a
    ``jax.Array`` on its sharding)."""
    if isinstance(a, RestoreArgs) and a.dtype is not None and hasattr(value, "astype"):
        value = value.astype(a.dtype)
    if isinstance(a, type_handlers.ArrayRestoreArgs):
        import jax  # ArrayRestoreArgs name JAX shardings: JAX is loaded already

        sharding = jax_sharding(a.sharding)
        if sharding is None and a.mesh is not None:
            sharding = jax.sharding.NamedSharding(a.mesh, a.mesh_axes)
        return jax.device_put(value, sharding) if sharding is not None else jax.numpy.asarray(value)
    return value


def _has_metadata(tree: Any) -> bool:
    """Whether ``tree`` is a ``TreeMetadata`` or holds ``ocp.metadata.value`` leaves."""
    if isinstance(tree, TreeMetadata):
        return True
    flat, _ = flatten_with_names(tree, is_leaf=lambda x: isinstance(x, Metadata))
    return any(isinstance(v, Metadata) for _, v in flat)


def _all_restore_args(tree: Any) -> bool:
    """Whether ``tree`` is a non-empty tree whose every leaf is a ``RestoreArgs``."""
    if tree is None:
        return False
    flat, _ = flatten_with_names(tree, is_leaf=lambda x: isinstance(x, RestoreArgs))
    return bool(flat) and all(isinstance(v, RestoreArgs) for _, v in flat)


def _restore_transformed_impl(location: Location, args: Any, item: str | None) -> Any:
    original = restore(location, saved_sharding_target(location, item), item=item)
    new = apply_transformations(original, args.transforms, args.item,
                                default_to_original=args.transforms_default_to_original)
    if args.restore_args is None:
        return new
    flat, rebuild = flatten_with_names(new)
    by_name = dict(flatten_with_names(args.restore_args, is_leaf=lambda x: isinstance(x, RestoreArgs))[0])
    return rebuild([_place(v, by_name.get(n)) for n, v in flat])


class StandardCheckpointHandler(PyTreeCheckpointHandler):
    """Trees of arrays and scalars (``StandardSave``/``StandardRestore``)."""

    save_args = args_lib.StandardSave
    restore_args = args_lib.StandardRestore
    kind = "standard"
    _typestr = STANDARD_HANDLER

    def __init__(self, *, use_ocdbt: bool = True, **ignored: Any):
        super().__init__(use_ocdbt=use_ocdbt)

    def to_native(self, args: args_lib.CheckpointArgs) -> NativeItem:
        """The item (cast per ``save_args``) and chunk sizes."""
        if not isinstance(args, args_lib.StandardSave):
            raise TypeError(f"StandardCheckpointHandler saves StandardSave, not {type(args).__name__}")
        _check_standard_item(args.item)
        flat, rebuild = flatten_with_names(args.item)
        if any(_array_like_scalar(v) for _, v in flat):
            # as Orbax's StandardSave: array-likes (NumPy scalars) are saved as 0-d arrays
            item = rebuild([np.asarray(v) if _array_like_scalar(v) else v for _, v in flat])
            args = dataclasses.replace(args, item=item)
        return super().to_native(args)


def _array_like_scalar(x: Any) -> bool:
    return isinstance(x, np.generic) and hasattr(x, "__array__")


def _is_empty_node(x: Any) -> bool:
    return x is None or (isinstance(x, (dict, list, tuple)) and not x)


def _standard_leaf(x: Any, *, restoring: bool) -> bool:
    """Whether ``x`` is a leaf Orbax's ``StandardCheckpointHandler`` takes: ``int``,
    ``float``, ``np.ndarray``, ``jax.Array`` (saving: anything NumPy turns into an array),
    and restoring also ``jax.ShapeDtypeStruct``."""
    if isinstance(x, (int, float, np.ndarray)):
        return True
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        return True
    if restoring:
        return jax is not None and isinstance(x, jax.ShapeDtypeStruct)
    return hasattr(x, "__array__") and not isinstance(x, (str, bytes))


def _check_standard_item(item: Any, *, restoring: bool = False) -> None:
    """Orbax's checks of a ``StandardSave``/``StandardRestore`` item: a tree (not one array or
    number) of the supported leaf types; ``ValueError("Unsupported type: ...")`` otherwise."""
    if not restoring:
        if item is None:
            raise ValueError("Must provide item to save.")
        jax = sys.modules.get("jax")
        if isinstance(item, (int, float, complex, np.number)) or (jax is not None and isinstance(item, jax.Array)):
            raise ValueError("StandardCheckpointHandler / StandardSave does not support single arrays or scalars. "
                             "Use ArrayCheckpointHandler / ArraySave")
    for names, x in flatten_with_names(item)[0]:
        if not _is_empty_node(x) and not _standard_leaf(x, restoring=restoring):
            raise ValueError(f"Unsupported type: {type(x)} for key: {tuple(names)}.")


def _standard_restore_args(item: Any) -> Any:
    """``StandardRestore(item, strict=False)`` as Orbax runs it: array leaves that name a
    sharding get ``ArrayRestoreArgs(strict=False)`` (read at the stored shape, then padded or
    truncated); the others keep the item's own leaf."""
    jax = sys.modules.get("jax")
    flat, rebuild = flatten_with_names(item)
    out = []
    for _, x in flat:
        sharding = getattr(x, "sharding", None) if jax is not None and isinstance(
            x, (jax.Array, jax.ShapeDtypeStruct)) else None
        out.append(type_handlers.ArrayRestoreArgs(sharding=sharding, global_shape=tuple(x.shape), dtype=x.dtype,
                                                  strict=False) if sharding is not None else None)
    return rebuild(out)


def _none_paths(tree: Any) -> list[tuple[Any, ...]]:
    """The paths of ``None`` entries of the dicts of a restore item (Orbax gives ``None``
    back for them, reading nothing)."""
    paths: list[tuple[Any, ...]] = []

    def walk(x: Any, path: tuple[Any, ...]) -> None:
        if type(x) is dict:
            for k, v in x.items():
                if v is None:
                    paths.append(path + (k,))
                else:
                    walk(v, path + (k,))

    walk(tree, ())
    return paths


def _as_placeholders(tree: Any, paths: list[tuple[Any, ...]]) -> Any:
    """``tree`` (a restore target) with ``PLACEHOLDER`` at ``paths`` (dict entries; copied)."""
    if not paths:
        return tree

    def walk(x: Any, path: tuple[Any, ...]) -> Any:
        if type(x) is not dict:
            return x
        return {k: PLACEHOLDER if path + (k,) in wanted else walk(v, path + (k,)) for k, v in x.items()}

    wanted = set(paths)
    return walk(tree, ())


def _put_nones(tree: Any, paths: list[tuple[Any, ...]], target: Any) -> Any:
    """``tree`` with ``None`` at ``paths``, each dict's keys in ``target``'s order."""
    for path in paths:
        node, like = tree, target
        for k in path[:-1]:
            node, like = node[k], like[k]
        node[path[-1]] = None
        if isinstance(node, dict) and isinstance(like, dict):
            order = [k for k in like if k in node] + [k for k in node if k not in like]
            items = [(k, node[k]) for k in order]
            node.clear()
            node.update(items)
    return tree


class JsonCheckpointHandler(CheckpointHandler):
    """A JSON object in the file ``filename`` (default ``metadata``) of the item directory.

    Alone, ``save(directory, args=JsonSave(obj))`` writes that one file into ``directory``
    (as Orbax's handler does; a ``Checkpointer`` adds ``_CHECKPOINT_METADATA``), and
    ``restore(directory)`` reads it back; in a composite checkpoint it is one item.
    """

    save_args = args_lib.JsonSave
    restore_args = args_lib.JsonRestore
    _builtin = True
    _typestr = JSON_HANDLER

    def __init__(self, filename: str | None = None, primary_host: int | None = 0, **ignored: Any):
        self.filename = filename or "metadata"
        self._primary_host = primary_host

    def _item(self, args: Any, kwargs: dict[str, Any]) -> Any:
        if isinstance(args, args_lib.JsonSave):
            return args.item
        if "item" in kwargs:
            return kwargs["item"]
        raise TypeError(f"JsonCheckpointHandler saves JsonSave, not {type(args).__name__}")

    def _write(self, directory: Location, item: Any, step_metadata: bool = False) -> None:
        if not is_primary_host(self._primary_host):
            return
        kv = open_kvstore(directory)
        kv.set(self.filename, json_item(item))
        if step_metadata:
            now = time.time_ns()
            kv.set(STEP_METADATA, checkpoint_metadata(None, init_ns=now, commit_ns=now))

    async def _save_fn(self, x: Any, directory: Location) -> None:
        """Write ``x`` (what :meth:`async_save`'s future runs)."""
        self._write(directory, x)

    def save(self, directory: Location, args: args_lib.CheckpointArgs | None = None, **kwargs: Any) -> None:
        """Write the JSON file into ``directory`` (created if missing), blocking."""
        self._write(directory, self._item(args, kwargs))

    async def async_save(self, directory: Location, args: args_lib.CheckpointArgs | None = None,
                         **kwargs: Any) -> list[Any]:
        """Start writing the JSON file in the background; one future to wait on."""
        item = self._item(args, kwargs)
        handle = async_save.start(os.fspath(directory) if not isinstance(directory, KvStore) else directory.url,
                                  lambda: asyncio.run(self._save_fn(item, directory)), blocking=False,
                                  started=time.perf_counter())
        return [_HandleFuture(handle)]

    def start_save(self, directory: Location, args: args_lib.CheckpointArgs, *, force: bool,
                   custom_metadata: dict[str, Any] | None, blocking: bool) -> SaveHandle:
        """A checkpoint directory holding the JSON file (what a ``Checkpointer`` saves)."""
        item = self._item(args, {})
        target = os.fspath(directory) if not isinstance(directory, KvStore) else directory.url
        return async_save.start(target, lambda: self._write(directory, item, step_metadata=True), blocking=True,
                                started=time.perf_counter())

    def restore_from(self, location: Location, args: args_lib.CheckpointArgs | None, item: str | None = None) -> Any:
        """The JSON object (``FileNotFoundError`` when the file is not there)."""
        if item is not None:
            return restore(location, None, item=item)
        kv = open_kvstore(location, read_only=True)
        doc = read_json(kv, self.filename)
        if doc is None:
            raise FileNotFoundError(f"{kv.url.rstrip('/')}/{self.filename} does not exist.")
        return doc

    def metadata(self, directory: Location) -> Any:
        """``None``: Orbax's JSON handler keeps no metadata."""
        return None

    def item_metadata(self, location: Location, item: str | None) -> Any:
        """``None``, as :meth:`metadata`."""
        return None

    def to_native(self, args: args_lib.CheckpointArgs) -> NativeItem:
        """A :class:`JsonItem`."""
        if not isinstance(args, args_lib.JsonSave):
            raise TypeError(f"JsonCheckpointHandler saves JsonSave, not {type(args).__name__}")
        return NativeItem(JsonItem(args.item, filename=self.filename))


class ArrayCheckpointHandler(CheckpointHandler):
    """One array or scalar (``ArraySave``/``ArrayRestore``), stored as Orbax stores it: a
    one-leaf tree ``{checkpoint_name: value}`` without OCDBT."""

    save_args = args_lib.ArraySave
    restore_args = args_lib.ArrayRestore
    _builtin = True
    _typestr = ARRAY_HANDLER

    def __init__(self, checkpoint_name: str | None = None):
        self.checkpoint_name = checkpoint_name or "checkpoint"

    def to_native(self, args: args_lib.CheckpointArgs) -> NativeItem:
        """``{checkpoint_name: item}`` (cast per ``save_args``), without OCDBT."""
        if not isinstance(args, args_lib.ArraySave):
            raise TypeError(f"ArrayCheckpointHandler saves ArraySave, not {type(args).__name__}")
        item = args.item
        if not (hasattr(item, "shape") and hasattr(item, "dtype")) and not is_scalar(item):
            raise TypeError(f"Unsupported type: {type(item)}.")
        name = self.checkpoint_name
        save_args = None if args.save_args is None else {name: args.save_args}
        tree, sizes = apply_save_args({name: item}, save_args)
        return NativeItem(tree, "array", {"use_ocdbt": False}, sizes)

    def restore_from(self, location: Location, args: args_lib.CheckpointArgs | None, item: str | None = None) -> Any:
        """The array (placed and typed as ``args.restore_args`` says)."""
        restore_args = getattr(args, "restore_args", None)
        if args is not None and not isinstance(args, args_lib.ArrayRestore):
            raise TypeError(f"ArrayCheckpointHandler restores ArrayRestore, not {type(args).__name__}")
        name = self.checkpoint_name
        got = restore(location, saved_sharding_target(location, item) if restore_args is None else None, item=item)
        # the native restore gives an ArrayCheckpointHandler item's one leaf already
        if isinstance(got, dict) and set(got) == {name}:
            got = got[name]
        return got if restore_args is None else _place(got, restore_args)

    def item_metadata(self, location: Location, item: str | None) -> Any:
        """``None``: Orbax's array handler keeps no metadata of its own."""
        return None

    def metadata(self, directory: Location) -> Any:
        """``None``, as Orbax's."""
        return None


def _exists(location: Location) -> bool:
    """Whether a local directory exists (object-store prefixes always "exist")."""
    if isinstance(location, KvStore):
        p = location.local_path("")
        return p is None or os.path.isdir(p)
    base = os.fspath(location)
    if "://" in base and not base.startswith("file://"):
        return True
    return os.path.isdir(base.removeprefix("file://"))


def _local_path(location: Location) -> pathlib.Path | None:
    """``location`` as a local directory, or ``None`` (URLs, stores)."""
    if isinstance(location, KvStore):
        p = location.local_path("")
        return pathlib.Path(p) if p is not None else None
    text = os.fspath(location)
    if "://" in text and not text.startswith("file://"):
        return None
    return pathlib.Path(text.removeprefix("file://"))


def _record_duration(event: str, seconds: float) -> None:
    """Report a duration to ``jax.monitoring`` (as Orbax does) when JAX is loaded."""
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "monitoring"):
        jax.monitoring.record_event_duration_secs(event, seconds)


def _item_dirs(r: Any) -> list[str]:
    """The item directories of a step (every subdirectory, as Orbax lists them; temporary
    and bookkeeping directories left out)."""
    return [d for d in r.listing.dirs if d != "metrics" and TMP_SUFFIX not in d and not d.startswith(".")]


class _HandleFuture:
    """A background save as Orbax's futures look: ``result(timeout)`` waits and re-raises
    (``TimeoutError`` past ``timeout``); ``done()`` says whether it finished."""

    def __init__(self, handle: SaveHandle):
        self._handle = handle

    def result(self, timeout: float | None = None) -> None:
        """Wait for the save."""
        self._handle.wait(timeout)

    def done(self) -> bool:
        """Whether the save has finished."""
        return self._handle.done()


def _register_builtin() -> None:
    """Orbax's registrations of its own argument classes."""
    for handler, save_cls, restore_cls in ((StandardCheckpointHandler, args_lib.StandardSave, args_lib.StandardRestore),
                                           (PyTreeCheckpointHandler, args_lib.PyTreeSave, args_lib.PyTreeRestore),
                                           (JsonCheckpointHandler, args_lib.JsonSave, args_lib.JsonRestore),
                                           (ArrayCheckpointHandler, args_lib.ArraySave, args_lib.ArrayRestore)):
        args_lib.register_with_handler(handler, for_save=True)(save_cls)
        args_lib.register_with_handler(handler, for_restore=True)(restore_cls)


_register_builtin()


def builtin_handler_class(typestr: str | None) -> type[CheckpointHandler] | None:
    """The built-in handler class a recorded handler type names (Orbax's type strings, also
    those of older Orbax module paths), or ``None``."""
    if not isinstance(typestr, str):
        return None
    classes: tuple[type[CheckpointHandler], ...] = (StandardCheckpointHandler, PyTreeCheckpointHandler,
                                                    JsonCheckpointHandler)
    for cls in classes:
        if typestr == cls.typestr():
            return cls
    if typestr.startswith("orbax.checkpoint."):
        tail = typestr.rsplit(".", 1)[-1]
        for cls in classes:
            if tail == cls.__name__:
                return cls
    return None


def handler_for_args(a: Any) -> CheckpointHandler:
    """A new handler of the class registered for an argument (for items without a handler)."""
    try:
        cls = args_lib.get_registered_handler_cls(a)
    except ValueError:
        raise UnsupportedError(f"ocdbt_py.orbax has no handler for {type(a).__name__} (register one with "
                               "ocp.args.register_with_handler)") from None
    handler: CheckpointHandler = cls()
    return handler


class CompositeCheckpointHandler(CheckpointHandler):
    """Several named items in one step directory (``Composite`` arguments)."""

    save_args = args_lib.Composite
    restore_args = args_lib.Composite
    _builtin = True

    def __init__(self, *item_names: str, composite_options: Any = None, handler_registry: Any = None,
                 **items_and_handlers: CheckpointHandler):
        for name, h in items_and_handlers.items():
            refuse_orbax_object(h, f"the handler of item {name!r}")
        if handler_registry is not None:
            refuse_orbax_object(handler_registry, "handler_registry")
            if item_names or items_and_handlers:
                raise ValueError("Both `handler_registry` and `item_names`/`items_and_handlers` were provided; "
                                 "give one of them.")
        self.registry = handler_registry
        self.handlers: dict[str, CheckpointHandler | None] = {n: None for n in item_names}
        self.handlers.update(items_and_handlers)
        self._fixed = bool(item_names)  # items named up front: no others may be saved
        # items a bare save wrote into temporary directories, made final by finalize()
        self._pending: dict[str, atomicity.TemporaryPath] = {}

    def handler(self, name: str, a: Any, *, explicit: bool = False) -> CheckpointHandler:
        """The handler of item ``name`` (registered, or inferred from its argument ``a``); a
        ``ValueError`` when ``a`` is not an argument of the item's handler, or names an item
        the handler was not configured with."""
        h = self.handlers.get(name)
        if h is None and self.registry is not None:
            h = self._from_registry(name, a)
        if h is None:
            if a is None:
                if explicit:
                    raise ValueError(f'Provided `None` for `CheckpointArgs`, and the `CheckpointHandler` for item '
                                     f'"{name}" was not configured.')
                return CheckpointHandler()
            if self._fixed and name not in self.handlers:
                raise ValueError(f"Provided `CheckpointArgs` of type {type(a).__name__} for item {name!r}, which does "
                                 f"not match with any registered handler (items: {sorted(self.handlers)}).")
            h = handler_for_args(a)
            self.handlers[name] = h
        elif a is not None and not args_lib.args_fit_handler(a, h):
            raise ValueError(f"Provided `CheckpointArgs` of type {type(a).__name__} for item {name!r} does not match "
                             f"with any registered handler ({type(h).__name__} takes "
                             f"{[c.__name__ for c in args_lib.registered_args_of(h)]}).")
        return h

    def _from_registry(self, name: str, a: Any) -> CheckpointHandler | None:
        """The registry's handler for item ``name`` and argument ``a`` (by name, then for any
        item), remembered for the item."""
        reg = self.registry
        h = None
        if a is None:
            h = reg.handler_of_item(name) if hasattr(reg, "handler_of_item") else None
        elif reg.has(name, a):
            h = reg.get(name, a)
        elif reg.has(None, a):
            h = reg.get(None, a)
        if h is not None:
            self.handlers[name] = h
        return h

    def save(self, directory: Location, args: args_lib.CheckpointArgs | None = None) -> None:
        """Orbax's handler protocol: each item of ``args`` written by its handler into its own
        temporary directory (``<item>.orbax-checkpoint-tmp``) of the local ``directory``, made
        final by :meth:`finalize`; what the step records (``_CHECKPOINT_METADATA``) is the
        checkpointer's to write.  Other destinations get the whole step in one save."""
        for h in self._start_items(directory, args, blocking=True):
            h.wait()

    async def async_save(self, directory: Location, args: args_lib.CheckpointArgs | None = None) -> list[Any] | None:
        """As :meth:`save`, the items written in the background: one future per item."""
        return [_HandleFuture(h) for h in self._start_items(directory, args, blocking=False)]

    def _start_items(self, directory: Location, args: Any, *, blocking: bool) -> list[SaveHandle]:
        if not isinstance(args, args_lib.Composite):
            raise TypeError(f"a composite save takes ocp.args.Composite, not {type(args).__name__}")
        local = _local_path(directory)
        if local is None:
            return [self.start_save(directory, args, force=True, custom_metadata=None, blocking=blocking)]
        handles = []
        for name, a in args.items():
            if a is None:
                continue
            h = self.handler(name, a)
            tmp = atomicity.AtomicRenameTemporaryPath.from_final(local / name)
            if is_primary_host(0):
                tmp.create()
            self._pending[name] = tmp
            if h._custom():
                h._write_custom(tmp.get(), a)
                continue
            if isinstance(h, JsonCheckpointHandler):
                h.save(tmp.get(), args=a)  # the JSON file alone, as Orbax's handler writes it
                continue
            handles.append(h.start_save(tmp.get(), a, force=True, custom_metadata=None, blocking=blocking))
        return handles

    def finalize(self, directory: Location) -> None:
        """Make each item a save wrote final (its temporary directory renamed), recording each
        item's finalize time as Orbax does (``/jax/orbax/write/background_item_finalize_secs``)."""
        pending, self._pending = self._pending, {}
        for name, tmp in sorted(pending.items()):
            h = self.handlers.get(name)
            started = time.time()
            if h is not None:
                h.finalize(tmp.get())
            if is_primary_host(0):
                tmp.finalize()
            _record_duration("/jax/orbax/write/background_item_finalize_secs", time.time() - started)

    def metadata_from_temporary_paths(self, directory: Location) -> StepMetadata:
        """What a save not yet finalized holds: ``item_handlers`` of the items written into
        temporary directories (``item_metadata`` ``None``); ``FileNotFoundError`` when
        ``directory`` does not exist."""
        if not _exists(directory):
            raise FileNotFoundError(f"Directory does not exist: {directory}")
        handlers = {}
        for name in self._pending:
            h = self.handlers.get(name)
            handlers[name] = h.typestr() if h is not None else None
        return StepMetadata(item_handlers=handlers, item_metadata=None)

    def start_save(self, directory: Location, args: args_lib.CheckpointArgs, *, force: bool,
                   custom_metadata: dict[str, Any] | None, blocking: bool) -> SaveHandle:
        """Start writing a step directory with one directory per item of ``args``."""
        if not isinstance(args, args_lib.Composite):
            raise TypeError(f"a composite save takes ocp.args.Composite, not {type(args).__name__}")
        items, options = self.to_native_items(args)
        return save(directory, items, composite=True, force=force, custom_metadata=custom_metadata,
                    blocking=blocking, **options)

    def to_native_items(self, args: args_lib.Composite) -> tuple[dict[str, Any], dict[str, Any]]:
        """``({item: tree or JsonItem}, save options)`` for a composite save."""
        if not isinstance(args, args_lib.Composite):
            raise TypeError(f"a composite save takes ocp.args.Composite, not {type(args).__name__}")
        items: dict[str, Any] = {}
        kinds: dict[str, str] = {}
        sizes: dict[str, int] = {}
        options: dict[str, Any] = {}
        per_item: dict[str, dict[str, Any]] = {}
        for name, a in args.items():
            if a is None:
                continue
            native = self.handler(name, a).to_native(a)
            items[name] = native.value
            if native.kind is not None:
                kinds[name] = native.kind
            sizes.update({f"{name}/{p}": s for p, s in native.chunk_sizes.items()})
            if native.options:  # each item's own handler options, as Orbax applies them
                per_item[name] = dict(native.options)
        if per_item:
            options["item_options"] = per_item
        if kinds:
            options["handler"] = kinds
        if sizes:
            options["leaf_chunk_byte_sizes"] = sizes
        return items, options

    def restore(self, directory: Location, args: args_lib.CheckpointArgs | None = None) -> args_lib.Composite:
        """The items of the step at ``directory`` named by ``args`` (all without), as a
        ``Composite``."""
        if args is not None and not isinstance(args, args_lib.Composite):
            raise TypeError(f"a composite restore takes ocp.args.Composite, not {type(args).__name__}")
        available = [n for n in resolve(directory).items() if n != "metrics"]
        return self.restore_items(directory, args, available)

    def metadata(self, directory: Location) -> Any:
        """The step's ``StepMetadata``: ``item_handlers`` (as recorded, plus the type of the
        handler of each item found whose handler is known) and ``item_metadata``, a
        ``Composite`` of each item directory's metadata -- ``None`` for items whose handler is
        not known (neither configured nor registered) or that hold nothing it can read, as
        Orbax's.  A missing directory is a ``FileNotFoundError``; items a save wrote but
        :meth:`finalize` did not make final yet are a ``ValueError``."""
        for name, tmp in self._pending.items():
            if tmp.get().exists():
                raise ValueError(f'Item "{name}" was found in the checkpoint, but it is a temporary item. Please call '
                                 "finalize() before metadata().")
        try:
            r = resolve(directory)
        except NotFoundError:
            if not _exists(directory):
                raise FileNotFoundError(f"Directory does not exist: {directory}") from None
            return StepMetadata(item_handlers={}, item_metadata=args_lib.Composite())
        doc = read_step_doc(r.kv) or {}
        recorded = doc.get("item_handlers")
        if recorded is not None and not isinstance(recorded, dict):
            raise ValueError(f"StepMetadata.item_handlers must be a dict, but is a {type(recorded).__name__}. This "
                             "likely indicates that the checkpoint was saved using a non-composite handler.")
        item_handlers: dict[str, Any] = dict(recorded or {})
        item_metadata: dict[str, Any] = {}
        for name in _item_dirs(r):
            h = self._known_handler(name)
            if h is None:
                item_handlers.setdefault(name, None)
                item_metadata[name] = None
                continue
            if item_handlers.get(name) is None:
                item_handlers[name] = h.typestr()
            try:
                item_metadata[name] = h.item_metadata(r.kv, name)
            except (FileNotFoundError, NotFoundError, ValueError):
                item_metadata[name] = None  # not an item its handler can read
        return StepMetadata(item_handlers=item_handlers, item_metadata=args_lib.Composite(**item_metadata),
                            metrics=doc.get("metrics") or {},
                            performance_metrics=from_stored(doc.get("performance_metrics")),
                            init_timestamp_nsecs=doc.get("init_timestamp_nsecs"),
                            commit_timestamp_nsecs=doc.get("commit_timestamp_nsecs"),
                            custom_metadata=doc.get("custom_metadata") or {})

    def _known_handler(self, name: str) -> CheckpointHandler | None:
        """The handler configured or registered for item ``name`` (``None`` if neither)."""
        h = self.handlers.get(name)
        if h is None and self.registry is not None and hasattr(self.registry, "handler_of_item"):
            h = self.registry.handler_of_item(name)
        return h

    def close(self) -> None:
        """Close every item's handler."""
        for h in self.handlers.values():
            if h is not None:
                h.close()

    def restore_items(self, location: Location, args: args_lib.Composite | None,
                      available: list[str]) -> args_lib.Composite:
        """Restore the items named by ``args`` (all available items without args)."""
        explicit = args is not None and len(args) > 0
        if not explicit:
            return self._restore_all(location, available)
        assert args is not None
        out = {}
        for name, a in args.items():
            handler = self.handler(name, a, explicit=name != "default")
            if name not in available:
                raise FileNotFoundError(f"Item {name!r} is not in the checkpoint at {location} (items: {available}).")
            out[name] = handler.restore_from(location, a, item=name)
        return args_lib.Composite(**out)

    def _restore_all(self, location: Location, available: list[str]) -> args_lib.Composite:
        """Every item of the checkpoint, as Orbax restores without arguments: each with its
        configured or registered handler, else the built-in handler its step recorded in
        ``_CHECKPOINT_METADATA``; an item named up front without a handler, or whose handler
        is not known either way, is a ``ValueError``."""
        recorded: dict[str, str] | None = None
        chosen: dict[str, CheckpointHandler] = {}
        for name in available:
            h = self._known_handler(name)
            if h is None and name in self.handlers:
                raise ValueError(f'Item with name: "{name}" had an undetermined `CheckpointHandler` when restoring. '
                                 "Please ensure the handler was specified during initialization, or use the "
                                 "appropriate `CheckpointArgs` subclass to indicate the item type.")
            if h is None:
                if recorded is None:
                    recorded = resolve(location).handlers()
                cls = builtin_handler_class(recorded.get(name))
                if cls is None:
                    raise ValueError(f'Item "{name}" was found in the checkpoint, but could not be restored. Please '
                                     "provide a `CheckpointHandlerRegistry`, or call `restore` with an appropriate "
                                     "`CheckpointArgs` subclass.")
                h = cls()
            chosen[name] = h
        return args_lib.Composite(**{n: h.restore_from(location, None, item=n) for n, h in sorted(chosen.items())})
