"""Orbax's own public-API tests as ocdbt_py.orbax's acceptance tests.

Copies Orbax's test files from a local Orbax source (never fetched here: ``OCDBT_ORBAX_SRC``
names a checkout, its ``checkpoint/orbax/checkpoint`` directory, or a git directory; else
``~/.cache/ocdbt-py/orbax-src`` or a copy extracted earlier from a git directory,
``~/.cache/ocdbt-py/orbax-src-<commit>``) into a temporary directory and runs each file twice under
pytest, in subprocesses (JAX on 8 CPU devices):

* ``baseline``: as written, against the installed orbax-checkpoint;
* ``dropin``: ``orbax.checkpoint`` imports rewritten to ``_ocdbt_dropin`` (``_dropin.py``), so
  the public modules are ``ocdbt_py.orbax``'s while ``test_utils`` and the ``_src`` internals
  stay Orbax's.

A test is *counted* when it passes on the baseline and, on the drop-in, does not (a) run
Orbax's own handlers, checkpointers or managers (e.g. through ``test_utils``' subclasses of
them), (b) hand ``ocdbt_py.orbax`` an object of Orbax's own internals
(``ForeignOrbaxObjectError``), (c) fail reaching into a private (``_``) attribute of
``ocdbt_py.orbax``'s objects, or (d) steer the code under test by patching (``unittest.mock``,
outside ``setUp``) a function or class of Orbax's ``_src`` internals, which ``ocdbt_py.orbax`` never calls (e.g.
``gcs_utils.is_gcs_path`` to send a local directory down the GCS path); (a) and (d) take a
test out whether it passes or fails.  Those are out of the count, listed with the internal they need.
A public Orbax name ``ocdbt_py.orbax`` lacks is a failure (a gap), not an internal.

    python conformance/orbax_suite/suite.py [--files NAME ...] [--fast] [--json OUT] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = Path(os.path.expanduser("~/.cache/ocdbt-py/orbax-src"))
SUBDIR = "checkpoint/orbax/checkpoint"

# test file (relative to orbax/checkpoint/) -> the name it gets in the work directory
FILES: dict[str, str] = {
    "checkpoint_manager_options_test.py": "checkpoint_manager_options_test.py",
    "_src/composite_test.py": "composite_test.py",
    "_src/checkpoint_managers/preservation_policy_test.py": "preservation_policy_test.py",
    "checkpoint_args_test.py": "checkpoint_args_test.py",
    "checkpoint_utils_test.py": "checkpoint_utils_test.py",
    "_src/handlers/json_checkpoint_handler_test.py": "json_checkpoint_handler_test.py",
    "_src/handlers/composite_checkpoint_handler_test.py": "composite_checkpoint_handler_test.py",
    "_src/handlers/standard_checkpoint_handler_test.py": "standard_checkpoint_handler_test.py",
    "_src/checkpointers/checkpointer_test.py": "checkpointer_test.py",
    "_src/checkpointers/async_checkpointer_test.py": "async_checkpointer_test.py",
    "_src/handlers/pytree_checkpoint_handler_test.py": "pytree_checkpoint_handler_test.py",
    "checkpoint_manager_test.py": "checkpoint_manager_test.py",
    "experimental/emergency/checkpoint_manager_test.py": "emergency_checkpoint_manager_test.py",
    "experimental/emergency/single_slice_checkpoint_manager_test.py": "single_slice_checkpoint_manager_test.py",
}
# helper modules the test files import; copied (and rewritten) next to them
HELPERS = {
    "_src/checkpointers/checkpointer_test_utils.py": "checkpointer_test_utils.py",
    "_src/handlers/standard_checkpoint_handler_test_utils.py": "standard_checkpoint_handler_test_utils.py",
    "_src/testing/multiprocess_test.py": "multiprocess_test.py",
    "_src/testing/oss/multiprocess_test.py": "oss_multiprocess_test.py",
}
# what `make test` runs by default: small files that still cross the manager and handlers
FAST = ["checkpoint_manager_options_test.py", "composite_test.py", "preservation_policy_test.py",
        "json_checkpoint_handler_test.py", "standard_checkpoint_handler_test.py"]

_FROM = re.compile(r"^(\s*)from (orbax\.checkpoint(?:\.[\w.]+)?) import (\w+)(\s+as\s+\w+)?\s*(#.*)?$")
_IMPORT = re.compile(r"^(\s*)import (orbax\.checkpoint(?:\.[\w.]+)?)(\s+as\s+\w+)\s*(#.*)?$")


def _checkout_dir(p: Path) -> Path | None:
    for cand in (p / SUBDIR, p / "orbax/checkpoint", p):
        if (cand / "checkpoint_manager_test.py").is_file():
            return cand
    return None


def find_source() -> Path | None:
    """Orbax's ``orbax/checkpoint`` source directory, or ``None`` when there is none locally.

    ``OCDBT_ORBAX_SRC`` may name a git directory (a bare mirror): its ``HEAD``'s files are
    extracted once into the cache directory.
    """
    env = os.environ.get("OCDBT_ORBAX_SRC")
    if env:
        p = Path(env).expanduser()
        found = _checkout_dir(p)
        if found is not None:
            return found
        if (p / "HEAD").is_file() and (p / "objects").is_dir():
            return _extract_git(p)
        return None
    for cand in [CACHE, *sorted(CACHE.parent.glob("orbax-src-*"))] if CACHE.parent.is_dir() else [CACHE]:
        found = _checkout_dir(cand)
        if found is not None:
            return found
    return None


def _extract_git(git_dir: Path) -> Path | None:
    rev = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=False).stdout.strip()
    if not rev:
        return None
    dest = CACHE.parent / f"orbax-src-{rev[:12]}"
    if _checkout_dir(dest) is None:
        tmp = Path(tempfile.mkdtemp(prefix="orbax-src-", dir=CACHE.parent if CACHE.parent.exists() else None))
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "HEAD", SUBDIR],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            tmp.rename(dest)
    return _checkout_dir(dest)


def rewrite(text: str, mode: str) -> str:
    """A test file's source with its helper imports local and, in ``dropin`` mode, its
    ``orbax.checkpoint`` imports going through ``_ocdbt_dropin`` (``test_utils`` excepted)."""
    helpers = {"orbax.checkpoint." + rel[:-3].replace("/", "."): Path(n).stem for rel, n in HELPERS.items()}
    out = []
    for line in text.splitlines():
        m = _FROM.match(line)
        if m and f"{m.group(2)}.{m.group(3)}" in helpers:
            line = f"{m.group(1)}import {helpers[m.group(2) + '.' + m.group(3)]}{m.group(4) or ' as ' + m.group(3)}"
        elif mode == "dropin" and m and "test_utils" not in m.group(2) and m.group(3) != "test_utils":
            line = f"{m.group(1)}from {m.group(2).replace('orbax.checkpoint', '_ocdbt_dropin', 1)} import " \
                   f"{m.group(3)}{m.group(4) or ''}"
        else:
            mi = _IMPORT.match(line)
            if mode == "dropin" and mi and "test_utils" not in mi.group(2):
                line = f"{mi.group(1)}import {mi.group(2).replace('orbax.checkpoint', '_ocdbt_dropin', 1)}" \
                       f"{mi.group(3)}"
        out.append(line)
    return "\n".join(out) + "\n"


def prepare(src: Path, work: Path, mode: str) -> None:
    """Copy (and rewrite) every test file and helper of :data:`FILES` into ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    for rel, name in {**FILES, **HELPERS}.items():
        if (src / rel).is_file():
            (work / name).write_text(rewrite((src / rel).read_text(encoding="utf-8"), mode), encoding="utf-8")
    (work / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n", encoding="utf-8")


# seconds one test may take before pytest-timeout fails it (default 120): the checkpointer files'
# slowest tests take about 20 s, so a hang in a background save fails in a minute, not in two
PER_TEST_TIMEOUT = {"async_checkpointer_test.py": 60, "checkpointer_test.py": 60}


def run_files(work: Path, mode: str, names: list[str], timeout: float = 3600) -> dict[str, dict[str, Any]]:
    """Run several copied test files in one pytest process (one JAX start-up instead of one
    per file: what ``make test`` runs); the records of each, as :func:`run_file` gives them."""
    if len(names) == 1:
        return {names[0]: run_file(work, mode, names[0], timeout)}
    per_test = max(PER_TEST_TIMEOUT.get(n, 120) for n in names)
    batch = run_file(work, mode, "batch", timeout, per_test, files=names)
    out: dict[str, dict[str, Any]] = {}
    for n in names:
        mine = {k: v for k, v in batch["tests"].items() if k.split("::", 1)[0] == n}
        errors = [e for e in batch["collect_errors"] if e["nodeid"].split("::", 1)[0] in (n, "batch")]
        out[n] = {"tests": mine, "collect_errors": errors, "seconds": batch["seconds"]}
    return out


def run_file(work: Path, mode: str, name: str, timeout: float = 3600, per_test: int | None = None,
             files: list[str] | None = None) -> dict[str, Any]:
    """Run one copied test file (or ``files``, recorded under ``name``); its records (``tests``,
    ``collect_errors``) and ``seconds`` (``per_test``: the per-test timeout, by default from
    :data:`PER_TEST_TIMEOUT` or 120 s)."""
    if per_test is None:
        per_test = PER_TEST_TIMEOUT.get(name, 120)
    out = work / f"{name}.{mode}.json"
    out.unlink(missing_ok=True)  # never read a previous run's records
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(work), str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OCDBT_SUITE_MODE"] = mode
    env["OCDBT_SUITE_RESULTS"] = str(out)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    tmp = Path(tempfile.mkdtemp(prefix=f"{mode}-{name[:-3]}-", dir=work))
    env["TEST_TMPDIR"] = str(tmp)  # absl's test directories: one per run, never shared
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "_suite_plugin", f"--timeout={per_test}",
           "--rootdir", str(work), *[str(work / f) for f in (files or [name])]]
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        tail = proc.stdout[-2000:] + proc.stderr[-2000:]
    except subprocess.TimeoutExpired:
        tail = f"timed out after {timeout} s"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result: dict[str, Any] = {"tests": {}, "collect_errors": []}
    if out.is_file():
        result = json.loads(out.read_text(encoding="utf-8"))
    elif not result["tests"]:
        result["collect_errors"] = [{"nodeid": name, "error": tail}]
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def count(baseline: dict[str, Any], dropin: dict[str, Any]) -> dict[str, Any]:
    """Per-file counts: ``collected``, ``baseline`` (passing on Orbax), ``out`` (test ->
    internal it needs), ``counted``, ``passing`` and the failing tests with their errors."""
    passed = [n for n, r in baseline["tests"].items() if r["outcome"] == "passed"]
    out: dict[str, str] = {}
    failing: dict[str, str] = {}
    ok = 0
    for n in passed:
        r = dropin["tests"].get(n)
        if r is not None and r.get("orbax_ran"):
            out[n] = f"runs Orbax's own {r['orbax_ran'][0].rsplit('.', 1)[0]}"
        elif r is not None and r.get("patched"):
            out[n] = f"patches Orbax's internal {', '.join(r['patched'])}"
        elif r is None:
            err = dropin["collect_errors"][0]["error"] if dropin["collect_errors"] else "not run"
            failing[n] = "not collected: " + err.strip().splitlines()[-1][:300] if err.strip() else "not collected"
        elif r["outcome"] == "passed":
            ok += 1
        elif r.get("internal"):
            out[n] = r["internal"]
        else:
            need = f"needs public name {r['missing_public']}: " if r.get("missing_public") else ""
            failing[n] = need + (r["error"] or r["outcome"])
    return {"collected": len(baseline["tests"]), "baseline": len(passed), "out": out,
            "counted": len(passed) - len(out), "passing": ok, "failing": failing,
            "seconds": {"baseline": baseline.get("seconds"), "dropin": dropin.get("seconds")}}


def _cached(work: Path, mode: str, name: str) -> dict[str, Any] | None:
    out = work / f"{name}.{mode}.json"
    if not out.is_file():
        return None
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def run(src: Path, names: list[str], work: Path | None = None, verbose: bool = False,
        reuse_baseline: bool = False, batch: bool = False) -> dict[str, Any]:
    """Both runs of each named file (work-directory names, see :data:`FILES`); counts by file.
    ``reuse_baseline``: take the baseline records a previous run left in ``work``; ``batch``:
    every file in one pytest process per run (small files: one JAX start-up instead of one each)."""
    own = work is None
    root = Path(tempfile.mkdtemp(prefix="orbax-suite-")) if work is None else work
    try:
        for mode in ("baseline", "dropin"):
            prepare(src, root / mode, mode)
        report: dict[str, Any] = {}
        groups = [names] if batch else [[n] for n in names]
        for group in groups:
            cached = {n: _cached(root / "baseline", "baseline", n) for n in group} if reuse_baseline else {}
            bases = cached if cached and all(cached.values()) else run_files(root / "baseline", "baseline", group)
            drops = run_files(root / "dropin", "dropin", group)
            for name in group:
                report[name] = count(bases[name], drops[name])
                _report_file(verbose, name, report[name])
        return report
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def _report_file(verbose: bool, name: str, c: dict[str, Any]) -> None:
    if verbose:
        print(f"{name}: collected {c['collected']} baseline {c['baseline']} out {len(c['out'])} "
              f"counted {c['counted']} passing {c['passing']} ({c['seconds']})", flush=True)


def markdown(report: dict[str, Any]) -> str:
    """The per-file table of ``conformance/README.md``."""
    rows = ["| test file | collected | baseline (pass on Orbax) | out of count | counted | passing on drop-in |",
            "|---|---:|---:|---:|---:|---:|"]
    tot = [0, 0, 0, 0, 0]
    for name, c in report.items():
        vals = [c["collected"], c["baseline"], len(c["out"]), c["counted"], c["passing"]]
        tot = [a + b for a, b in zip(tot, vals)]
        rows.append(f"| `{name}` | " + " | ".join(str(v) for v in vals) + " |")
    rows.append("| **total** | " + " | ".join(f"**{v}**" for v in tot) + " |")
    return "\n".join(rows)


def out_of_count_markdown(report: dict[str, Any]) -> str:
    """The tests out of the count, by file and by what they need (``spec/orbax-api.md`` 4);
    parameterized cases (``test_x0``, ``test_x1``...) are listed once as ``test_x*``."""
    lines = []
    for name, c in report.items():
        by_reason: dict[str, set[str]] = {}
        counts: dict[str, int] = {}
        for test, raw in c["out"].items():
            reason = raw
            if raw.startswith("private attribute"):  # "of <X object at 0x..>" / "of 'X' object" -> "of X"
                reason = re.sub(r"[<>']| object at 0x[0-9a-f]+| object$", "", raw).replace(" of class ", " of ")
            base = re.sub(r"\d+$", "*", test.rsplit("::", 1)[-1])
            by_reason.setdefault(reason, set()).add(base)
            counts[reason] = counts.get(reason, 0) + 1
        for reason in sorted(by_reason, key=lambda r: (-counts[r], r)):
            tests = sorted(by_reason[reason])
            count = counts[reason]
            lines.append(f"* `{name}`, {reason} ({count}): " + ", ".join(f"`{t}`" for t in tests))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: run the files, print the table, optionally write the JSON report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="*", help="work-directory names (default: all)")
    ap.add_argument("--fast", action="store_true", help="only the fast subset make test runs")
    ap.add_argument("--json", type=Path, help="write the full report here")
    ap.add_argument("--work", type=Path, help="keep the work directory here")
    ap.add_argument("--out-list", type=Path, help="write the out-of-count list (markdown) here")
    ap.add_argument("--reuse-baseline", action="store_true", help="reuse the baseline records left in --work")
    ns = ap.parse_args(argv)
    src = find_source()
    if src is None:
        print("no Orbax source: set OCDBT_ORBAX_SRC (a checkout or git directory of github.com/google/orbax)",
              file=sys.stderr)
        return 2
    names = ns.files or (FAST if ns.fast else list(FILES.values()))
    started = time.monotonic()
    report = run(src, names, ns.work, verbose=True, reuse_baseline=ns.reuse_baseline, batch=ns.fast and not ns.files)
    print(markdown(report))
    print(f"total {time.monotonic() - started:.0f} s")
    if ns.json:
        ns.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    if ns.out_list:
        ns.out_list.write_text(out_of_count_markdown(report) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
