"""``report()``/``ocdbt report``: the page's content, that it is self-contained, and how it
renders in headless Chromium (screenshot pixels, the DOM after its script ran, no console
errors, table sorting and tree collapsing by clicks)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ocdbt_py.checkpoint.manager.manager import CheckpointManager
from ocdbt_py.inspect.report import report
from tests.inspect.conftest import planted

WINDOW = (1400, 1800)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manager root of 4 steps with metrics; the last step holds NaN/Inf in a few tensors."""
    path = tmp_path_factory.mktemp("report") / "root"
    rng = np.random.default_rng(0)
    with CheckpointManager(path, async_save=False) as m:
        for s in range(4):
            tree = {
                "params": {
                    "dense": {"kernel": rng.standard_normal((128, 64)).astype(np.float32) * (s + 1),
                              "bias": np.zeros(64, np.float32)},
                    "embed": (planted("bfloat16", (200, 32)) if s == 3
                              else rng.standard_normal((200, 32)).astype(np.float32)),
                    "q": planted("int4", (64, 16)),
                },
                "opt": {"mu": rng.standard_normal(1000), "count": np.int32(s)},
            }
            if s == 3:
                tree["params"]["dense"]["kernel"][0, :3] = np.nan
            m.save(s, {"default": tree}, metrics={"loss": 2.0 / (s + 1), "accuracy": 0.2 * s}, force=True)
    return path


def test_page_content_and_self_contained(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    data = report(root, out)
    page = out.read_text("utf-8")
    assert data.step == 3 and [s for s, _ in data.metrics] == [0, 1, 2, 3]
    assert {n for n, s in data.stats.items() if s.nonfinite} == {"params.dense.kernel", "params.embed"}
    for needle in ('id="tree"', "<details", 'class="bars"', 'class="treemap"', 'class="hist"', 'class="metrics"',
                   'id="nonfinite"', 'id="stats"', "params.dense.kernel", "NaN/Inf"):
        assert needle in page, needle
    # nothing is fetched when viewing: no links, sources, imports or url() at all
    assert not re.search(r"\b(src|href)\s*=|@import|url\(|https?://", page)


def test_item_without_metrics_and_cli(root: Path, tmp_path: Path, cli: Any) -> None:
    item = root / "3" / "default"
    out = tmp_path / "item.html"
    r = cli("report", item, "-o", out)
    assert r.status == 0 and r.out.startswith(f"wrote {out} (") and "1 with NaN" not in r.out and r.err == ""
    again = cli("report", item, "-o", out)  # one overwrite rule: --force replaces
    assert again.status == 1 and again.err == f"ocdbt: error: {out} already exists: pass --force to replace it\n"
    assert cli("report", item, "-o", out, "--force").status == 0
    page = out.read_text("utf-8")
    assert 'class="metrics"' not in page and 'id="tree"' in page
    assert cli("report", item, "-o", tmp_path / "no" / "such" / "dir.html").status == 2
    assert cli("report", item).status == 2  # -o is required


def _chromium() -> str:
    """A Chromium already on this machine (``$CHROMIUM``, or ``chromium``/``chromium-browser`` on
    PATH); the test set-up installs none, so without one the browser tests skip and say how."""
    exe = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no Chromium on this machine (looked for $CHROMIUM, chromium and chromium-browser on PATH): "
                    "install one (Debian/Ubuntu: sudo apt-get install chromium) or set CHROMIUM=/path/to/chrome")
    return exe


def _run_chromium(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--enable-logging=stderr", "--v=0", f"--window-size={WINDOW[0]},{WINDOW[1]}", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_console_errors_are_seen(tmp_path: Path) -> None:
    """The console check below can fail: a page with an error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    p = _run_chromium(bad, "--dump-dom")
    assert any("undefinedFunction" in line for line in _console(p.stderr)), p.stderr[-2000:]


def _count(img: Any, box: tuple[int, int, int, int], rgb: tuple[int, int, int], tol: int = 12) -> int:
    region = np.asarray(img.crop(box).convert("RGB"), dtype=np.int16)
    return int((np.abs(region - np.array(rgb, np.int16)).max(axis=2) <= tol).sum())


def test_renders_in_chromium(root: Path, tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "r.html"
    report(root, out)
    shot = tmp_path / "shot.png"
    p = _run_chromium(out, f"--screenshot={shot}")
    assert p.returncode == 0 and shot.exists(), p.stderr[-2000:]
    assert _console(p.stderr) == []
    img = Image.open(shot)
    assert img.size == WINDOW
    arr = np.asarray(img.convert("RGB"))
    assert len(np.unique(arr.reshape(-1, 3), axis=0)) > 100  # not blank: text, bars, badges, charts
    w = WINDOW[0]
    # the tree (left column, below the cards) shows its red NaN/Inf badges and dark text
    assert _count(img, (0, 180, w // 2, 700), (0xC0, 0x26, 0x2D)) > 200
    assert _count(img, (0, 180, w // 2, 700), (0x1D, 0x23, 0x30), tol=40) > 500
    # the treemap (right column; its first colour at 80% over white) and the size bars below it
    assert _count(img, (w // 2, 180, w, 800), (89, 140, 229)) > 20000
    assert _count(img, (w // 2, 180, w, 1100), (0x2F, 0x6F, 0xDE)) > 1500
    assert _count(img, (0, 700, w, WINDOW[1]), (0x2F, 0x6F, 0xDE)) > 500  # metrics line, histograms


def test_script_sorts_and_tree_collapses(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    report(root, out)
    probe = """<script>
    (function () {
      var th = Array.prototype.filter.call(document.querySelectorAll('#stats th'),
                                           function (h) { return h.textContent === 'inf'; })[0];
      th.click(); th.click();  // descending
      var first = document.querySelector('#stats tbody tr td').textContent;
      var d = document.querySelector('#tree details');
      var before = d.open; d.querySelector('summary').click();
      var p = document.createElement('pre'); p.id = 'probe';
      p.textContent = 'first=' + first + ';open=' + before + '->' + d.open + ';svgs=' +
                      document.querySelectorAll('svg rect').length;
      document.body.appendChild(p);
    })();
    </script></body>"""
    probed = tmp_path / "probed.html"
    probed.write_text(out.read_text("utf-8").replace("</body>", probe), "utf-8")
    p = _run_chromium(probed, "--dump-dom")
    assert _console(p.stderr) == []
    m = re.search(r'<pre id="probe">first=([^;]*);open=(\w+)-&gt;(\w+);svgs=(\d+)</pre>', p.stdout)
    assert m, p.stdout[-3000:]
    assert m.group(1) == "params.embed"  # the most Infs first (only embed has any)
    assert (m.group(2), m.group(3)) == ("true", "false")
    assert int(m.group(4)) > 50


def test_treemap_layout_fills_the_area() -> None:
    from ocdbt_py.inspect.report import _squarify, treemap_svg

    sizes = [6.0, 6.0, 4.0, 3.0, 2.0, 2.0, 1.0]
    rects = _squarify([s * 6 * 4 / sum(sizes) for s in sizes], 0, 0, 6, 4)
    assert len(rects) == len(sizes)
    assert sum(w * h for _, _, w, h in rects) == pytest.approx(24)
    for (x, y, w, h), s in zip(rects, sizes):
        assert w * h == pytest.approx(s * 24 / sum(sizes))
        assert x >= 0 and y >= 0 and x + w <= 6 + 1e-9 and y + h <= 4 + 1e-9
    svg = treemap_svg([(f"t{i}", 10 + i, i == 499) for i in range(500)], most=50)
    assert svg.count("<rect") == 50 and "(451 smaller tensors)" in svg and 'stroke="#c0262d"' in svg
