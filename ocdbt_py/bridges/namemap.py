"""Tensor-name mappings as data: ordered regex renames (and transposes) from JSON or YAML.

A map file is either a list of ``[pattern, replacement]`` pairs, an object
``{pattern: replacement, ...}`` (applied in file order), or an object with the keys
``"rename"`` (either of those forms) and ``"transpose"`` (a list of globs).  Every rule whose
pattern matches is applied in turn with :func:`re.sub` (``\\1`` back-references work); a
``null`` replacement leaves the tensor out.  For example, Flax names to Hugging Face names::

    {"rename": [["^params\\\\.", ""], ["\\\\.kernel$", ".weight"], ["\\\\.scale$", ".weight"]],
     "transpose": ["*.kernel"]}
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["NameMap", "load_name_map", "glob_matcher", "MAX_MAP_BYTES"]

#: Largest map file accepted.
MAX_MAP_BYTES = 16 << 20


@dataclasses.dataclass
class NameMap:
    """Ordered regex renames plus transpose globs."""

    rules: list[tuple[re.Pattern[str], str | None]] = dataclasses.field(default_factory=list)
    transpose: list[str] = dataclasses.field(default_factory=list)

    def __call__(self, name: str) -> str | None:
        """The new name, or ``None`` to leave the tensor out."""
        for pattern, repl in self.rules:
            if pattern.search(name) is None:
                continue
            if repl is None:
                return None
            name = pattern.sub(repl, name)
        return name

    @classmethod
    def from_data(cls, doc: Any, where: str = "map") -> NameMap:
        """Build from parsed JSON/YAML (see the module docstring for the forms)."""
        transpose: list[str] = []
        if isinstance(doc, Mapping) and ("rename" in doc or "transpose" in doc):
            extra = set(doc) - {"rename", "transpose"}
            if extra:
                raise ValueError(f"{where}: unknown keys {sorted(extra)} (expected 'rename' and 'transpose')")
            t = doc.get("transpose") or []
            if not isinstance(t, list) or not all(isinstance(g, str) for g in t):
                raise ValueError(f"{where}: 'transpose' must be a list of globs")
            transpose = list(t)
            doc = doc.get("rename") or []
        pairs: Iterable[Any] = doc.items() if isinstance(doc, Mapping) else doc
        if not isinstance(pairs, Iterable) or isinstance(pairs, (str, bytes)):
            raise ValueError(f"{where}: renames must be a list of [pattern, replacement] pairs or an object")
        rules: list[tuple[re.Pattern[str], str | None]] = []
        for p in pairs:
            if not isinstance(p, (list, tuple)) or len(p) != 2 or not isinstance(p[0], str) or not (
                    p[1] is None or isinstance(p[1], str)):
                raise ValueError(f"{where}: each rename is [pattern, replacement-or-null], not {p!r}")
            try:
                rules.append((re.compile(p[0]), p[1]))
            except re.error as e:
                raise ValueError(f"{where}: bad regular expression {p[0]!r}: {e}") from e
        return cls(rules, transpose)


def load_name_map(path: str | os.PathLike[str]) -> NameMap:
    """Read a map file: JSON, or YAML (``.yaml``/``.yml``, needs PyYAML)."""
    p = os.fspath(path)
    with open(p, "rb") as f:
        raw = f.read(MAX_MAP_BYTES + 1)
    if len(raw) > MAX_MAP_BYTES:
        raise ValueError(f"{p} is larger than the {MAX_MAP_BYTES}-byte limit for a map file")
    if p.endswith((".yaml", ".yml")):
        try:
            import yaml  # optional: only YAML map files need PyYAML
        except ImportError as e:
            raise ValueError(f"{p} is YAML, which needs PyYAML (pip install 'ocdbt-py[yaml]'); or write it as "
                             "JSON") from e
        try:
            doc = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ValueError(f"{p} is not valid YAML: {e}") from e
    else:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ValueError(f"{p} is not valid JSON: {e}") from e
    return NameMap.from_data(doc, where=p)


def glob_matcher(globs: Iterable[str] | Callable[[str], bool] | None) -> Callable[[str], bool]:
    """A predicate from globs (``fnmatch``, case-sensitive), a predicate, or ``None`` (never)."""
    if globs is None:
        return lambda name: False
    if callable(globs):
        return globs
    if isinstance(globs, str):
        globs = [globs]
    gl = list(globs)
    return lambda name: any(fnmatch.fnmatchcase(name, g) for g in gl)
