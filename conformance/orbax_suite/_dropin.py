"""The drop-in import layer of the Orbax test-suite runner (loaded inside the pytest subprocess).

The runner rewrites the copied test files' ``orbax.checkpoint`` imports to ``_ocdbt_dropin``
(``test_utils`` excepted).  This module installs a meta-path finder that answers every
``_ocdbt_dropin[.X]`` import with a proxy module:

* a public module ``ocdbt_py.orbax`` implements (:data:`SWAPPED`) gives ``ocdbt_py.orbax``'s
  names -- a name ocdbt_py lacks is an ``AttributeError`` (a gap, counted);
* any other module (``_src`` modules, public helpers such as ``test_utils`` or ``multihost``)
  gives Orbax's own objects, except those Orbax also exports under a swapped public module:
  ``_src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler`` *is*
  ``orbax.checkpoint.PyTreeCheckpointHandler``, so the test gets ``ocdbt_py.orbax``'s.
  Which ``_src`` objects are public is decided by identity, from Orbax's modules themselves.

Names taken from Orbax that are not public are recorded per test (:data:`INTERNALS_USED`) for
the report.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

PREFIX = "_ocdbt_dropin"
ORBAX = "orbax.checkpoint"

# Orbax public module (suffix after ``orbax.checkpoint``) -> the ocdbt_py module standing in for it
SWAPPED: dict[str, str] = {
    "": "ocdbt_py.orbax",
    "args": "ocdbt_py.orbax.args",
    "checkpoint_args": "ocdbt_py.orbax.checkpoint_args",
    "checkpoint_manager": "ocdbt_py.orbax.checkpoint_manager",
    "abstract_checkpoint_manager": "ocdbt_py.orbax.checkpoint_manager",
    "checkpoint_managers": "ocdbt_py.orbax.checkpoint_managers",
    "checkpointers": "ocdbt_py.orbax.checkpointers",
    "handlers": "ocdbt_py.orbax.handlers",
    "utils": "ocdbt_py.orbax.utils",
    "checkpoint_utils": "ocdbt_py.orbax.checkpoint_utils",
    "type_handlers": "ocdbt_py.orbax.type_handlers",
    "options": "ocdbt_py.orbax.options",
    "metadata": "ocdbt_py.orbax.metadata",
    "tree": "ocdbt_py.orbax.tree",
    "path": "ocdbt_py.orbax.path",
    "logging": "ocdbt_py.orbax.logging",
    "experimental.emergency.checkpoint_manager": "ocdbt_py.orbax.emergency",
}

INTERNALS_USED: set[str] = set()
# Orbax class (module.qualname) -> its public name, for public names ocdbt_py.orbax lacks
MISSING_PUBLIC: dict[str, str] = {}
_aliases: dict[int, list[tuple[str, str]]] | None = None


def _dotted(suffix: str, name: str) -> str:
    return f"{suffix}.{name}" if suffix else name


# Orbax's facade modules: every public attribute is an export (the others are modules with code
# of their own, whose exports are the names they define)
FACADES = {"", "args", "checkpoint_args", "checkpoint_managers", "checkpointers", "handlers", "utils", "type_handlers",
           "options", "metadata", "tree", "path", "logging"}
# public submodules of the facades that ocdbt_py.orbax stands in for (``ocp.path.atomicity.X``)
SUBMODULES = ["step", "path.step", "path.atomicity", "path.deleter", "path.format_utils", "logging.step_statistics",
              "metadata.value", "metadata.tree"]


def _public_aliases() -> dict[int, list[tuple[str, str]]]:
    """id(Orbax object) -> [(public module suffix, name)] over :data:`SWAPPED` and
    :data:`SUBMODULES`."""
    global _aliases
    if _aliases is not None:
        return _aliases
    found: dict[int, list[tuple[str, str]]] = {}
    keep: list[Any] = []  # keep objects alive so ids stay unique
    for suffix in [*SWAPPED, *SUBMODULES]:
        try:
            mod: Any = importlib.import_module(ORBAX)
            for part in suffix.split(".") if suffix else []:
                mod = getattr(mod, part)
        except (ImportError, AttributeError):
            continue
        facade = suffix in FACADES or suffix in SUBMODULES
        for name, obj in list(vars(mod).items()):
            if name.startswith("_") or isinstance(obj, types.ModuleType):
                continue
            if not facade and getattr(obj, "__module__", mod.__name__) != mod.__name__:
                continue
            keep.append(obj)
            found.setdefault(id(obj), []).append((suffix, name))
    _aliases = found
    _public_aliases.keep = keep  # type: ignore[attr-defined]
    return found


def _ours(suffix: str) -> types.ModuleType | None:
    """The ocdbt_py module for the public path ``suffix`` (``path.atomicity``), or ``None``."""
    parts = suffix.split(".") if suffix else []
    for cut in range(len(parts), -1, -1):
        head = ".".join(parts[:cut])
        if head in SWAPPED:
            try:
                mod: Any = importlib.import_module(SWAPPED[head])
            except ImportError:
                return None
            for p in parts[cut:]:
                mod = getattr(mod, p, None)
                if not isinstance(mod, types.ModuleType):
                    return None
            return mod  # type: ignore[no-any-return]
    return None


def _missing(orbax_obj: Any, orbax_name: str, name: str, path: str) -> Any:
    """Orbax's object for a public name ocdbt_py.orbax lacks, remembered: a test that hands it
    to ocdbt_py.orbax fails (a gap), it is not out of the count."""
    MISSING_PUBLIC[f"{getattr(orbax_obj, '__module__', orbax_name)}.{getattr(orbax_obj, '__qualname__', name)}"] = path
    INTERNALS_USED.add(f"{orbax_name}.{name} (public {path})")
    return orbax_obj


class _Proxy(types.ModuleType):
    """``_ocdbt_dropin.<suffix>``: see the module docstring."""

    def __init__(self, suffix: str):
        super().__init__(_dotted(PREFIX, suffix) if suffix else PREFIX)
        self.__dict__["_suffix"] = suffix
        self.__dict__["_swapped"] = suffix in SWAPPED or suffix in SUBMODULES
        self.__path__: list[str] = []  # a package, so submodules import

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        suffix = self.__dict__["_suffix"]
        orbax_name = _dotted(ORBAX, suffix) if suffix else ORBAX
        try:
            orbax_mod: Any = importlib.import_module(orbax_name)
            orbax_obj = getattr(orbax_mod, name)
        except (ImportError, AttributeError):
            orbax_obj = None
        if isinstance(orbax_obj, types.ModuleType) and orbax_obj.__name__.startswith(ORBAX + "."):
            sub = orbax_obj.__name__[len(ORBAX) + 1:]
            public = sub in SWAPPED or sub in SUBMODULES
            if public or sub.startswith(("_src.", "experimental.")) and "test_utils" not in sub:
                return importlib.import_module(_dotted(PREFIX, sub))
            return orbax_obj  # a public helper module ocdbt_py does not stand in for (test_utils, ...)
        if self.__dict__["_swapped"]:
            ours = _ours(suffix)
            if ours is not None and hasattr(ours, name):
                return getattr(ours, name)
            if orbax_obj is None:
                raise AttributeError(f"ocdbt_py.orbax has no public name {_dotted(orbax_name, name)}")
            return _missing(orbax_obj, orbax_name, name, _dotted(orbax_name, name))
        if orbax_obj is None and not hasattr(orbax_mod, name):
            raise AttributeError(f"module {orbax_name!r} has no attribute {name!r}")
        if orbax_obj is Ellipsis or isinstance(orbax_obj, (int, float, str, bytes, type(None))):
            return orbax_obj  # plain values: identity says nothing (None, True, ... are shared)
        for pub_suffix, pub_name in _public_aliases().get(id(orbax_obj), []):
            ours = _ours(pub_suffix)
            if ours is not None and hasattr(ours, pub_name):
                return getattr(ours, pub_name)
        if _public_aliases().get(id(orbax_obj)) and not isinstance(orbax_obj, types.ModuleType):
            # a public name ocdbt_py.orbax lacks: the test gets Orbax's object, and a refusal of it
            # counts as a failure (a gap), not as an internal (see _suite_plugin)
            return _missing(orbax_obj, orbax_name, name, _dotted(ORBAX, _dotted(*_public_aliases()[id(orbax_obj)][0])))
        if not isinstance(orbax_obj, types.ModuleType):
            INTERNALS_USED.add(f"{orbax_name}.{name}")
        return orbax_obj


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``_ocdbt_dropin[.X]`` with :class:`_Proxy` modules."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != PREFIX and not fullname.startswith(PREFIX + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        return _Proxy(spec.name[len(PREFIX) + 1:] if spec.name != PREFIX else "")

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: proxies resolve names lazily."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
