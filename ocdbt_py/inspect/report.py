"""``report()``: one self-contained HTML page about a checkpoint.

The page holds a collapsible tree of the tensors, a treemap and bars of where the bytes are
(per subtree and the largest tensors), the NaN/Inf table, a sortable and filterable statistics table with a
value histogram per tensor (computed while streaming, see :mod:`.histogram`), and for a
CheckpointManager root a chart of the saved metrics across steps.  Charts are inline SVG, styles
and the small sorting script inline: the file needs no network to be viewed.
"""

from __future__ import annotations

import dataclasses
import html
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from ocdbt_py.checkpoint.layout import Kind, classify
from ocdbt_py.checkpoint.restore.api import PathLike
from ocdbt_py.inspect.du import DiskUsage, checkpoint_du, subtree_usage
from ocdbt_py.inspect.source import open_checkpoint
from ocdbt_py.inspect.stats import TensorStats, checkpoint_stats
from ocdbt_py.inspect.template import CSS, JS, PAGE
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore

__all__ = ["report", "render", "ReportData"]

#: Tensors drawn with a histogram in the statistics table (the rest get their numbers only).
MAX_HISTOGRAMS = 2000
_PALETTE = ("#2f6fde", "#e8833a", "#2aa876", "#c0262d", "#8e5cd9", "#8a6d3b", "#d6458f", "#5b6b7f")


@dataclasses.dataclass
class ReportData:
    """What a report shows."""

    title: str
    stats: dict[str, TensorStats]
    usage: DiskUsage
    step: int | None = None
    metrics: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _bytes(n: int | None) -> str:
    from ocdbt_py.maintenance.verify import human_bytes

    return "?" if n is None else human_bytes(n)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}"


def histogram_svg(counts: Sequence[int], width: int = 120, height: int = 28) -> str:
    """A small bar chart of histogram ``counts``."""
    top = max(counts) if counts else 0
    if not top:
        return ""
    bw = width / len(counts)
    bars = []
    for i, c in enumerate(counts):
        if c:
            h = max(1.0, (height - 2) * math.sqrt(c / top))
            bars.append(f'<rect x="{i * bw:.2f}" y="{height - h:.2f}" width="{max(bw - 0.5, 0.5):.2f}" '
                        f'height="{h:.2f}" fill="#2f6fde"/>')
    return (f'<svg class="hist" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
            f'<rect width="{width}" height="{height}" fill="#f2f5fb"/>{"".join(bars)}</svg>')


def bars_svg(rows: Sequence[tuple[str, int, int | None]], width: int = 560) -> str:
    """Horizontal bars of logical (dark) and stored (light) bytes per row ``(label, logical, stored)``."""
    if not rows:
        return '<p class="muted">no arrays</p>'
    top = max(max(r[1], r[2] or 0) for r in rows) or 1
    label_w, bar_w, row_h = 200, width - 340, 18
    out = [f'<svg class="bars" width="{width}" height="{row_h * len(rows) + 24}" role="img">']
    for i, (label, logical, stored) in enumerate(rows):
        y = i * row_h
        short = label if len(label) <= 30 else "\u2026" + label[-29:]
        out.append(f'<text x="0" y="{y + 13}"><title>{_e(label)}</title>{_e(short)}</text>')
        out.append(f'<rect x="{label_w}" y="{y + 3}" width="{max(1, bar_w * logical / top):.1f}" height="7" '
                   f'fill="#2f6fde"/>')
        if stored is not None:
            out.append(f'<rect x="{label_w}" y="{y + 10}" width="{max(1, bar_w * stored / top):.1f}" height="5" '
                       f'fill="#9cc0f5"/>')
        out.append(f'<text x="{label_w + bar_w + 6}" y="{y + 13}">{_e(_bytes(logical))} / {_e(_bytes(stored))}'
                   f'</text>')
    y = row_h * len(rows) + 16
    out.append(f'<rect x="0" y="{y - 8}" width="10" height="8" fill="#2f6fde"/><text x="14" y="{y}">in memory</text>'
               f'<rect x="90" y="{y - 8}" width="10" height="8" fill="#9cc0f5"/><text x="104" y="{y}">stored</text>')
    out.append("</svg>")
    return "".join(out)


def _squarify(sizes: list[float], x: float, y: float, w: float, h: float) -> list[tuple[float, float, float, float]]:
    """Rectangles for ``sizes`` (sorted largest first, summing to ``w * h``), as square as the
    squarified treemap layout makes them."""
    def worst(row: list[float], side: float) -> float:
        t = sum(row)
        return max(max(side * side * r / (t * t), t * t / (side * side * r)) for r in row)

    out: list[tuple[float, float, float, float]] = []
    i = 0
    while i < len(sizes):
        side = min(w, h) or 1e-9
        row = [sizes[i]]
        i += 1
        while i < len(sizes) and worst(row + [sizes[i]], side) <= worst(row, side):
            row.append(sizes[i])
            i += 1
        t = sum(row)
        if w >= h:
            cw = t / (h or 1e-9)
            off = y
            for r in row:
                out.append((x, off, cw, r / (cw or 1e-9)))
                off += r / (cw or 1e-9)
            x, w = x + cw, w - cw
        else:
            rh = t / (w or 1e-9)
            off = x
            for r in row:
                out.append((off, y, r / (rh or 1e-9), rh))
                off += r / (rh or 1e-9)
            y, h = y + rh, h - rh
    return out


def treemap_svg(rows: Sequence[tuple[str, int, bool]], width: int = 560, height: int = 260, most: int = 300) -> str:
    """A treemap of tensors ``(name, bytes, has NaN/Inf)``: area by size, colour by top-level
    subtree, NaN/Inf tensors outlined in red; the smallest beyond ``most`` merged into one."""
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: -r[1])
    if not rows:
        return ""
    if len(rows) > most:
        rest = rows[most - 1:]
        rows = rows[:most - 1] + [(f"({len(rest)} smaller tensors)", sum(r[1] for r in rest), False)]
    total = sum(r[1] for r in rows)
    rects = _squarify([r[1] * width * height / total for r in rows], 0.0, 0.0, float(width), float(height))
    groups: dict[str, str] = {}
    out = [f'<svg class="treemap" width="{width}" height="{height}" role="img">']
    for (name, size, bad), (x, y, w, h) in zip(rows, rects):
        top = name.split(".")[0]
        color = groups.setdefault(top, _PALETTE[len(groups) % len(_PALETTE)])
        stroke = ' stroke="#c0262d" stroke-width="3"' if bad else ' stroke="#fff" stroke-width="1"'
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" height="{max(h, 0.5):.1f}" '
                   f'fill="{color}" fill-opacity="0.8"{stroke}><title>{_e(name)}: {_e(_bytes(size))}</title></rect>')
        if w > 60 and h > 16:
            label = name if len(name) * 6.5 < w - 6 else "\u2026" + name[-max(int((w - 6) / 6.5) - 1, 1):]
            out.append(f'<text x="{x + 4:.1f}" y="{y + 13:.1f}" style="fill:#fff">{_e(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def metrics_svg(points: list[tuple[int, dict[str, float]]], width: int = 560, height: int = 220) -> str:
    """A line per metric over steps (each metric scaled to its own range)."""
    names = sorted({k for _, m in points for k in m})[:8]
    if not names or len(points) < 1:
        return '<p class="muted">no metrics saved with the steps</p>'
    steps = [s for s, _ in points]
    s0, s1 = min(steps), max(steps)
    pad, w, h = 40, width - 60, height - 60
    out = [f'<svg class="metrics" width="{width}" height="{height}" role="img">',
           f'<rect x="{pad}" y="10" width="{w}" height="{h}" fill="#f7f9fc" stroke="#e4e7ec"/>']
    for j, name in enumerate(names):
        vals = [(s, m[name]) for s, m in points if name in m and math.isfinite(m[name])]
        if not vals:
            continue
        lo, hi = min(v for _, v in vals), max(v for _, v in vals)
        span, sspan = (hi - lo) or 1.0, (s1 - s0) or 1
        pts = [(pad + w * (s - s0) / sspan, 10 + h - h * (v - lo) / span) for s, v in vals]
        color = _PALETTE[j % len(_PALETTE)]
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"><title>{_e(name)} step {s}: '
                   f'{_num(v)}</title></circle>' for (x, y), (s, v) in zip(pts, vals))
        out.append(f'<text x="{pad + 120 * j}" y="{height - 8}" style="fill:{color}">\u25A0 {_e(name)} '
                   f'[{_num(lo)}, {_num(hi)}]</text>')
    out.append(f'<text x="{pad}" y="{height - 28}">step {s0}</text>'
               f'<text x="{pad + w}" y="{height - 28}" text-anchor="end">step {s1}</text></svg>')
    return "".join(out)


def _tree_html(data: ReportData) -> str:
    root: dict[str, Any] = {}
    for name in data.usage.tensors:
        node = root
        parts = name.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p + ".", {})
        node[parts[-1]] = name
    out: list[str] = []

    def size_of(node: Any) -> int:
        if isinstance(node, str):
            return data.usage.tensors[node].logical_bytes
        return sum(size_of(v) for v in node.values())

    def bad(node: Any) -> bool:
        if isinstance(node, str):
            s = data.stats.get(node)
            return bool(s and s.nonfinite)
        return any(bad(v) for v in node.values())

    def walk(node: dict[str, Any], level: int) -> None:
        for k, v in node.items():
            flag = '<span class="flag">NaN/Inf</span>' if bad(v) else ""
            if isinstance(v, str):
                s = data.stats.get(v)
                t = f"{s.dtype}[{', '.join(map(str, s.shape))}]" if s else ""
                out.append(f'<div class="leaf">{_e(k)}<span class="t">{_e(t)} \u00b7 '
                           f'{_e(_bytes(size_of(v)))}</span>{flag}</div>')
            else:
                out.append(f'<details{" open" if level < 2 else ""}><summary>{_e(k[:-1])}'
                           f'<span class="t">{_plural(len(_leaves(v)), "array")} \u00b7 {_e(_bytes(size_of(v)))}</span>'
                           f'{flag}</summary>')
                walk(v, level + 1)
                out.append("</details>")

    walk(root, 0)
    return f'<div class="tree">{"".join(out)}</div>'


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _leaves(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    return [x for v in node.values() for x in _leaves(v)]


def _stats_table(data: ReportData) -> str:
    head = ("name", "dtype", "shape", "bytes", "stored", "min", "max", "mean", "std", "nan", "inf", "zeros",
            "histogram")
    rows = []
    for i, (name, s) in enumerate(data.stats.items()):
        u = data.usage.tensors.get(name)
        h = histogram_svg(s.histogram) if s.histogram and i < MAX_HISTOGRAMS else ""
        cells = [
            f"<td>{_e(name)}</td>", f"<td>{_e(s.dtype)}</td>",
            f'<td data-v="{math.prod(s.shape)}">{_e("x".join(map(str, s.shape)) or "scalar")}</td>',
            f'<td data-v="{u.logical_bytes if u else 0}">{_e(_bytes(u.logical_bytes if u else 0))}</td>',
            f'<td data-v="{u.stored_bytes if u and u.stored_bytes is not None else -1}">'
            f'{_e(_bytes(u.stored_bytes if u else None))}</td>',
        ]
        for v in (s.min, s.max, s.mean, s.std):
            cells.append(f'<td class="num" data-v="{"" if v is None else repr(v)}">{_e(_num(v))}</td>')
        cells += [f'<td data-v="{s.nan}">{s.nan}</td>', f'<td data-v="{s.inf}">{s.inf}</td>',
                  f'<td data-v="{s.zeros}">{s.zeros}</td>', f"<td>{h}</td>"]
        cls = ' class="bad"' if s.nonfinite else ""
        rows.append(f'<tr{cls}>{"".join(cells)}</tr>')
    return (f'<input class="filter" data-table="stats" placeholder="filter by name">'
            f'<table id="stats" class="sortable"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _nonfinite_table(data: ReportData) -> str:
    bad = [(n, s) for n, s in data.stats.items() if s.nonfinite]
    if not bad:
        return '<p>No tensor holds NaN or Inf.</p>'
    rows = "".join(f'<tr class="bad"><td>{_e(n)}</td><td data-v="{s.nan}">{s.nan}</td><td data-v="{s.inf}">'
                   f'{s.inf}</td><td data-v="{s.size}">{s.size}</td><td data-v="{(s.nan + s.inf) / max(s.size, 1)}">'
                   f'{100 * (s.nan + s.inf) / max(s.size, 1):.3g}%</td></tr>' for n, s in bad)
    return ('<table id="nonfinite" class="sortable"><thead><tr><th>name</th><th>NaN</th><th>Inf</th><th>size</th>'
            f'<th>share</th></tr></thead><tbody>{rows}</tbody></table>')


def render(data: ReportData) -> str:
    """The HTML page for ``data``."""
    total = data.usage.total
    nbad = sum(1 for s in data.stats.values() if s.nonfinite)
    ratio = f"{total.ratio:.2f}x" if total.ratio else "-"
    cards = (f'<div class="cards"><div class="card">arrays<b>{len(data.stats)}</b></div>'
             f'<div class="card">in memory<b>{_e(_bytes(total.logical_bytes))}</b></div>'
             f'<div class="card">stored<b>{_e(_bytes(total.stored_bytes))}</b></div>'
             f'<div class="card">compression<b>{ratio}</b></div>'
             f'<div class="card{" bad" if nbad else ""}" id="nonfinite-count">tensors with NaN/Inf<b>{nbad}</b></div>'
             "</div>")
    subtrees = sorted(subtree_usage(data.usage, 1).items(), key=lambda kv: -kv[1].logical_bytes)[:20]
    largest = sorted(data.usage.tensors.items(), key=lambda kv: -kv[1].logical_bytes)[:20]
    parts = [cards,
             f'<section id="tree"><h2>Tree</h2>{_tree_html(data)}</section>',
             '<section id="sizes"><h2>Where the bytes are</h2>'
             + treemap_svg([(n, u.logical_bytes, bool(data.stats.get(n) and data.stats[n].nonfinite))
                            for n, u in data.usage.tensors.items()])
             + '<p class="muted">area: bytes in memory; colour: top-level subtree; red outline: NaN/Inf</p>'
             + '<h3 class="muted">per subtree</h3>'
             + bars_svg([(k or "(root)", u.logical_bytes, u.stored_bytes) for k, u in subtrees])
             + '<h3 class="muted">largest tensors</h3>'
             + bars_svg([(k, u.logical_bytes, u.stored_bytes) for k, u in largest]) + "</section>",
             f'<section id="nan" class="wide"><h2>NaN / Inf</h2>{_nonfinite_table(data)}</section>']
    if data.metrics:
        parts.append(f'<section id="metrics" class="wide"><h2>Metrics across steps</h2>{metrics_svg(data.metrics)}'
                     "</section>")
    parts.append(f'<section id="stats-section" class="wide"><h2>Statistics</h2>{_stats_table(data)}</section>')
    sub = _e(data.title) + (f" \u00b7 step {data.step}" if data.step is not None else "")
    return PAGE.format(title="ocdbt report", subtitle=sub, css=CSS, js=JS, body="\n".join(parts))


def _metrics(path: PathLike, storage_options: dict[str, Any] | None) -> list[tuple[int, dict[str, float]]]:
    from ocdbt_py.checkpoint.manager.naming import StepNameFormat
    from ocdbt_py.checkpoint.manager.steps import scan

    kv = open_kvstore(path, storage_options, read_only=True)
    if classify(kv) != Kind.ROOT:
        return []
    _, infos = scan(kv, StepNameFormat())
    out = []
    for step in sorted(infos):
        m = infos[step].metrics or {}
        nums = {str(k): float(v) for k, v in m.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out.append((step, nums))
    return out if any(m for _, m in out) else []


def report(path: PathLike, out: str | os.PathLike[str], *, step: int | None = None,
           storage_options: dict[str, Any] | None = None, include: Sequence[str] | None = None,
           workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> ReportData:
    """Write the HTML report of a checkpoint (item, step or manager root) to ``out``; returns
    what it shows.  Reads every chunk once (statistics and histograms in one pass)."""
    with open_checkpoint(path, step=step, storage_options=storage_options, include=include,
                         stored_sizes=None) as ck:
        st = checkpoint_stats(ck, hist=True, workers=workers, progress=progress)
        usage = checkpoint_du(ck)
        title = path.url if isinstance(path, KvStore) else os.fspath(path)
        data = ReportData(str(title), st, usage, ck.step)
    if data.step is not None:
        data.metrics = _metrics(path, storage_options)
    page = render(data)
    tmp = f"{os.fspath(out)}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, out)
    return data
