"""Run the parity scripts with ``orbax.checkpoint`` and with ``ocdbt_py.orbax`` on N host CPU
devices.  Usage: ``python _parity_worker.py N WORKDIR REPORT.json write|read MODULE [NAMES...]``
(``MODULE``: ``_parity_scripts`` or ``_realcode_scripts``, which list their ``SCRIPTS``).

``write`` runs each script's write then read with both libraries and crosses the reads (each
library reads what the other wrote); ``read`` runs only the reads (e.g. with fewer devices
than the checkpoints were saved with).
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import importlib  # noqa: E402

import orbax.checkpoint as real  # noqa: E402

import ocdbt_py.orbax as ours  # noqa: E402

warnings.filterwarnings("ignore")


def _call(fn: Any, *a: Any) -> Any:
    try:
        return fn(*a)
    except Exception as e:  # noqa: BLE001 - reported
        return {"script_error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}


def run(S: Any, name: str, work: Path, phase: str) -> dict[str, Any]:
    write = getattr(S, f"{name}_write")
    read = getattr(S, f"{name}_read")
    a, b = str(work / name / "orbax"), str(work / name / "ours")
    out: dict[str, Any] = {}
    if phase == "write":
        os.makedirs(a, exist_ok=True)
        os.makedirs(b, exist_ok=True)
        out["orbax_write"] = _call(write, real, a)
        out["ours_write"] = _call(write, ours, b)
    out["orbax"] = _call(read, real, a)
    out["ours"] = _call(read, ours, b)
    out["orbax_reads_ours"] = _call(read, real, b)
    out["ours_reads_orbax"] = _call(read, ours, a)
    return out


def main() -> None:
    work, report, phase = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    S = importlib.import_module(sys.argv[5])
    names = sys.argv[6:] or S.SCRIPTS
    report.write_text(json.dumps({n: run(S, n, work, phase) for n in names}, default=str))


if __name__ == "__main__":
    main()
