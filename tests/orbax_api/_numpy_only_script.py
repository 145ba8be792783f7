"""The NumPy-only Orbax snippets with ``jax``, ``orbax`` and ``tensorstore`` unimportable.

Run as ``python _numpy_only_script.py WORKDIR``; prints one JSON line of results.
"""

from __future__ import annotations

import sys


class _Blocker:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in ("jax", "jaxlib", "orbax", "tensorstore"):
            raise ImportError(f"{name} is blocked in this test")
        return None


sys.meta_path.insert(0, _Blocker())

import json  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "conformance" / "orbax_api"))
sys.path.insert(0, str(HERE.parents[1]))

import _snippets as S  # noqa: E402

import ocdbt_py.orbax as ocp  # noqa: E402


def main() -> None:
    work = Path(sys.argv[1])
    out = {}
    for name in S.NUMPY:
        root = work / name
        root.mkdir(parents=True, exist_ok=True)
        out[name] = {"write": getattr(S, f"{name}_write")(ocp, str(root)),
                     "read": getattr(S, f"{name}_read")(ocp, str(root))}
    out["jax_loaded"] = any(m == "jax" or m.startswith("jax.") for m in sys.modules)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
