"""Issue 33's behaviour-parity table, tested both ways: the same scripts
(``_parity_scripts.py``) run with ``orbax.checkpoint`` 0.12.8 and with ``ocdbt_py.orbax`` in
subprocesses with 8 host CPU devices (and 4 for a read where the saved devices do not
exist); what user code observes must be equal, and each library must read what the other
wrote the same way.

* ``sharding``: ``StandardCheckpointer().restore(path, jax.eval_shape(...))`` lands on the
  saved shardings; where the saved devices are missing, a ``ValueError``;
* ``partial_target``: a restore target lacking a saved key (or naming one not saved) raises
  ``ValueError``; ``PyTreeRestore(partial_restore=True)`` restores what it names;
* ``custom_policy_log``: a custom ``PreservationPolicy`` calling
  ``preservation_policy._log_preservation_decision``;
* ``emergency_persistent``: the emergency manager's persistent tier, every 4 steps over 1..6,
  keeps ``[1, 4]``.

The same machinery runs the checkpointing parts of real training code (``_realcode_scripts``:
MaxText's checkpointing module, Flax's examples, Orbax's guides), with only the import
changed: same steps saved and kept, same values and shardings, each library restoring the
other's output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _parity_scripts as S  # noqa: E402
import _realcode_scripts as R  # noqa: E402

pytestmark = [pytest.mark.orbax, pytest.mark.timeout(900)]


def _have_oracle() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("jax", "orbax.checkpoint", "tensorstore"))


def _worker(devices: int, work: Path, report: Path, phase: str, module: str, *names: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    proc = subprocess.run([sys.executable, str(HERE / "_parity_worker.py"), str(devices), str(work), str(report),
                           phase, module, *names], env=env, capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(report.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not _have_oracle():
        pytest.skip("needs jax, orbax-checkpoint and tensorstore")
    work = tmp_path_factory.mktemp("parity")
    out = _worker(8, work, work / "report8.json", "write", "_parity_scripts")
    fewer = _worker(4, work, work / "report4.json", "read", "_parity_scripts", *S.FEWER_DEVICES)
    for name, r in fewer.items():
        out[f"{name}@4"] = r
    return out


def _ok(part: Any, what: str) -> Any:
    if isinstance(part, dict) and "script_error" in part:
        pytest.fail(f"{what}: {part['script_error']}\n{part.get('trace', '')}")
    return part


@pytest.mark.parametrize("name", S.SCRIPTS + [f"{n}@4" for n in S.FEWER_DEVICES])
def test_same_observations(report: dict[str, Any], name: str) -> None:
    r = report[name]
    if "orbax_write" in r:
        assert _ok(r["ours_write"], "ours write") == _ok(r["orbax_write"], "orbax write")
    expected = _ok(r["orbax"], "orbax read")
    assert _ok(r["ours"], "ours read") == expected
    assert _ok(r["orbax_reads_ours"], "Orbax reading ours") == expected
    assert _ok(r["ours_reads_orbax"], "ours reading Orbax") == expected


def test_rows_say_what_the_issue_says(report: dict[str, Any]) -> None:
    """The observations are the table's (so equality above is not equality of two failures)."""
    saved = report["sharding"]["orbax"]["eval_shape_target"]["w"]["sharding"]
    assert saved["mesh"] == {"data": 2, "model": 4} and saved["spec"] == ["data", "model"]
    assert report["sharding@4"]["ours"]["eval_shape_target"] == {"error": True, "ValueError": True,
                                                                 "FileNotFoundError": False}
    for case in ("lacks_key", "lacks_key_numpy", "extra_key", "pytree_lacks_key"):
        assert report["partial_target"]["ours"][case]["ValueError"] is True, case
    assert report["custom_policy_log"]["ours_write"]["kept"][-1] == [0, 2, 4, 5]
    assert report["emergency_persistent"]["ours_write"]["persistent_dirs"] == [1, 4]


@pytest.fixture(scope="module")
def realcode(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not _have_oracle() or importlib.util.find_spec("flax") is None or importlib.util.find_spec("optax") is None:
        pytest.skip("needs jax, orbax-checkpoint, tensorstore, flax and optax")
    work = tmp_path_factory.mktemp("realcode")
    return _worker(8, work, work / "realcode.json", "write", "_realcode_scripts")


@pytest.mark.parametrize("name", R.SCRIPTS)
def test_real_code_runs_the_same(realcode: dict[str, Any], name: str) -> None:
    test_same_observations(realcode, name)
