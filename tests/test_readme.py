"""Every code line of the README runs as written, against what ``make demo`` leaves behind.

Driven by the README alone, so lines added later are tested without touching this file:

* each ``python`` block runs on its own (a fresh interpreter, in a directory holding a fresh
  copy of the demo's output, ``demo-output/``), twice in a row: a reader may run any block
  alone, and again;
* the ``sh`` lines starting with ``ocdbt`` run in order with ``ocdbt`` on ``PATH``, in their own
  fresh copy (the CLI tour needs nothing the Python tour makes), twice in a row, and must exit
  0, or N when their comment says ``(exit N)`` (``ocdbt diff A B  # ... (exit 1)``); lines
  starting with ``python`` likewise;
* ``make TARGET`` lines must name targets of the Makefile (``make -n`` only: the test does not
  set up a second environment), ``pip install '.[extra]'`` (from the clone) and
  ``pip install 'ocdbt-py[extra]'`` lines extras of pyproject.toml;
* any other line fails the test: teach it here rather than leave a line untested.

The demo's closing "try next" commands must be README lines too.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ocdbt_py.demo import TRY_NEXT_CLI, TRY_NEXT_PYTHON
from tests.demo_output import DEMO_DIR, demo_output

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[str]:
    """The README's fenced code blocks in language ``lang``, in order."""
    return [body for tag, body in _FENCE.findall(README) if tag == lang]


def sh_lines() -> list[str]:
    """Every command line of the ``sh`` blocks, comments stripped."""
    return [cmd for cmd, _ in sh_lines_with_status()]


def sh_lines_with_status() -> list[tuple[str, int]]:
    """``(command, expected exit status)`` for every command line of the ``sh`` blocks."""
    out = []
    for body in blocks("sh"):
        for line in body.splitlines():
            cmd = _strip_comment(line).strip()
            if cmd:
                m = re.search(r"\(exit (\d+)\)", line[len(_strip_comment(line)):])
                out.append((cmd, int(m.group(1)) if m else 0))
    return out


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes after whitespace)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def tour_dir(cwd: Path) -> Path:
    """``cwd`` with a fresh copy of ``demo-output/`` and an ``ocdbt`` command on PATH."""
    demo_output(cwd)
    bin_dir = cwd / ".bin"
    bin_dir.mkdir()
    for name, module in (("ocdbt", "ocdbt_py.cli"),):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        script.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    return cwd


def _env(cwd: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{cwd / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


_RUNNER = textwrap.dedent(
    """
    import sys, traceback
    blocks = sys.argv[1:]
    ns = {"__name__": "__readme__"}
    for i, code in enumerate(blocks, 1):
        try:
            exec(compile(code, f"README python block {i}", "exec"), ns)
        except BaseException:
            traceback.print_exc()
            print(f"README python block {i} failed", file=sys.stderr)
            sys.exit(1)
    print(f"{len(blocks)} python blocks ran")
    """
)


def test_readme_has_tours() -> None:
    assert blocks("python"), "the README has no python block"
    assert any(c.startswith("ocdbt ") for c in sh_lines()), "the README has no CLI tour"


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_each_python_block_runs_on_its_own_twice(index: int, tmp_path: Path) -> None:
    cwd = tour_dir(tmp_path)
    code = blocks("python")[index]
    for run in (1, 2):
        p = subprocess.run([sys.executable, "-c", _RUNNER, code], cwd=cwd, env=_env(cwd),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"run {run} of block {index + 1}:\n" + p.stdout[-3000:] + p.stderr[-5000:]


def test_cli_tour_runs_on_its_own_twice(tmp_path: Path) -> None:
    cwd = tour_dir(tmp_path)
    lines = [(line, status) for line, status in sh_lines_with_status() if shlex.split(line)[0] in ("ocdbt", "python")]
    assert lines
    for run in (1, 2):
        for line, status in lines:
            p = subprocess.run(["/bin/sh", "-c", line], cwd=cwd, env=_env(cwd), capture_output=True, text=True,
                               timeout=300)
            assert p.returncode == status, f"run {run}: {line}\n{p.stdout[-2000:]}{p.stderr[-3000:]}"
            assert "Traceback" not in p.stderr, f"run {run}: {line}\n{p.stderr[-3000:]}"


def _pyproject_extras() -> set[str]:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.M))


@pytest.mark.parametrize("line", sh_lines())
def test_sh_line_is_covered(line: str) -> None:
    """``ocdbt``/``python`` lines run in the tour test; ``make`` and ``pip`` lines are checked here."""
    argv = shlex.split(line)
    if argv[0] in ("ocdbt", "python"):
        return  # run, in order and twice, by test_cli_tour_runs_on_its_own_twice
    if argv[0] == "make":
        p = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, f"{line}: {p.stderr}"
    elif argv[:2] == ["pip", "install"]:
        for spec in argv[2:]:
            name, _, extras = spec.partition("[")
            assert name in ("ocdbt-py", "."), line  # "." installs from the clone (not published yet)
            for extra in filter(None, extras.rstrip("]").split(",")):
                assert extra in _pyproject_extras(), f"{line}: no extra {extra!r} in pyproject.toml"
    else:
        pytest.fail(f"README line not covered by tests/test_readme.py: {line!r}")


def test_the_demo_suggests_readme_lines() -> None:
    lines = sh_lines()
    for cmd in TRY_NEXT_CLI:
        assert cmd.format(d=DEMO_DIR) in lines, f"the demo suggests {cmd!r}, which the README's tour lacks"
    python = "\n".join(blocks("python"))
    for snippet in TRY_NEXT_PYTHON:
        call = snippet.format(d=DEMO_DIR)
        assert call in python, f"the demo suggests {call!r}, which the README's Python tour lacks"
