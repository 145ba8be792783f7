"""The ``_METADATA`` file of a PyTree item: one entry per leaf, plus format flags.

See ``spec/orbax.md`` section 3.  Each ``tree_metadata`` entry names its leaf by a key path
(``key_metadata``: names with a type, 1 = sequence index, 2 = dict key or attribute) and
describes its value (``value_type``, ``skip_deserialize``, optional ``write_shape``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from ocdbt_py.checkpoint.jsonio import parse_json
from ocdbt_py.errors import CorruptionError
from zarr3.engine.json_text import parse as parse_json_text

__all__ = [
    "KEY_SEQUENCE",
    "KEY_DICT",
    "Leaf",
    "kind_of",
    "ARRAY",
    "SCALAR",
    "STRING",
    "EMPTY",
    "INLINE",
    "TreeMetadata",
    "parse_tree_metadata",
    "parse_tree_metadata_bytes",
    "scan_tree_metadata",
    "EMPTY_VALUE_TYPES",
    "empty_value",
]

KEY_SEQUENCE = 1
KEY_DICT = 2

#: ``value_type`` strings that mark an empty value with no stored data.
EMPTY_VALUE_TYPES = frozenset({"None", "Dict", "List", "Tuple", "NamedTuple"})

_MAX_DEPTH = 1000


def empty_value(value_type: str) -> Any:
    """The Python value Orbax restores for an empty-value marker (a fresh object each call)."""
    if value_type == "Dict":
        return {}
    if value_type == "List":
        return []
    if value_type == "Tuple":
        return ()
    return None  # "None", and "NamedTuple" without rich types


ARRAY = "array"  #: a Zarr array, restored as an ndarray
SCALAR = "scalar"  #: a 0-d Zarr array, restored as a Python scalar
STRING = "string"  #: a value in ``_strings.json``
EMPTY = "empty"  #: None or an empty container, no stored data
INLINE = "inline"  #: a value held in the legacy msgpack file

_KINDS = {"jax.Array": ARRAY, "np.ndarray": ARRAY, "scalar": SCALAR, "string": STRING,
          **{t: EMPTY for t in EMPTY_VALUE_TYPES}}


def kind_of(value_type: str) -> str:
    """Where a leaf of this Orbax ``value_type`` keeps its value (unknown types: an array)."""
    return _KINDS.get(value_type, ARRAY)


class Leaf:
    """One leaf of a stored tree.

    ``keys`` is the key path (``(name, key_type)`` pairs, key_type 1: sequence index, 2: dict
    key); ``kind`` says where the value lives (:data:`ARRAY`, :data:`SCALAR`, :data:`STRING`,
    :data:`EMPTY`, :data:`INLINE`); ``value_type`` is Orbax's type string (``"jax.Array"``,
    ``"np.ndarray"``, ``"scalar"``, ``"string"``, ``"None"``, ...); ``value`` holds the value of
    EMPTY and INLINE leaves (and, for a legacy placeholder naming another param, that param's
    name); ``write_shape`` is the per-replica shape Orbax recorded.  ``param_name`` is Orbax's
    name for the leaf's data (key names joined with ``.``); ``names`` the key names; ``path``
    the key path with sequence indices as ``int``.
    """

    __slots__ = ("keys", "kind", "value_type", "write_shape", "value", "param_name", "names", "path")

    def __init__(self, keys: tuple[tuple[str, int], ...], kind: str, value_type: str,
                 write_shape: tuple[int, ...] | None = None, value: Any = None, *,
                 names: tuple[str, ...] | None = None, seq: bool | None = None):
        self.keys = keys
        self.kind = kind
        self.value_type = value_type
        self.write_shape = write_shape
        self.value = value
        if names is None:
            names = tuple([k for k, _ in keys])
        if seq is None:
            seq = any(t == KEY_SEQUENCE for _, t in keys)
        self.names: tuple[str, ...] = names
        self.param_name: str = ".".join(names)
        self.path: tuple[str | int, ...] = (
            tuple([int(k) if t == KEY_SEQUENCE else k for k, t in keys]) if seq else names
        )

    @classmethod
    def of_type(cls, keys: tuple[tuple[str, int], ...], value_type: str,
                write_shape: tuple[int, ...] | None = None, *, names: tuple[str, ...] | None = None,
                seq: bool | None = None) -> Leaf:
        """A leaf whose kind (and empty value) follow from its Orbax ``value_type``."""
        kind = _KINDS.get(value_type, ARRAY)
        return cls(keys, kind, value_type, write_shape, empty_value(value_type) if kind == EMPTY else None,
                   names=names, seq=seq)

    def __repr__(self) -> str:
        return f"Leaf({self.param_name!r}, {self.kind}, {self.value_type!r})"


@dataclasses.dataclass
class TreeMetadata:
    """Parsed ``_METADATA``."""

    leaves: list[Leaf]
    use_ocdbt: bool | None = None
    use_zarr3: bool = False
    store_array_data_equal_to_fill_value: bool = False
    custom_metadata: Any = None
    has_rich_value_tree: bool = False


def _bad(msg: str) -> CorruptionError:
    return CorruptionError(f"_METADATA: {msg}")


def _parse_entry(name: str, raw: Any, pairs: dict[tuple[str, int], tuple[str, int]]) -> Leaf:
    """One ``tree_metadata`` entry; ``pairs`` interns the ``(name, key_type)`` pairs (models
    repeat the same key names in every layer: fewer objects to build and to collect)."""
    try:
        km = raw["key_metadata"]
        vm = raw["value_metadata"]
        vt = vm["value_type"]
        if type(km) is not list or type(vt) is not str:
            raise TypeError("key_metadata is not a list or value_type not a string")
        if len(km) > _MAX_DEPTH:
            raise _bad(f"entry {name!r} is nested deeper than {_MAX_DEPTH}")
        names = []
        keys = []
        seq = False
        for k in km:
            n = k["key"]
            t = k.get("key_type", KEY_DICT)
            if type(n) is not str or type(t) is not int:
                raise TypeError(f"malformed key {k!r}")
            if t != KEY_DICT:
                if t != KEY_SEQUENCE or not n.isdecimal():  # what int() accepts
                    raise TypeError(f"key {n!r} has key_type {t!r}")
                seq = True
            names.append(n)
            pair = pairs.get((n, t))
            if pair is None:
                pair = pairs[(n, t)] = (n, t)
            keys.append(pair)
        ws = vm.get("write_shape")
    except (TypeError, KeyError, AttributeError) as e:
        raise _bad(f"entry {name!r} is malformed ({e})") from e
    write_shape: tuple[int, ...] | None = None
    if type(ws) is list and all(type(d) is int and d >= 0 for d in ws):
        write_shape = tuple(ws)
    return Leaf.of_type(tuple(keys), vt, write_shape, names=tuple(names), seq=seq)


def parse_tree_metadata(doc: Any) -> TreeMetadata:
    """Parse the JSON document of ``_METADATA``; raise :class:`CorruptionError` if malformed."""
    if not isinstance(doc, dict) or not isinstance(doc.get("tree_metadata"), dict):
        raise _bad("no tree_metadata object")
    pairs: dict[tuple[str, int], tuple[str, int]] = {}
    return _finish([_parse_entry(k, v, pairs) for k, v in doc["tree_metadata"].items()], doc)


def _finish(leaves: list[Leaf], doc: dict[str, Any]) -> TreeMetadata:
    """The :class:`TreeMetadata` of the parsed entries and the document's other members."""
    # An empty-container placeholder followed later by descendants (partial saves): drop the
    # placeholder, as Orbax does.
    empties = {e.keys for e in leaves if e.value_type in EMPTY_VALUE_TYPES}
    if empties:
        prefixes = {e.keys[:i] for e in leaves for i in range(1, len(e.keys)) if e.keys[:i] in empties}
        if prefixes:
            leaves = [e for e in leaves if e.keys not in prefixes]
    use_ocdbt = doc.get("use_ocdbt")
    return TreeMetadata(
        leaves=leaves,
        use_ocdbt=use_ocdbt if isinstance(use_ocdbt, bool) else None,
        use_zarr3=bool(doc.get("use_zarr3", False)),
        store_array_data_equal_to_fill_value=bool(doc.get("store_array_data_equal_to_fill_value", False)),
        custom_metadata=doc.get("custom_metadata"),
        has_rich_value_tree=isinstance(doc.get("value_metadata_tree"), str),
    )


def parse_tree_metadata_bytes(data: bytes, *, what: str = "_METADATA") -> TreeMetadata:
    """Parse the bytes of ``_METADATA``: the regular shape Orbax and ocdbt-py write by
    :func:`scan_tree_metadata`, anything else by the bounded generic JSON parser and
    :func:`parse_tree_metadata` (the same result either way; errors come from the generic
    path only: :class:`CorruptionError`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    tm = scan_tree_metadata(text) if text is not None else None
    if tm is not None:
        return tm
    return parse_tree_metadata(parse_json(data, what=what))


# -- the specialised scanner ----------------------------------------------------------------------
#
# ``json.dumps`` of Orbax's (and our) ``_METADATA``: ``{"tree_metadata": {ENTRY, ENTRY, ...}, REST}``
# with every ENTRY ``"NAME": {"key_metadata": [{"key": "K", "key_type": 2}, ...], "value_metadata":
# {"value_type": "T", "skip_deserialize": false[, "write_shape": [1, 2]]}}``.  One anchored regex
# match an entry (no Python per JSON value); anything else, however valid, makes the scanner give
# up and the generic parser takes the whole document.  Strings: JSON string bodies without raw
# control characters (escapes decoded by the JSON parser, and only where a backslash is present);
# integers: as the bounded parser accepts them (no leading zeros, at most 65 characters).

_STR = r'[^"\\\x00-\x1f]*(?:\\.[^"\\\x00-\x1f]*)*'
_INT = r"(?:0|[1-9][0-9]{0,64})"
_KEY = r'\{"key": "' + _STR + r'", "key_type": [12]\}'
_ENTRY = re.compile(
    r'"(' + _STR + r')": \{"key_metadata": \[(' + _KEY + r"(?:, " + _KEY + r")*)\], "
    r'"value_metadata": \{"value_type": "(' + _STR + r')", "skip_deserialize": (?:true|false)'
    r'(?:, "write_shape": (\[(?:' + _INT + r"(?:, " + _INT + r")*)?\]))?\}\}(?:, (?=\")|(?=\}))")
#: every ``{"key": "K", "key_type": T}`` of a ``key_metadata`` text the entry regex matched
#: (so the keys are back to back, and each match starts where the structure says)
_KEYS = re.compile(r'\{"key": "(' + _STR + r')", "key_type": ([12])\}')
_HEAD = '{"tree_metadata": {'
_WS = " \t\n\r"


def _unescape(s: str) -> str:
    """The value of a JSON string body (``ValueError`` if an escape is invalid)."""
    return s if "\\" not in s else json.loads(f'"{s}"')


def _key_pair(raw: tuple[str, str], escapes: bool) -> tuple[str, int] | None:
    """``(name, key_type)`` of one matched key (``raw``: its name text and type digit);
    ``None`` if a sequence key is not a decimal index."""
    name = _unescape(raw[0]) if escapes else raw[0]
    if raw[1] == "1":
        return (name, KEY_SEQUENCE) if name.isdecimal() else None
    return (name, KEY_DICT)


def _scan_rest(text: str, end: int) -> dict[str, Any] | None:
    """The members after ``tree_metadata`` (from ``text[end:]``, just past its closing brace)
    as a dict, by the bounded parser; ``None`` unless they are well-formed and do not repeat
    ``tree_metadata``."""
    tail = text[end:].lstrip(_WS)
    if tail.startswith(","):
        if not tail[1:].lstrip(_WS).startswith('"'):
            return None
        rest = "{" + tail[1:]
    elif tail.startswith("}"):
        rest = "{" + tail
    else:
        return None
    try:
        doc = parse_json_text(rest, allow_nan=True)
    except ValueError:
        return None
    return None if not isinstance(doc, dict) or "tree_metadata" in doc else doc


def scan_tree_metadata(text: str) -> TreeMetadata | None:
    """``_METADATA`` in its regular shape, parsed straight into leaves; ``None`` for anything
    else (the caller then parses it generically), never an error.  The result is the same as
    :func:`parse_tree_metadata` of the parsed JSON."""
    if not text.startswith(_HEAD):
        return None
    pos = len(_HEAD)
    # each scanner.match() starts where the previous match ended (anchored, in C)
    matches = list(iter(_ENTRY.scanner(text, pos).match, None))  # type: ignore[attr-defined]
    if matches:
        pos = matches[-1].end()
    if not text.startswith("}", pos):
        return None
    doc = _scan_rest(text, pos + 1)
    if doc is None:
        return None
    try:
        leaves = _scan_leaves([m.groups() for m in matches], "\\" in text)
    except ValueError:  # a bad escape: the generic parser reports it
        return None
    return None if leaves is None else _finish(leaves, doc)


def _scan_leaves(groups: list[Any], escapes: bool) -> list[Leaf] | None:
    """Leaves of the matched entries (``(name, key_metadata text, value_type, write_shape
    text)`` each); ``None`` if one is irregular or a name repeats.  ``escapes``: whether the
    text holds a backslash at all."""
    names_raw = [g[0] for g in groups]
    uniq = set(names_raw)
    if len(uniq) != len(names_raw) or (escapes and len({_unescape(n) for n in uniq}) != len(names_raw)):
        return None  # repeated names: the generic parser keeps the last of each, in first place
    cache: dict[tuple[str, str], tuple[str, int]] = {}
    vts: dict[str, tuple[str, str]] = {}
    leaves: list[Leaf] = []
    add = leaves.append
    findall = _KEYS.findall
    for _, ktext, vt, ws in groups:
        found = findall(ktext)
        if len(found) > _MAX_DEPTH:
            return None  # the generic path refuses it
        keys: list[tuple[str, int]] = []
        for raw in found:
            pair = cache.get(raw)
            if pair is None:
                pair = _key_pair(raw, escapes)
                if pair is None:
                    return None
                cache[raw] = pair
            keys.append(pair)
        tk = vts.get(vt)
        if tk is None:
            v = _unescape(vt)
            tk = vts[vt] = (v, _KINDS.get(v, ARRAY))
        write_shape = None if ws is None else tuple(map(int, ws[1:-1].split(", "))) if len(ws) > 2 else ()
        add(Leaf(tuple(keys), tk[1], tk[0], write_shape, empty_value(tk[0]) if tk[1] == EMPTY else None,
                 names=tuple([k for k, _ in keys]), seq='"key_type": 1}' in ktext))
    return leaves
