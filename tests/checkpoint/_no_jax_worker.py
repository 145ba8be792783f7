"""Run inside a subprocess where JAX, jaxlib, TensorStore and Orbax cannot be imported.

Usage: python _no_jax_worker.py CORPUS_DIR.  Restores, lazily restores, describes and exports
every corpus case, compares with Orbax's recorded restore, prints a JSON summary.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import warnings
from pathlib import Path

BLOCKED = ("jax", "jaxlib", "tensorstore", "orbax")


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is blocked for this test", name=name)
        return None


sys.meta_path.insert(0, _Block())


def main() -> int:
    root = Path(sys.argv[1])
    here = Path(__file__).resolve().parents[2] / "conformance" / "checkpoint"
    sys.path.insert(0, str(here))
    import numpy as np
    from _expected import compare, load_expected

    from ocdbt_py import bridges, checkpoint

    try:
        import jax  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("jax import was not blocked")
    info = json.loads((root / "corpus.json").read_text())
    results: dict[str, list[str]] = {}
    for name, case in info["cases"].items():
        if "expected" not in case:
            continue
        item = case.get("item") if case.get("tier", "").startswith("local") else None
        expected = load_expected(str(root / case["expected"]))["tree"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = checkpoint.restore(root / case["path"], item=item)
            lazy = checkpoint.restore(root / case["path"], item=item, lazy=True)
            checkpoint.metadata(root / case["path"], item=item)
        errs = compare(expected, got)

        def mat(x):  # noqa: ANN001, ANN202
            if isinstance(x, checkpoint.LazyArray):
                return np.asarray(x)
            if isinstance(x, dict):
                return {k: mat(v) for k, v in x.items()}
            if isinstance(x, list):
                return [mat(v) for v in x]
            if isinstance(x, tuple):
                return tuple(mat(v) for v in x)
            return x

        errs += compare(expected, mat(lazy))
        results[name] = errs
    out = root.parent / "no_jax_export.safetensors"
    names = bridges.export_safetensors(root / info["cases"]["chunked_zarr2"]["path"], out)
    leaked = [m for m in sys.modules if m.split(".")[0] in BLOCKED]
    print(json.dumps({"results": results, "exported": names, "leaked": leaked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
