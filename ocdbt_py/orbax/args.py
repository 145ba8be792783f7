"""``ocp.args``: what to save or restore and how (Orbax's ``CheckpointArgs`` classes).

>>> import ocdbt_py.orbax as ocp
>>> args = ocp.args.Composite(state=ocp.args.StandardSave(state),          # doctest: +SKIP
...                           meta=ocp.args.JsonSave({"lr": 1e-3}))

Each class has the fields of its Orbax namesake; :class:`Composite` maps item names to
arguments and is also the type of a composite restore's result (indexable by name or
attribute).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "CheckpointArgs",
    "register_with_handler",
    "get_registered_handler_cls",
    "get_registered_args_cls",
    "StandardSave",
    "StandardRestore",
    "PyTreeSave",
    "PyTreeRestore",
    "JsonSave",
    "JsonRestore",
    "ArraySave",
    "ArrayRestore",
    "Composite",
]


class CheckpointArgs:
    """Base class of every save/restore argument object."""


# argument class -> (handler class, for save, for restore), in registration order
_registry: dict[type, tuple[type, bool, bool]] = {}


def register_with_handler(handler_cls: type, for_save: bool = False,
                          for_restore: bool = False) -> Callable[[type], type]:
    """Class decorator: argument class ``cls`` is saved (``for_save``) and/or restored
    (``for_restore``) by ``handler_cls``, so a ``CheckpointManager`` or ``Composite`` item given
    a ``cls`` instance without a handler uses ``handler_cls()``."""
    if not for_save and not for_restore:
        raise ValueError("at least one of for_save and for_restore must be True")

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, CheckpointArgs)):
            raise TypeError(f"{cls} must subclass `CheckpointArgs` in order to be registered.")
        _registry[cls] = (handler_cls, for_save, for_restore)
        return cls

    return decorator


def get_registered_handler_cls(args: CheckpointArgs | type) -> type:
    """The handler class registered for an argument class (or instance)."""
    cls = args if isinstance(args, type) else type(args)
    for c in cls.__mro__:
        if c in _registry:
            return _registry[c][0]
    raise ValueError(f"No registered handler for {cls}.")


def _registrations(handler: Any) -> list[tuple[type, bool, bool]]:
    """``(args class, for save, for restore)`` registered for the nearest class of
    ``handler``'s MRO that has registrations (a subclass inherits its base's arguments)."""
    hcls = handler if isinstance(handler, type) else type(handler)
    for c in hcls.__mro__:
        found = [(a, s, r) for a, (h, s, r) in _registry.items() if h is c]
        if found:
            return found
    return []


def registered_args_of(handler: Any) -> list[type]:
    """Every argument class registered for ``handler`` (class or instance)."""
    return [a for a, _, _ in _registrations(handler)]


def args_fit_handler(args: Any, handler: Any) -> bool:
    """Whether ``args`` is an instance of an argument class registered for ``handler``
    (handlers without registrations take any argument)."""
    regs = registered_args_of(handler)
    return not regs or isinstance(args, tuple(regs))


def get_registered_args_cls(handler: Any) -> tuple[type, type]:
    """``(save argument class, restore argument class)`` first registered for ``handler`` (a
    handler class or instance); ``ValueError`` unless both are registered."""
    hcls = handler if isinstance(handler, type) else type(handler)
    regs = _registrations(hcls)
    save_cls = next((a for a, s, _ in regs if s), None)
    restore_cls = next((a for a, _, r in regs if r), None)
    if save_cls is None or restore_cls is None:
        raise ValueError(f"No registered save and restore argument classes for {hcls} "
                         f"(save: {save_cls}, restore: {restore_cls}).")
    return save_cls, restore_cls


@dataclasses.dataclass
class StandardSave(CheckpointArgs):
    """Save a tree of arrays and scalars (``StandardCheckpointHandler``)."""

    item: Any
    save_args: Any = None
    custom_metadata: Any = None


@dataclasses.dataclass
class StandardRestore(CheckpointArgs):
    """Restore a tree saved with :class:`StandardSave`; ``item`` is the target (abstract
    ``jax.ShapeDtypeStruct`` leaves with shardings, arrays, or ``None`` for as stored)."""

    item: Any = None
    strict: bool = True
    support_layout: bool = False
    fallback_sharding: Any = None


@dataclasses.dataclass
class PyTreeSave(CheckpointArgs):
    """Save any tree (strings too) with per-leaf ``save_args`` (``PyTreeCheckpointHandler``)."""

    item: Any
    save_args: Any = None
    ocdbt_target_data_file_size: int | None = None
    custom_metadata: Any = None


@dataclasses.dataclass
class PyTreeRestore(CheckpointArgs):
    """Restore a tree; ``item`` gives the structure, ``restore_args`` the per-leaf types and
    shardings (``checkpoint_utils.construct_restore_args``)."""

    item: Any = None
    restore_args: Any = None
    transforms: Any = None
    transforms_default_to_original: bool = True
    legacy_transform_fn: Any = None
    partial_restore: bool = False


@dataclasses.dataclass
class JsonSave(CheckpointArgs):
    """Save a JSON-serializable object (``JsonCheckpointHandler``)."""

    item: Any


@dataclasses.dataclass
class JsonRestore(CheckpointArgs):
    """Restore a JSON item."""

    item: Any = None


@dataclasses.dataclass
class ArraySave(CheckpointArgs):
    """Save one array or scalar (``ArrayCheckpointHandler``); ``save_args`` a ``SaveArgs``."""

    item: Any
    save_args: Any = None


@dataclasses.dataclass
class ArrayRestore(CheckpointArgs):
    """Restore an item saved with :class:`ArraySave`; ``restore_args`` a ``RestoreArgs`` (or
    ``ArrayRestoreArgs``) for its type and placement; ``item`` is unused, as in Orbax."""

    item: Any = None
    restore_args: Any = None


class Composite(CheckpointArgs, Mapping[str, Any]):
    """Item name -> arguments (or, as a restore result, item name -> restored object).

    ``Composite(state=..., meta=...)``; ``c["state"]``, ``c.state`` (for names that are not
    methods), ``"state" in c``, ``c.items()``, ``c.get(name)``, ``c | other``, ``c & other``.
    Immutable.
    """

    _items: dict[str, Any]

    def __init__(self, **items: Any):
        for key in items:
            if key.startswith("__"):
                raise ValueError(f'Composite keys cannot start with "__". Got: {key}')
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, key: str) -> Any:
        if key not in self._items:
            raise KeyError(f"Unknown key: {key}. Available keys: {self._items.keys()}")
        return self._items[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or key == "_items":
            raise AttributeError(key)
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(f"Unknown key: {key}. Available keys: {self._items.keys()}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise ValueError("Composite is immutable after initialization.")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __or__(self, other: Mapping[str, Any]) -> Composite:
        return Composite(**{**self._items, **dict(other)})

    def __and__(self, other: Mapping[str, Any]) -> Composite:
        return Composite(**{k: v for k, v in self._items.items() if k in other})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Composite) and self._items == other._items

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Composite({self._items!r})"
