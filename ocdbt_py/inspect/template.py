"""The page around an ``ocdbt report``: inline CSS and a little JavaScript (table sorting and
filtering; everything else is plain HTML and SVG, so the page reads without scripts too)."""

from __future__ import annotations

__all__ = ["PAGE"]

CSS = """
:root { --fg:#1d2330; --muted:#667085; --line:#e4e7ec; --bad:#c0262d; --badbg:#fdecec; --acc:#2f6fde; --acc2:#9cc0f5; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  margin: 0; background:#f7f8fa; }
header { background:#1d2330; color:#fff; padding:16px 24px; }
header h1 { margin:0 0 4px; font-size:20px; }
header .sub { color:#c9d1e0; font-size:13px; word-break: break-all; }
main { padding: 16px 24px; display:grid; grid-template-columns: minmax(300px, 1fr) minmax(400px, 1.4fr); gap:16px; }
section { background:#fff; border:1px solid var(--line); border-radius:8px; padding:12px 16px; overflow:auto; }
section.wide { grid-column: 1 / -1; }
h2 { font-size:15px; margin:0 0 8px; }
.cards { display:flex; gap:12px; flex-wrap:wrap; grid-column: 1 / -1; }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:10px 14px; min-width:140px; }
.card b { display:block; font-size:20px; }
.card.bad { background: var(--badbg); border-color: var(--bad); color: var(--bad); }
details { margin-left: 14px; }
details > summary { cursor:pointer; list-style: none; }
details > summary::before { content:"\\25B8"; display:inline-block; width:14px; color:var(--muted); }
details[open] > summary::before { content:"\\25BE"; }
.leaf { margin-left: 28px; white-space: nowrap; }
.leaf .t, summary .t { color: var(--muted); font-size: 12px; margin-left: 6px; }
.flag { color:#fff; background: var(--bad); border-radius: 3px; padding: 0 4px; font-size: 11px; margin-left: 6px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom:1px solid var(--line); padding:3px 8px; text-align:right; white-space:nowrap; }
th:first-child, td:first-child { text-align:left; }
th { position: sticky; top: 0; background:#fff; cursor: pointer; user-select:none; }
th.asc::after { content:" \\25B2"; } th.desc::after { content:" \\25BC"; }
tr.bad td { background: var(--badbg); }
.num { font-variant-numeric: tabular-nums; }
input.filter { margin: 0 0 8px; padding: 4px 8px; width: 280px; border:1px solid var(--line); border-radius: 4px; }
svg text { font: 11px system-ui, sans-serif; fill: var(--fg); }
.muted { color: var(--muted); }
"""

JS = """
(function () {
  function key(td) {
    var v = td.getAttribute('data-v');
    if (v === null) return td.textContent;
    var f = parseFloat(v);
    return isNaN(f) ? v : f;
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    table.querySelectorAll('th').forEach(function (th, col) {
      th.addEventListener('click', function () {
        var asc = !th.classList.contains('asc');
        table.querySelectorAll('th').forEach(function (h) { h.classList.remove('asc', 'desc'); });
        th.classList.add(asc ? 'asc' : 'desc');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[col]), y = key(b.cells[col]);
          if (typeof x === 'number' && typeof y === 'number') return asc ? x - y : y - x;
          return asc ? String(x).localeCompare(String(y)) : String(y).localeCompare(String(x));
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  document.querySelectorAll('input.filter').forEach(function (inp) {
    var table = document.getElementById(inp.getAttribute('data-table'));
    inp.addEventListener('input', function () {
      var q = inp.value.toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
        r.style.display = r.cells[0].textContent.toLowerCase().indexOf(q) >= 0 ? '' : 'none';
      });
    });
  });
})();
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body>
<header><h1>{title}</h1><div class="sub">{subtitle}</div></header>
<main>
{body}
</main>
<script>{js}</script>
</body></html>
"""
