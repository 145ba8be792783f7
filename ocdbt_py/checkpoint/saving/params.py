"""Walking a tree to save: leaves, their key paths, Orbax param names and value types.

With JAX already imported, the walk is ``jax.tree_util.tree_flatten_with_path`` with Orbax's
``is_empty_or_leaf`` rule, so every registered pytree (flax/optax dataclasses, NamedTuples,
custom nodes) is named exactly as Orbax names it.  Without JAX (a NumPy or PyTorch user) the
*plain-container walk* applies, which gives the same result for plain containers:

* ``dict`` (and any ``Mapping``): keys in sorted order (``collections.OrderedDict``: insertion
  order), recorded as dict keys (``key_type`` 2) named ``str(key)``;
* ``list`` and ``tuple``: elements by index (``key_type`` 1);
* ``NamedTuple``: fields in declaration order, recorded as dict keys (as JAX's ``GetAttrKey``);
* ``None`` and empty dicts, lists, tuples and NamedTuples: empty leaves (no data, only a
  ``_METADATA`` entry);
* anything else is a leaf.

Leaves are classified as Orbax's type handlers do: ``jax.Array`` (``value_type``
``"jax.Array"``), ``np.ndarray`` (``"np.ndarray"``), Python ``int``/``float``/``bool`` and NumPy
scalars (``"scalar"``), ``str`` (``"string"``), and the empty markers ``"None"``, ``"Dict"``,
``"List"``, ``"Tuple"`` (an empty NamedTuple is recorded as ``"None"``, as Orbax does without
rich-type metadata).

Orbax joins key names with ``.`` without escaping, so ``{'a.b': x}`` and ``{'a': {'b': x}}``
would silently share storage; here that is a :class:`ParamNameCollisionError`.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "Leaf",
    "flatten",
    "ParamNameCollisionError",
    "UnsupportedLeafError",
    "KEY_SEQUENCE",
    "KEY_DICT",
    "JAX_ARRAY",
    "NP_ARRAY",
    "SCALAR",
    "STRING",
    "EMPTY_TYPES",
    "jax_loaded",
]

KEY_SEQUENCE = 1
KEY_DICT = 2

JAX_ARRAY = "jax.Array"
NP_ARRAY = "np.ndarray"
SCALAR = "scalar"
STRING = "string"
#: ``value_type`` markers of leaves that carry no data.
EMPTY_TYPES = frozenset({"None", "Dict", "List", "Tuple", "NamedTuple"})


class ParamNameCollisionError(ValueError):
    """Two leaves would be stored under the same name (Orbax joins keys with ``.``)."""


class UnsupportedLeafError(TypeError):
    """A leaf has a type no Orbax type handler stores."""


def jax_loaded() -> bool:
    """Whether JAX is imported already (we never import it ourselves for a NumPy tree)."""
    return "jax" in sys.modules


@dataclasses.dataclass
class Leaf:
    """One leaf of the tree being saved."""

    names: tuple[str, ...]
    key_types: tuple[int, ...]
    value: Any
    value_type: str

    @property
    def param_name(self) -> str:
        """Orbax's storage name: key names joined with ``.``."""
        return ".".join(self.names)

    @property
    def tree_key(self) -> str:
        """The ``_METADATA`` key: Python's ``str`` of the tuple of key names."""
        return str(tuple(self.names))

    @property
    def has_data(self) -> bool:
        """Whether the leaf stores anything besides its ``_METADATA`` entry."""
        return self.value_type not in EMPTY_TYPES

    @property
    def where(self) -> str:
        """A readable key path for error messages."""
        return "".join(f"[{n}]" if t == KEY_SEQUENCE else f"[{n!r}]" for n, t in zip(self.names, self.key_types))


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields") and hasattr(type(x), "_make")


def _empty_type(x: Any) -> str | None:
    """The empty marker of ``x``, or ``None`` if it is not an empty container/None."""
    if x is None:
        return "None"
    if _is_namedtuple(x):
        return "None" if len(x) == 0 else None  # Orbax records an empty NamedTuple as "None"
    if isinstance(x, (dict, Mapping)):
        return "Dict" if len(x) == 0 else None
    if isinstance(x, list):
        return "List" if len(x) == 0 else None
    if isinstance(x, tuple):
        return "Tuple" if len(x) == 0 else None
    return None


def classify(value: Any, where: str | Callable[[], str] = "") -> str:
    """The ``value_type`` Orbax records for a (non-container) leaf value; ``where`` (or a
    function giving it, called only for the error) names the leaf in the error for a value
    that cannot be saved."""
    if jax_loaded():
        # optional: JAX is imported only for trees that hold JAX objects
        import jax

        if isinstance(value, jax.Array):
            return JAX_ARRAY
    if isinstance(value, np.ndarray):
        return NP_ARRAY
    if isinstance(value, str):
        return STRING
    if isinstance(value, (bool, int, float, complex, np.number, np.bool_)):
        return SCALAR
    if isinstance(value, np.generic) and not isinstance(value, (np.flexible, np.object_)):
        return SCALAR  # ml_dtypes scalars (bfloat16, float8_*, int4, ...)
    empty = _empty_type(value)
    if empty is not None:
        return empty
    hint = ""
    if type(value).__module__.startswith("torch"):
        hint = " (convert torch tensors with .numpy() first)"
    elif isinstance(value, (bytes, bytearray)):
        hint = " (Orbax stores no bytes leaves; use a uint8 array)"
    name = where() if callable(where) else where
    raise UnsupportedLeafError(f"cannot save leaf {name or '<root>'} of type {type(value).__name__}{hint}")


def _sorted_keys(d: Mapping[Any, Any], where: str) -> list[Any]:
    if isinstance(d, collections.OrderedDict):
        return list(d.keys())
    try:
        return sorted(d.keys())
    except TypeError as e:
        raise ValueError(f"dict keys at {where or '<root>'} cannot be sorted (mixed key types?): {e}") from e


def _walk_plain(x: Any, names: tuple[str, ...], types: tuple[int, ...], out: list[Leaf]) -> None:
    empty = _empty_type(x)
    if empty is not None:
        out.append(Leaf(names, types, x, empty))
        return
    if isinstance(x, Mapping):
        for k in _sorted_keys(x, ".".join(names)):
            _walk_plain(x[k], names + (str(k),), types + (KEY_DICT,), out)
        return
    if _is_namedtuple(x):
        for field, v in zip(x._fields, x):
            _walk_plain(v, names + (str(field),), types + (KEY_DICT,), out)
        return
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _walk_plain(v, names + (str(i),), types + (KEY_SEQUENCE,), out)
        return
    leaf = Leaf(names, types, x, "")
    leaf.value_type = classify(x, lambda: leaf.where)  # the path only for an error message
    out.append(leaf)


def _walk_jax(tree: Any) -> list[Leaf]:
    # optional: JAX is imported only for trees that hold JAX objects
    import jax
    from jax import tree_util as tu

    flatten_one = getattr(getattr(jax, "_src", None), "tree_util", None)

    def is_empty_or_leaf(x: Any) -> bool:
        if x is tree:
            return _empty_type(x) is not None
        try:
            if flatten_one is not None and hasattr(flatten_one, "flatten_one_level"):
                children, _ = flatten_one.flatten_one_level(x)
            else:  # pragma: no cover - older/newer JAX without the private helper
                children = tu.tree_flatten(x, is_leaf=lambda y: y is not x)[0]
        except ValueError:
            return True
        return not list(children)

    flat, _ = tu.tree_flatten_with_path(tree, is_leaf=is_empty_or_leaf)
    out: list[Leaf] = []
    for path, value in flat:
        names: list[str] = []
        types: list[int] = []
        for k in path:
            if isinstance(k, tu.SequenceKey):
                names.append(str(k.idx))
                types.append(KEY_SEQUENCE)
            elif isinstance(k, tu.DictKey):
                names.append(str(k.key))
                types.append(KEY_DICT)
            elif isinstance(k, tu.GetAttrKey):
                names.append(str(k.name))
                types.append(KEY_DICT)
            elif isinstance(k, tu.FlattenedIndexKey):
                names.append(str(k.key))
                types.append(KEY_SEQUENCE)
            else:
                raise UnsupportedLeafError(f"unsupported pytree key entry {type(k).__name__}: {k!r}")
        leaf = Leaf(tuple(names), tuple(types), value, "")
        empty = _empty_type(value)
        if empty is not None:
            leaf.value_type = empty
        elif _is_custom_empty_node(value):
            raise UnsupportedLeafError(
                f"cannot save leaf {leaf.where}: an empty {type(value).__name__} pytree node "
                f"(Orbax stores only None and empty dicts, lists, tuples and NamedTuples)"
            )
        else:
            leaf.value_type = classify(value, lambda leaf=leaf: leaf.where)  # type: ignore[misc]
        out.append(leaf)
    return out


def _is_custom_empty_node(x: Any) -> bool:
    # optional: JAX is imported only for trees that hold JAX objects
    import jax

    if isinstance(x, (jax.Array, np.ndarray, np.generic, str, int, float, complex)):
        return False
    try:
        return not jax.tree_util.tree_leaves(x)
    except Exception:  # noqa: BLE001 - anything unflattenable is a plain leaf
        return False


def flatten(tree: Any, *, use_jax: bool | None = None) -> list[Leaf]:
    """All leaves of ``tree`` in Orbax's order, with param-name collisions rejected.

    ``use_jax`` forces (``True``) or forbids (``False``) the JAX walk; by default JAX is used
    when it is already imported.
    """
    if use_jax is None:
        use_jax = jax_loaded()
    if use_jax:
        leaves = _walk_jax(tree)
    else:
        leaves = []
        _walk_plain(tree, (), (), leaves)
    if not leaves or (len(leaves) == 1 and not leaves[0].names and not leaves[0].has_data):
        raise ValueError("Found empty item: there is nothing to save in this tree")
    if len(leaves) == 1 and not leaves[0].names:
        raise ValueError(
            "the tree is a bare leaf; Orbax saves trees of containers, so wrap it: {'value': x}"
        )
    check_collisions(leaves)
    return leaves


def check_collisions(leaves: list[Leaf]) -> None:
    """Raise :class:`ParamNameCollisionError` when two leaves share a storage name.

    Storage names are the ``.``-joined param names (OCDBT keys, ``_sharding`` keys) and, for
    strings, the ``/``-split JSON pointer into ``_strings.json``.
    """
    seen: dict[str, Leaf] = {}
    for leaf in leaves:
        if not leaf.has_data:
            continue
        name = leaf.param_name
        prev = seen.get(name)
        if prev is not None:
            raise ParamNameCollisionError(
                f"leaves {prev.where} and {leaf.where} would both be stored as {name!r} "
                f"(Orbax joins keys with '.'); rename one of them"
            )
        seen[name] = leaf
    # Zarr arrays live below "<name>/" in one key space, and strings nest by "/" in
    # _strings.json: a name that is a path prefix of another would mix the two.
    for kind_is_string in (False, True):
        group = {n: lf for n, lf in seen.items() if (lf.value_type == STRING) == kind_is_string}
        for n, lf in group.items():
            if kind_is_string and (n == "" or "//" in n or n.startswith("/") or n.endswith("/")):
                raise ParamNameCollisionError(
                    f"string leaf {lf.where} has a name ({n!r}) that is not a valid _strings.json path"
                )
            parts = n.split("/")
            for i in range(1, len(parts)):
                other = group.get("/".join(parts[:i]))
                if other is not None:
                    raise ParamNameCollisionError(
                        f"leaves {other.where} and {lf.where}: {n!r} would be stored inside "
                        f"{other.param_name!r}"
                    )
