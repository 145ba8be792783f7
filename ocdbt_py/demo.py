"""The ``make demo`` job: Orbax-layout checkpoints written and read back by ocdbt-py alone.

It needs only the library's runtime dependencies (NumPy, zstandard, crc32c, fsspec,
ml_dtypes): no JAX, TensorStore or Orbax.  Everything it makes stays in ``demo-output/``
(``--dir``) for the README's tours, whose commands it prints at the end.

1. ``checkpoint.save`` writes a NumPy tree (float32, bfloat16, float16, scalars, a string) in
   the layout Orbax 0.12 writes (an OCDBT database with Zarr arrays inside).
2. ``ocdbt_py.open`` reads that database: keys, statistics, ``verify``.
3. ``checkpoint.metadata`` gives shapes and dtypes without reading array data.
4. ``checkpoint.restore`` gives NumPy arrays back, compared with what was saved.
5. ``bridges.export_safetensors`` streams it into a ``.safetensors`` file.
6. A training loop with ``CheckpointManager``: async saves every 10 steps, retention by
   ``LatestN`` and ``BestN`` on the loss; the best step is restored.
7. A plain OCDBT database: one transaction per generation, reads at an older version.
8. Only when Orbax is installed (``make test`` installs it): Orbax, in a child process,
   restores the checkpoint of step 1 and reads the manager's steps; otherwise it says skipped.

Run: ``python -m ocdbt_py.demo [--dir demo-output] [--skip-orbax]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np

from ocdbt_py.units import human_bytes

#: Where ``make demo`` leaves its output (relative to the current directory).
DEFAULT_DIR = "demo-output"

#: Files shown per directory in the listing of step 1 (the rest is counted, never dropped silently).
_SHOWN_FILES = 40

#: The README's tour, as the demo's closing lines suggest it; ``{d}`` is the output directory.
TRY_NEXT_CLI = (
    "ocdbt ls {d}/ckpt -l",
    "ocdbt tree {d}/ckpt",
    "ocdbt info {d}/ckpt",
    "ocdbt verify {d}/ckpt",
    "ocdbt steps {d}/run",
    "ocdbt tree {d}/run --step 20",
    "ocdbt export {d}/ckpt {d}/model.npz --force",
    "ocdbt versions {d}/db",
    "ocdbt ls {d}/db --version 2",
    "ocdbt get {d}/db greeting --json",
)
TRY_NEXT_PYTHON = (
    'checkpoint.restore("{d}/ckpt")',
    'checkpoint.metadata("{d}/run")',
    'ocdbt_py.open("{d}/db")',
)

_LOSSES = (5.0, 3.0, 1.0, 2.0, 4.0, 3.5, 6.0)

_ORBAX_CHECK = textwrap.dedent(
    """
    import sys
    import numpy as np
    import orbax.checkpoint as ocp
    ckpt, expected, root, kept, best = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    want = np.load(expected)
    got = ocp.PyTreeCheckpointer().restore(ckpt)
    d = got["params"]["dense"]
    ok = (np.array_equal(np.asarray(d["kernel"]), want["kernel"])
          and np.array_equal(np.asarray(d["bias"]).astype(np.float32), want["bias"])
          and np.array_equal(np.asarray(got["params"]["embed"]), want["embed"])
          and int(got["step"]) == 1000 and got["name"] == "demo-run")
    print("Orbax restored", ckpt, "->", "matches" if ok else "MISMATCH")
    opts = ocp.CheckpointManagerOptions(best_fn=lambda m: m["loss"], best_mode="min")
    with ocp.CheckpointManager(root, options=opts) as mgr:
        steps = mgr.all_steps()
        same = str(steps) == kept and mgr.best_step() == best
        print("Orbax's CheckpointManager: steps", steps, "best", mgr.best_step(), "->",
              "matches" if same else "MISMATCH")
    sys.exit(0 if ok and same else 1)
    """
)


def _step(n: int, text: str) -> None:
    print(f"\n== {n}. {text}", flush=True)


def _shown_path(path: str) -> str:
    """``path`` relative to the current directory when it is below it (as the README writes it)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _list_files(root: str) -> None:
    """Every file below ``root`` with its size; past ``_SHOWN_FILES`` per directory, a count."""
    for top, dirs, files in os.walk(root):
        dirs.sort()
        files.sort()
        for f in files[:_SHOWN_FILES]:
            full = os.path.join(top, f)
            print(f"  {os.path.relpath(full, root):48s} {human_bytes(os.path.getsize(full)):>10s}")
        if len(files) > _SHOWN_FILES:
            print(f"  ... and {len(files) - _SHOWN_FILES} more files in {os.path.relpath(top, root)}/ "
                  f"(ls {_shown_path(top)})")


def _make_tree() -> dict[str, Any]:
    import ml_dtypes

    rng = np.random.default_rng(0)
    return {
        "params": {
            "dense": {"kernel": rng.standard_normal((256, 128), dtype=np.float32),
                      "bias": np.arange(128).astype(ml_dtypes.bfloat16)},
            "embed": rng.standard_normal((64, 32)).astype(np.float16),
        },
        "step": 1000,
        "lr": np.float32(3e-4),
        "mask": np.array([True, False, True]),
        "name": "demo-run",
    }


def _save_and_read(work: str, tree: dict[str, Any]) -> tuple[str, bool]:
    """Steps 1-5: save, open, verify, metadata, restore, export.  Returns (ckpt, ok)."""
    import ocdbt_py
    from ocdbt_py import bridges, checkpoint
    from ocdbt_py.maintenance.verify import verify

    ckpt = os.path.join(work, "ckpt")
    _step(1, f"checkpoint.save writes a NumPy tree in Orbax's layout to {_shown_path(ckpt)}")
    t = time.perf_counter()
    checkpoint.save(ckpt, tree)
    print(f"saved in {time.perf_counter() - t:.2f} s; files:")
    _list_files(ckpt)

    _step(2, "ocdbt_py.open reads the checkpoint's OCDBT database (what `ocdbt ls -l` shows)")
    db = ocdbt_py.open(ckpt)
    info = db.info()
    print(f"generation {info['generation']}, {info['num_keys']} keys, "
          f"{human_bytes(info['num_indirect_value_bytes'])} out-of-line values, "
          f"manifest {info['manifest_kind']}")
    entries = list(db.entries())
    for entry in entries:
        loc = entry.location
        where = "inline" if loc is None else f"{loc.file.path.decode()}:{loc.offset}"
        print(f"  {entry.key.decode():36s} {human_bytes(entry.size):>10s}  {where}")
    report = verify(ckpt)
    print(f"verify: {'clean' if report.ok else 'PROBLEMS'} "
          f"({report.nodes} nodes, {report.versions} versions, {report.data_files} data files checked)")
    for p in report.problems:
        print("  ", p)

    _step(3, "checkpoint.metadata: shapes and dtypes, no array data read")
    print(json.dumps(_summarise(checkpoint.metadata(ckpt)), indent=2))

    _step(4, "checkpoint.restore: NumPy arrays (no JAX or TensorStore in this process)")
    t = time.perf_counter()
    back = checkpoint.restore(ckpt)
    print(f"restored in {time.perf_counter() - t:.3f} s")
    same = _same_tree(back, tree)
    print(f"every leaf: {'matches what was saved' if same else 'MISMATCH'}")

    _step(5, "bridges.export_safetensors: streamed to one file, tensor by tensor")
    out = os.path.join(work, "model.safetensors")
    names = bridges.export_safetensors(ckpt, out)
    print(f"wrote {_shown_path(out)}: {len(names)} tensors, {human_bytes(os.path.getsize(out))}")
    return ckpt, report.ok and same


def _same_tree(a: Any, b: Any) -> bool:
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in b)
    if isinstance(b, np.generic):  # scalars come back as Python numbers, as Orbax gives them
        return bool(np.asarray(a).item() == b.item())
    if isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        return x.dtype == y.dtype and x.shape == y.shape and bool(np.array_equal(x, y))
    return bool(a == b)


def _manager(work: str) -> tuple[str, list[int], int | None, bool]:
    """Step 6: a training loop with async saves and retention.  Returns (root, kept, best, ok)."""
    from ocdbt_py import checkpoint
    from ocdbt_py.checkpoint.manager import BestN, CheckpointManager, FixedInterval, KeepAnyOf, LatestN

    root = os.path.join(work, "run")
    _step(6, f"CheckpointManager in {_shown_path(root)}: a save every 10 steps, keep the latest 2 and the best loss")
    t = time.perf_counter()
    with CheckpointManager(root, save_policy=FixedInterval(10),
                           preservation=KeepAnyOf(LatestN(2), BestN(1, "loss"))) as mgr:
        for step in range(70):
            params = {"w": np.full((64, 64), step, np.float32)}
            mgr.save(step, {"params": params, "config": checkpoint.JsonItem({"lr": 0.1, "step": step})},
                     metrics={"loss": _LOSSES[step // 10]})
        mgr.wait_until_finished()
        kept, best = mgr.all_steps(), mgr.best_step()
        restored = mgr.restore(best, "params")
    ok = best is not None and bool(np.array_equal(restored["w"], np.full((64, 64), best, np.float32)))
    print(f"70 steps in {time.perf_counter() - t:.2f} s; saved 0, 10, ..., 60 with losses {list(_LOSSES)}")
    print(f"kept {kept}, best {best}; restored step {best}: {'matches' if ok else 'MISMATCH'}")
    return root, kept, best, ok


def _plain_db(work: str) -> tuple[str, bool]:
    """Step 7: an OCDBT database of our own, three generations."""
    import ocdbt_py

    path = os.path.join(work, "db")
    _step(7, f"a plain OCDBT database in {_shown_path(path)}: one transaction per generation")
    db = ocdbt_py.open(path, mode="a")
    with db.transaction() as t:
        t.put(b"greeting", b"hello, OCDBT")
        t.put(b"params.w", np.arange(1024, dtype=np.float32).tobytes())
        t.put(b"params.b", np.zeros(16, np.float32).tobytes())
    db.put(b"greeting", b"hello again")
    db.delete(b"params.b")
    for v in db.versions():
        print(f"  generation {v.generation}  {v.commit_time_iso}  {v.num_keys} keys")
    old = db.at(2)  # generation 1 is the empty database the first commit created
    ok = old.get(b"greeting") == b"hello, OCDBT" and db.get(b"greeting") == b"hello again" and b"params.b" in old
    print(f"latest: greeting={db.get(b'greeting')!r}; at generation 2: greeting={old.get(b'greeting')!r}, "
          f"keys {[k.decode() for k in old.list()]}")
    db.close()
    return path, ok


def _orbax(ckpt: str, tree: dict[str, Any], root: str, kept: list[int], best: int | None, skip: bool) -> bool:
    """Step 8: Orbax reads what ocdbt-py wrote (only when Orbax is installed)."""
    _step(8, "Orbax cross-check: Orbax reads what ocdbt-py wrote")
    if skip:
        print("skipped (--skip-orbax)")
        return True
    if importlib.util.find_spec("orbax") is None or importlib.util.find_spec("jax") is None:
        print("skipped: Orbax and JAX are not installed (they are test oracles: `make test` adds them, "
              "then `make demo` runs this step too)")
        return True
    expected = os.path.join(os.path.dirname(ckpt), "ckpt.expected.npz")
    d = tree["params"]["dense"]
    np.savez(expected, kernel=d["kernel"], bias=d["bias"].astype(np.float32), embed=tree["params"]["embed"])
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _ORBAX_CHECK, ckpt, expected, root, str(kept), str(best)],
                       env=env, check=False)
    return r.returncode == 0


def _try_next(work: str) -> None:
    d = _shown_path(work)
    print(f"\n== Done. Everything is in {d}/. Try next (the README's tour):")
    for line in TRY_NEXT_CLI:
        print("  " + line.format(d=d))
    print("  python -c 'import ocdbt_py; from ocdbt_py import checkpoint; "
          f"print({TRY_NEXT_PYTHON[0].format(d=d)})'")
    for line in TRY_NEXT_PYTHON[1:]:
        print("  # in Python: " + line.format(d=d))
    print("  (run `ocdbt` as .venv/bin/ocdbt, or activate the venv: . .venv/bin/activate)")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit status."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", default=DEFAULT_DIR, help=f"output directory (default: {DEFAULT_DIR})")
    ap.add_argument("--skip-orbax", action="store_true", help="skip the Orbax cross-check even if Orbax is installed")
    args = ap.parse_args(argv)

    work = os.path.abspath(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t0 = time.perf_counter()
    tree = _make_tree()
    ckpt, ok1 = _save_and_read(work, tree)
    root, kept, best, ok2 = _manager(work)
    _, ok3 = _plain_db(work)
    loaded = [m for m in ("jax", "tensorstore", "orbax") if m in sys.modules]
    print(f"\nmodules loaded in this process from JAX/TensorStore/Orbax: {', '.join(loaded) or 'none'}")
    ok3 = ok3 and not loaded
    ok4 = _orbax(ckpt, tree, root, kept, best, args.skip_orbax)
    ok = ok1 and ok2 and ok3 and ok4
    print(f"\ndemo {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s")
    _try_next(work)
    return 0 if ok else 1


def _summarise(tree: object) -> object:
    if isinstance(tree, dict):
        return {k: _summarise(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_summarise(v) for v in tree]
    shape = getattr(tree, "shape", None)
    dtype = getattr(tree, "dtype", None)
    if shape is not None:
        return f"{dtype}{list(shape)}"
    value = getattr(tree, "value", None)
    return repr(value if value is not None else tree)


if __name__ == "__main__":
    raise SystemExit(main())
