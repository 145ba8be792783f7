"""``ocp.handlers.DefaultCheckpointHandlerRegistry``: which handler saves or restores an item,
by item name and argument type (Orbax's ``handler_registry=`` of the manager and of
``CompositeCheckpointHandler``)."""

from __future__ import annotations

from typing import Any, Protocol

from ocdbt_py.orbax import args as args_lib

__all__ = ["CheckpointHandlerRegistry", "DefaultCheckpointHandlerRegistry", "AlreadyExistsError", "NoEntryError",
           "create_default_handler_registry"]


class AlreadyExistsError(ValueError):
    """An entry for that item and argument type is registered already."""


class NoEntryError(KeyError):
    """No entry for that item and argument type."""


class CheckpointHandlerRegistry(Protocol):
    """(item name or ``None``, argument type) -> handler."""

    def add(self, item: str | None, args: Any, handler: Any = None) -> None:
        """Register ``handler`` for ``item`` and the argument type of ``args``."""

    def get(self, item: str | None, args: Any) -> Any:
        """The handler for ``item`` and ``args``' type (``NoEntryError`` if none)."""

    def has(self, item: str | None, args: Any) -> bool:
        """Whether there is one."""

    def get_all_entries(self) -> dict[tuple[str | None, type], Any]:
        """Every entry."""


def _args_type(args: Any) -> type:
    return args if isinstance(args, type) else type(args)


class DefaultCheckpointHandlerRegistry:
    """The registry: ``add(item, args_type, handler)`` (``item=None``: any item; ``handler``
    a handler, a handler class, or ``None`` for the one registered for ``args_type`` with
    ``ocp.args.register_with_handler``)."""

    def __init__(self, other_registry: Any = None):
        self._registry: dict[tuple[str | None, type], Any] = {}
        if other_registry is not None:
            for (item, args_type), handler in other_registry.get_all_entries().items():
                self.add(item, args_type, handler)

    def add(self, item: str | None, args: Any, handler: Any = None) -> None:
        """Register a handler (see the class docstring)."""
        args_type = _args_type(args)
        if self.has(item, args_type):
            raise AlreadyExistsError(f"Entry for item={item} and args_type={args_type} already exists in the registry.")
        if handler is None:
            try:
                handler = args_lib.get_registered_handler_cls(args_type)
            except ValueError as e:
                raise ValueError(f"Provided a `None` `CheckpointHandler` when registering item={item} and "
                                 f"args_type={args_type}, and no handler is registered for that type.") from e
        if isinstance(handler, type):
            try:
                handler = handler()
            except TypeError as e:
                raise ValueError(f"The handler registered for {args_type} is not default-constructible; "
                                 "pass one.") from e
        self._registry[(item, args_type)] = handler

    def get(self, item: str | None, args: Any) -> Any:
        """The handler for ``item`` and ``args``' type."""
        key = (item, _args_type(args))
        if key in self._registry:
            return self._registry[key]
        raise NoEntryError(f"No entry for item={item} and args_ty={key[1]} in the registry.")

    def has(self, item: str | None, args: Any) -> bool:
        """Whether an entry exists for ``item`` and ``args``' type."""
        return (item, _args_type(args)) in self._registry

    def get_all_entries(self) -> dict[tuple[str | None, type], Any]:
        """Every entry."""
        return self._registry

    def handler_of_item(self, item: str) -> Any:
        """Some handler registered for ``item`` by name, or ``None``."""
        return next((h for (name, _), h in self._registry.items() if name == item), None)

    def __repr__(self) -> str:
        return f"DefaultCheckpointHandlerRegistry({self._registry})"


def create_default_handler_registry(**items_to_handlers: Any) -> DefaultCheckpointHandlerRegistry:
    """A registry with each handler under its item name, for its registered argument types."""
    registry = DefaultCheckpointHandlerRegistry()
    for name, handler in items_to_handlers.items():
        save_cls, restore_cls = args_lib.get_registered_args_cls(handler)
        registry.add(name, save_cls, handler)
        registry.add(name, restore_cls, handler)
    return registry
