"""Refusing orbax-checkpoint's own objects where ``ocdbt_py.orbax`` needs its own (internal).

A script that mixes the two libraries (an Orbax handler, logger or argument handed to an
``ocdbt_py.orbax`` manager) gets :class:`ForeignOrbaxObjectError` naming the Orbax class,
instead of an ``AttributeError`` deep inside a save.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ForeignOrbaxObjectError", "orbax_class", "refuse_orbax_object"]


class ForeignOrbaxObjectError(TypeError):
    """An object of orbax-checkpoint's own implementation was given to ``ocdbt_py.orbax``.

    ``internal`` is the Orbax class's dotted name; the message ends with
    ``[orbax-internal: <name>]`` so tools can tell these refusals from other errors.
    """

    def __init__(self, what: str, internal: str):
        super().__init__(f"{what} is orbax-checkpoint's own {internal}; ocdbt_py.orbax takes its own classes "
                         f"(import them from ocdbt_py.orbax) [orbax-internal: {internal}]")
        self.internal = internal


def orbax_class(obj: Any) -> str | None:
    """The dotted name of the first orbax-checkpoint class ``obj``'s type derives from, if any."""
    cls = obj if isinstance(obj, type) else type(obj)
    for base in cls.__mro__:
        mod = getattr(base, "__module__", "") or ""
        if mod == "orbax" or mod.startswith("orbax."):
            return f"{mod}.{base.__qualname__}"
    return None


def refuse_orbax_object(obj: Any, what: str) -> None:
    """Raise :class:`ForeignOrbaxObjectError` when ``obj`` is (or derives from) an Orbax class."""
    name = orbax_class(obj)
    if name is not None:
        raise ForeignOrbaxObjectError(what, name)
