"""Run every snippet twice, with ``orbax.checkpoint`` and with ``ocdbt_py.orbax``, and cross
the reads (8 forced CPU devices).  Usage: ``python _twice_worker.py WORKDIR REPORT.json [NAMES...]``.

The report maps each snippet to ``{"orbax": {...}, "ours": {...}, "orbax_reads_ours": {...},
"ours_reads_orbax": {...}}`` (each ``{"write": ..., "read": ...}`` or ``{"error": ...}``).
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import _snippets as S  # noqa: E402
import orbax.checkpoint as real  # noqa: E402

import ocdbt_py.orbax as ours  # noqa: E402

warnings.filterwarnings("ignore")


def _call(fn: Any, *a: Any) -> Any:
    try:
        return fn(*a)
    except Exception as e:  # noqa: BLE001 - reported
        return {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}


def run(name: str, work: Path) -> dict[str, Any]:
    write = getattr(S, f"{name}_write")
    read = getattr(S, f"{name}_read")
    a, b = str(work / name / "orbax"), str(work / name / "ours")
    os.makedirs(a, exist_ok=True)
    os.makedirs(b, exist_ok=True)
    return {
        "orbax": {"write": _call(write, real, a), "read": _call(read, real, a)},
        "ours": {"write": _call(write, ours, b), "read": _call(read, ours, b)},
        "orbax_reads_ours": {"read": _call(read, real, b)},
        "ours_reads_orbax": {"read": _call(read, ours, a)},
    }


def main() -> None:
    work, report = Path(sys.argv[1]), Path(sys.argv[2])
    names = sys.argv[3:] or S.SNIPPETS
    out = {n: run(n, work) for n in names}
    report.write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
