"""The import graph of ``ocdbt_py`` and ``zarr3``, read from the source (nothing is imported).

Every way one module can reach another counts as an edge:

* ``import`` / ``from ... import`` at the top of a module (``kind="top"``);
* the same inside a function (``"function"``), e.g. a lazy ``__getattr__``;
* the same under ``if TYPE_CHECKING:`` (``"type_checking"``): never run, but still an arrow a
  reader follows;
* an *import string*: a string constant that is exactly a module's dotted name, as passed to
  ``importlib.import_module`` or kept in a lazy ``__getattr__`` table (``"string"``);
* the packages an import loads on the way (``from a.b import c`` runs ``a/b/__init__.py``):
  every package above the target that is not already above the importer, except the two
  top-level packages (``"package"``).

``from p import m`` with ``m`` a submodule is an edge to ``p.m`` (plus ``p`` as a package loaded
on the way, unless ``p`` is above the importer, whose import has already run it); a name defined
by ``p`` itself makes it an edge to ``p``.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ocdbt_py", "zarr3")

#: the kinds of edge that do not run when the importing module is imported
LAZY_KINDS = frozenset({"function", "type_checking", "string"})


@dataclasses.dataclass(frozen=True)
class Edge:
    """``source`` reaches ``target`` at ``line``; ``kind`` says how (see the module docstring)."""

    source: str
    target: str
    line: int
    kind: str = "top"

    @property
    def lazy(self) -> bool:
        """Whether the edge is not followed when ``source`` is imported."""
        return self.kind in LAZY_KINDS


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages under ``root``, by dotted name."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _lines(tree: ast.Module, pick: type | tuple[type, ...], test: str | None = None) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, pick) and (test is None or test in ast.unparse(node.test)):  # type: ignore[attr-defined]
            body = node.body if test else [node]  # type: ignore[attr-defined]
            for sub in body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _resolve(t: str, mods: dict[str, Path]) -> str:
    while t and t not in mods:
        t = t.rpartition(".")[0]
    return t


def _packages_loaded(source: str, target: str, mods: dict[str, Path]) -> list[str]:
    """The packages importing ``target`` runs that ``source`` has not already run."""
    parts = target.split(".")
    out = []
    for n in range(2, len(parts)):
        pkg = ".".join(parts[:n])
        if pkg in mods and not (source == pkg or source.startswith(pkg + ".")):
            out.append(pkg)
    return out


def _raw_targets(node: ast.AST, name: str, is_pkg: bool, mods: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = name.split(".") if is_pkg else name.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
        # a name defined by the module after ``from`` (not a submodule of it) is an edge to it
        return subs + ([base] if len(subs) < len(node.names) else [])
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value and node.value in mods:
        return [node.value]
    return []


def edges(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Edge]:
    """Every edge between modules of the packages under ``root``, of every kind."""
    mods = modules(root, packages)
    out: set[Edge] = set()
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        typing_only = _lines(tree, ast.If, "TYPE_CHECKING")
        in_func = _lines(tree, (ast.FunctionDef, ast.AsyncFunctionDef))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets = _raw_targets(node, name, is_pkg, mods)
            if not targets:
                continue
            line = node.lineno  # type: ignore[attr-defined]
            if isinstance(node, ast.Constant):
                kind = "string"
            elif line in typing_only:
                kind = "type_checking"
            else:
                kind = "function" if line in in_func else "top"
            for raw in targets:
                t = _resolve(raw, mods)
                if not t or t == name or t.split(".")[0] not in packages:
                    continue
                out.add(Edge(name, t, line, kind))
                for pkg in _packages_loaded(name, t, mods):
                    out.add(Edge(name, pkg, line, "package" if kind == "top" else kind))
    return sorted(out, key=lambda e: (e.source, e.line, e.target, e.kind))


def cycles(all_edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in all_edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
