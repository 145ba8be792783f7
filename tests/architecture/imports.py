"""The import graph of ``ocdbt_py`` and ``zarr3``, read from the source (nothing is imported)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ocdbt_py", "zarr3")


@dataclasses.dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` (``lazy``: inside a function)."""

    source: str
    target: str
    line: int
    lazy: bool


def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def edges() -> list[Edge]:
    """Every import between modules of the packages (``TYPE_CHECKING`` blocks left out)."""
    mods = modules()
    out: list[Edge] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        in_func: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_func.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if node.lineno in skip if hasattr(node, "lineno") else False:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else base)
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and t.split(".")[0] in PACKAGES:
                    out.append(Edge(name, t, node.lineno, node.lineno in in_func))
    return out


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
        for w in graph[v]:
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
