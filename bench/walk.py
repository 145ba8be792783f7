"""Follow a parameter through the code: how many functions handle it, in how many files, and
how often the walk comes back to a file it had already left (issue 28's measure of structure).

Two walks, each traced with ``sys.setprofile`` / ``threading.setprofile`` in a fresh process,
every pool at one thread (``OCDBT_PY_THREADS_<PURPOSE>=1``) so the order of calls is the same
on every run:

* ``restore``: ``checkpoint.restore(path)`` of an item directory, a step directory and a
  CheckpointManager root (the latest step, two items).  A function *handles the path* when
  one of its arguments (``self`` aside) is the path itself, a ``KvStore`` rooted at or under
  it (the root's store, a step's or an item's ``PrefixStore``), or a string naming a place
  under it -- except inside ``kvstore/`` (a store turning its keys into file names below the
  root it was opened at) and ``format/`` (pure codecs, which get a file name only for their
  error messages): :data:`STORE_INSIDE`.  Array data read through an item's array store is
  not the path any more (the OCDBT database's key space, a chunk key) and does not count.
* ``save``: ``checkpoint.save(path, tree)`` (blocking, ``blocking=False``, and
  ``CheckpointManager.save`` of two items).  A function *handles the tree* when one of its
  arguments (``self`` aside) is the tree, one of its subtrees, or a list, tuple, dict or
  ocdbt-py object holding them or their leaves (up to three levels down): the tree walk.  A
  single leaf array handed to an encoder is array writing, not the walk, and does not count.

A *stop* is a distinct function (file, line, name) that handles the parameter; *files* is how
many source files they are in; a *return* is a call that handles the parameter in a file other
than the previous such call's, in a file such a call had already been made in (the walk left
that file and came back), counted over every call in the order they were made.

Counting strings everywhere (``STORE_INSIDE = ()``) gives the figures issue 28 quoted for the
code before it (a step directory: 43 stops in 20 files, 33 returns; the issue: 54, 20, 34).

Run: ``python bench/walk.py`` (prints a table; ``--json`` for the figures, ``--stops`` to list
the stops in order).  ``tests/architecture/test_walks.py`` keeps the figures from regressing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PURPOSES = ("io", "compute", "write", "copy", "http", "save", "fsync", "read", "inspect")


def _tree() -> dict[str, Any]:
    import numpy as np

    return {"params": {"dense": {"kernel": np.arange(24, dtype=np.float32).reshape(4, 6),
                                 "bias": np.zeros(6, np.float32)},
                       "embed": np.ones((3, 2), np.float16)},
            "opt": [np.full(5, 2.0), {"count": np.int64(7)}],
            "step": 3, "name": "run"}


def make_fixtures(where: Path) -> dict[str, str]:
    """The checkpoints the restore walk reads: an item, a step with items, a manager root."""
    from ocdbt_py import checkpoint
    from ocdbt_py.checkpoint.manager import CheckpointManager

    item = where / "item"
    checkpoint.save(item, _tree())
    root = where / "root"
    with CheckpointManager(root) as mgr:
        for step in (1, 2):
            mgr.save(step, {"state": _tree(), "extra": {"note": "json item"}}, force=True)
    return {"item": str(item), "root": str(root), "step": str(root / "2")}


class Trace:
    """The functions of ocdbt_py (and zarr3) entered with an argument ``matches`` accepts."""

    def __init__(self, matches: Any):
        self.matches = matches
        self.stops: list[tuple[str, int, str]] = []
        #: every call that handled the parameter, in order (a stop may recur)
        self.calls: list[tuple[str, int, str]] = []
        self._seen: set[tuple[str, int, str]] = set()
        self._lock = threading.Lock()
        self._prefixes = (str(ROOT / "ocdbt_py") + os.sep, str(ROOT / "zarr3") + os.sep)

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(self._prefixes):
            return
        where = (os.path.relpath(code.co_filename, ROOT), code.co_firstlineno, code.co_name)
        n = code.co_argcount + code.co_kwonlyargcount
        names = code.co_varnames[:n]
        values = [frame.f_locals.get(v) for v in names if v not in ("self", "cls")]
        if any(self.matches(v, where[0]) for v in values):
            with self._lock:
                self.calls.append(where)
                if where not in self._seen:
                    self._seen.add(where)
                    self.stops.append(where)

    def run(self, fn: Any) -> Any:
        threading.setprofile(self)
        sys.setprofile(self)
        try:
            return fn()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]


def figures(stops: list[tuple[str, int, str]]) -> dict[str, Any]:
    """Returns (entries into a file left before) over a sequence of calls, and the files
    entered most."""
    files = [f for f, _, _ in stops]
    returns = 0
    entered: dict[str, int] = {}
    prev = None
    for f in files:
        if f != prev:
            entered[f] = entered.get(f, 0) + 1
            if entered[f] > 1:
                returns += 1
        prev = f
    top = sorted(((n, f) for f, n in entered.items() if n > 1), reverse=True)[:5]
    return {"stops": len(stops), "files": len(set(files)), "returns": returns,
            "entered": {f: n for n, f in top}}


#: Where a string naming a place under the path does not count: a store turning its keys into
#: file names below the root it was opened at (the one place that must know where it is), and
#: the pure codecs, which do no I/O and get a file name only to put in their error messages.
STORE_INSIDE = ("ocdbt_py/kvstore/", "ocdbt_py/format/")


def _is_location(root: str, given: Any = None) -> Any:
    from ocdbt_py.kvstore.base import KvStore

    base = os.path.realpath(root)

    def url_path(u: str) -> str:
        for scheme in ("file://", "local://"):
            if u.startswith(scheme):
                u = u[len(scheme):]
        return os.path.realpath(u) if u.startswith("/") else u

    def match(v: Any, file: str) -> bool:
        if v is given:
            return True
        if isinstance(v, KvStore):
            try:
                u = v.url
            except Exception:
                return False
            p = url_path(u)
            return p == base or p.startswith(base + os.sep)
        if isinstance(v, (str, os.PathLike)) and not file.startswith(STORE_INSIDE):
            s = os.fspath(v)
            if not isinstance(s, str) or not s.startswith(("/", "file://")):
                return False
            p = url_path(s)
            return p == base or p.startswith(base + os.sep)
        return False

    return match


def _holds(tree: Any) -> Any:
    import numpy as np

    ids: set[int] = set()
    containers: set[int] = set()

    def collect(x: Any) -> None:
        if isinstance(x, dict):
            containers.add(id(x))
            for v in x.values():
                collect(v)
        elif isinstance(x, (list, tuple)):
            containers.add(id(x))
            for v in x:
                collect(v)
        else:
            ids.add(id(x))

    collect(tree)
    ids = {i for i in ids}

    def match(v: Any, file: str = "", depth: int = 0) -> bool:
        if id(v) in containers:
            return True
        if depth and id(v) in ids and isinstance(v, np.ndarray | np.generic):
            return True
        if depth >= 3 or isinstance(v, (str, bytes, int, float, np.ndarray)) or v is None:
            return False
        if isinstance(v, dict):
            return any(match(x, file, depth + 1) for x in list(v.values())[:64])
        if isinstance(v, (list, tuple)):
            return any(match(x, file, depth + 1) for x in list(v)[:64])
        d = getattr(v, "__dict__", None)
        if isinstance(d, dict) and type(v).__module__.startswith(("ocdbt_py", "zarr3")):
            return any(match(x, file, depth + 1) for x in list(d.values())[:64])
        return False

    return match


def _result(t: Trace) -> dict[str, Any]:
    calls = figures(t.calls)
    return {"stops": len(t.stops), "files": len({f for f, _, _ in t.stops}), "returns": calls["returns"],
            "entered": calls["entered"], "stop_list": [f"{f}:{line} {name}" for f, line, name in t.stops]}


def walk_restore(path: str) -> dict[str, Any]:
    """The restore walk of ``path`` (run in a fresh process)."""
    from ocdbt_py import checkpoint

    t = Trace(_is_location(path, path))
    t.run(lambda: checkpoint.restore(path))
    return _result(t)


def walk_save(where: str, how: str = "blocking") -> dict[str, Any]:
    """The save walk of a tree (run in a fresh process): ``blocking`` (``checkpoint.save``),
    ``async`` (``blocking=False``, then ``wait()``) or ``manager`` (``CheckpointManager.save``
    of two items, then ``wait_until_finished()``)."""
    from ocdbt_py import checkpoint
    from ocdbt_py.checkpoint.manager import CheckpointManager

    tree = _tree()
    dest = os.path.join(where, "saved-" + how)
    t = Trace(_holds(tree))
    if how == "blocking":
        t.run(lambda: checkpoint.save(dest, tree))
    elif how == "async":
        t.run(lambda: checkpoint.save(dest, tree, blocking=False).wait())
    else:
        mgr = CheckpointManager(dest)

        def run() -> None:
            mgr.save(1, {"state": tree, "extra": {"note": "json item"}})
            mgr.wait_until_finished()

        t.run(run)
        mgr.close()
    return _result(t)


def _child(kind: str, arg: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.update({f"OCDBT_PY_THREADS_{p.upper()}": "1" for p in PURPOSES})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    r = subprocess.run([sys.executable, __file__, "--child", kind, arg], capture_output=True, text=True,
                       env=env, timeout=300, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure() -> dict[str, dict[str, Any]]:
    """Every walk: ``{"restore <kind>": figures, "save": figures}``."""
    with tempfile.TemporaryDirectory() as d:
        fx = make_fixtures(Path(d))
        out = {f"restore {k}": _child("restore", v) for k, v in fx.items()}
        for how in ("blocking", "async", "manager"):
            out[f"save {how}"] = _child(f"save-{how}", d)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--stops", action="store_true", help="list each walk's stops in order")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, arg = a.child
        print(json.dumps(walk_restore(arg) if kind == "restore" else walk_save(arg, kind.split("-")[1])))
        return 0
    got = measure()
    if a.json:
        print(json.dumps({k: {x: v[x] for x in ("stops", "files", "returns")} for k, v in got.items()}))
        return 0
    print(f"{'walk':<16} {'stops':>5} {'files':>5} {'returns':>7}  files entered more than once")
    for k, v in got.items():
        again = ", ".join(f"{f} x{n}" for f, n in v["entered"].items())
        print(f"{k:<16} {v['stops']:>5} {v['files']:>5} {v['returns']:>7}  {again}")
        if a.stops:
            for s in v["stop_list"]:
                print("    " + s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
