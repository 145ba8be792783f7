"""The structure ``spec/architecture.md`` describes, checked on the source.

Layers point one way and there are no import cycles, counting every kind of import
(top-level, in a function, under ``TYPE_CHECKING``, import strings, packages loaded on the way:
``imports.py``), the pure
codecs import nothing but themselves and the errors, nothing outside ``cli/`` imports ``cli/``,
no layer above ``kvstore/`` tests for concrete store types, ``checkpoint/`` keeps few loose
modules and no function grows past 100 lines.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import imports  # noqa: E402  (the graph reader beside this file)

#: Each layer may import its own modules and layers of a lower rank, never a higher one nor
#: another layer of the same rank.  A new top-level package or module must be placed here.
RANK: dict[str, float] = {
    "ocdbt_py.errors": 0,
    "ocdbt_py.pools": 0,
    "ocdbt_py.timeutil": 0,
    "ocdbt_py.keys": 0,
    "ocdbt_py.units": 0,
    "ocdbt_py.format": 1,
    "ocdbt_py.kvstore": 1.5,
    "ocdbt_py.read": 2,
    "ocdbt_py.testing": 2,
    "zarr3": 2,
    "ocdbt_py.write": 3,
    "ocdbt_py.store": 4,
    "ocdbt_py": 4.5,  # the package's own facade: open, OcdbtStore, the errors
    "ocdbt_py.maintenance": 5,
    "ocdbt_py.checkpoint": 6,
    "ocdbt_py.bridges": 7,
    "ocdbt_py.inspect": 7,
    "ocdbt_py.orbax": 7.5,
    "ocdbt_py.cli": 8,
    "ocdbt_py.demo": 8,
}

CONCRETE_STORES = {
    "LocalStore", "FsspecStore", "PrefixStore", "MemoryStore", "ObjectStore", "S3Store", "GcsStore",
    "AzureStore", "SingleWriterStore", "LatencyStore", "FaultyStore", "OcdbtKvStore",
}

EDGES = imports.edges()
MODULES = imports.modules()


def layer(module: str) -> str:
    """The layer a module belongs to (the longest :data:`RANK` key that prefixes it)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in RANK:
            return name
    raise AssertionError(f"{module} belongs to no layer: add its package to RANK in {__file__}")


def test_every_module_has_a_layer() -> None:
    for m in MODULES:
        layer(m)


def test_no_import_cycles() -> None:
    assert imports.cycles(EDGES) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The two cycles issue 28 found, rebuilt in miniature: a facade naming a layer above it
    by import strings and ``TYPE_CHECKING``, and a package whose lazy ``__getattr__`` imports
    the module that imports the package's submodule."""
    _write(tmp_path, {
        "pk/__init__.py": "",
        "pk/low/__init__.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pk.high.tool import run\n"
            "_WHERE = {'run': 'pk.high.tool'}\n"),
        "pk/high/__init__.py": "",
        "pk/high/tool.py": "from pk.low import thing\n",
        "pk/low/thing.py": "X = 1\n",
        "pk/app/__init__.py": "",
        "pk/app/names/__init__.py": (
            "from pk.app.names import policy\n"
            "def __getattr__(name):\n    from pk.app import manager\n    return manager.M\n"),
        "pk/app/names/policy.py": "P = 1\n",
        "pk/app/manager.py": "from pk.app.names import policy\nM = policy.P\n",
    })
    got = imports.edges(tmp_path, ("pk",))
    kinds = {(e.source, e.target): e.kind for e in got}
    assert kinds[("pk.low", "pk.high.tool")] in ("type_checking", "string")
    assert {e.kind for e in got if e.source == "pk.low"} == {"type_checking", "string"}
    assert kinds[("pk.high.tool", "pk.low")] == "package"
    assert kinds[("pk.app.names", "pk.app.manager")] == "function"
    assert kinds[("pk.app.manager", "pk.app.names")] == "package"
    assert ("pk.app.names", "pk.app.names.policy") in kinds  # its own submodule: no edge to itself
    assert imports.cycles(got) == [["pk.app.manager", "pk.app.names"],
                                   ["pk.high.tool", "pk.low"]]


def test_layers_point_one_way() -> None:
    bad = []
    for e in EDGES:
        a, b = layer(e.source), layer(e.target)
        if a == b or (a == "ocdbt_py" and e.target == "ocdbt_py.store"):
            continue
        if RANK[b] >= RANK[a]:
            bad.append(f"{e.source}:{e.line} imports {e.target} ({a} may not import {b})")
    assert bad == []


def test_zarr3_needs_only_kvstore_errors_and_pools() -> None:
    bad = [e for e in EDGES if layer(e.source) == "zarr3" and layer(e.target) != "zarr3"
           and not e.target.startswith(("ocdbt_py.kvstore", "ocdbt_py.errors", "ocdbt_py.pools"))]
    assert bad == []


def test_private_modules_stay_in_their_layer() -> None:
    """A module named ``_x`` serves its own layer; what other layers use is public
    (``zarr3.engine`` is the restore engine checkpoint, inspect and bridges run on)."""
    bad = [e for e in EDGES if any(p.startswith("_") for p in e.target.split("."))
           and layer(e.source) != layer(e.target)]
    assert bad == []


def _builds_thread_pool(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] in ("ThreadPoolExecutor", "ProcessPoolExecutor")]


def test_every_pool_comes_from_pools() -> None:
    """``ThreadPoolExecutor`` is built in ``pools.py`` and at most one module of ``zarr3``; pool
    sizes come from ``pools.SIZES`` (no thread-count environment variable read elsewhere)."""
    builders: dict[str, list[int]] = {}
    env_reads = []
    for m, path in MODULES.items():
        text = path.read_text()
        lines = _builds_thread_pool(ast.parse(text))
        if lines:
            builders[m] = lines
        names = [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)
                 and isinstance(n.value, str) and re.fullmatch(r"[A-Z0-9_]*THREADS[A-Z0-9_]*", n.value)]
        if m != "ocdbt_py.pools" and names:
            env_reads.append(f"{m}: {names}")
    assert [m for m in builders if layer(m) != "zarr3"] == ["ocdbt_py.pools"]
    assert len([m for m in builders if layer(m) == "zarr3"]) <= 1
    assert env_reads == []


def test_format_imports_only_itself_and_errors() -> None:
    bad = [e for e in EDGES if layer(e.source) == "ocdbt_py.format"
           and layer(e.target) not in ("ocdbt_py.format", "ocdbt_py.errors")]
    assert bad == []


def test_nothing_outside_cli_imports_cli() -> None:
    bad = [e for e in EDGES if layer(e.target) == "ocdbt_py.cli" and layer(e.source) != "ocdbt_py.cli"]
    assert bad == []


def _type_tests(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            kinds = list(ast.walk(node.args[1])) if len(node.args) > 1 else []
            names = {n.id for n in kinds if isinstance(n, ast.Name)}
            names |= {n.attr for n in kinds if isinstance(n, ast.Attribute)}
            hit = names & CONCRETE_STORES
            if hit:
                found.append((node.lineno, ", ".join(sorted(hit))))
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and ast.unparse(node.left.func) == "type":
            names = {n.id for c in node.comparators for n in ast.walk(c) if isinstance(n, ast.Name)}
            hit = names & CONCRETE_STORES
            if hit:
                found.append((node.lineno, ", ".join(sorted(hit))))
    return found


def test_no_concrete_store_type_tests_above_kvstore() -> None:
    bad = []
    for m, path in MODULES.items():
        if layer(m) in ("ocdbt_py.kvstore", "ocdbt_py.testing"):
            continue
        for line, names in _type_tests(ast.parse(path.read_text())):
            bad.append(f"{path.relative_to(imports.ROOT)}:{line}: {names}")
    assert bad == [], "ask a KvStore capability instead (spec/kvstore.md)"


def test_checkpoint_has_few_loose_modules() -> None:
    loose = sorted(p.name for p in (imports.ROOT / "ocdbt_py" / "checkpoint").glob("*.py"))
    assert len(loose) <= 8, loose


@pytest.mark.parametrize("package", imports.PACKAGES)
def test_no_function_over_100_lines(package: str) -> None:
    long = []
    for path in sorted((imports.ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 100:
                    long.append(f"{path.relative_to(imports.ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert long == []


#: The only modules that import JAX when imported (everything else imports it lazily, so
#: ``import ocdbt_py.checkpoint`` and NumPy-only use never load JAX).
JAX_MODULES = {"ocdbt_py.checkpoint.manager.replica_broadcast", "ocdbt_py.checkpoint.restore.jax_restore"}


def test_jax_is_imported_only_where_it_is_used() -> None:
    loads_jax = set()
    for m, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                name = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name) or ""
                if name.split(".")[0] in ("jax", "jaxlib"):
                    loads_jax.add(m)
    changed = True
    while changed:  # modules that import those at their top, transitively
        changed = False
        for e in EDGES:
            if not e.lazy and e.target in loads_jax and e.source not in loads_jax:
                loads_jax.add(e.source)
                changed = True
    assert loads_jax == JAX_MODULES


def test_cli_starts_without_numpy() -> None:
    """Every command module is imported to build the parser: ``ocdbt --help`` stays fast."""
    import subprocess

    code = ("import sys; from ocdbt_py.cli.app import build_parser; build_parser(); "
            "heavy = sorted(m for m in ('numpy', 'ocdbt_py.store', 'ocdbt_py.checkpoint', 'zarr3') "
            "if m in sys.modules); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=imports.ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
