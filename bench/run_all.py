"""Run every benchmark script in this directory, one after another (``make bench``).

Each prints its own table of ours vs TensorStore/Orbax ratios measured in the same run.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
failed = []
for script in sorted(glob.glob(os.path.join(here, "bench_*.py"))):
    print(f"\n### {os.path.basename(script)}\n", flush=True)
    if subprocess.run([sys.executable, script]).returncode:
        failed.append(os.path.basename(script))
if failed:
    print("failed:", ", ".join(failed))
    sys.exit(1)
