"""`servesim report RUN_DIR`: one self-contained HTML page of a saved run.

The page holds the summary table, the configuration, every plot of `PLOTS` as inline SVG and the
per-request table with a search box and sortable columns (a few lines of inline JavaScript;
`report.html#filter=length` opens it filtered). Nothing is loaded from elsewhere: the file can be
mailed or archived as it is.
"""
from __future__ import annotations

import html
import io
from pathlib import Path

import pandas as pd

REQUEST_COLUMNS = (  # (column, header, scale, digits)
    ("request_id", "request", None, None),
    ("arrival_time", "arrival (s)", 1.0, 3),
    ("num_prompt_tokens", "prompt tokens", None, None),
    ("num_output_tokens", "output tokens", None, None),
    ("finish_reason", "finish", None, None),
    ("queueing_s", "queueing (ms)", 1e3, 1),
    ("ttft_s", "TTFT (ms)", 1e3, 1),
    ("tpot_s", "TPOT (ms)", 1e3, 2),
    ("e2e_s", "E2E latency (s)", 1.0, 3),
    ("num_preemptions", "preemptions", None, None),
    ("num_cached_tokens", "cached tokens", None, None),
)

STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222}
pre{background:#f6f8fa;padding:1rem;overflow-x:auto;font-size:13px;white-space:pre-wrap}
figure{margin:1.5rem 0} figure svg{max-width:100%;height:auto}
figcaption{font-weight:600;margin-bottom:.3rem}
table{border-collapse:collapse;font-size:13px} td,th{padding:2px 8px;border-bottom:1px solid #ddd}
th{cursor:pointer;background:#f0f0f0;position:sticky;top:0} td.n{text-align:right}
#filter{width:20rem;padding:4px;margin:.5rem 0} .config td:first-child{color:#555}
"""

SCRIPT = """
const input = document.getElementById('filter'), body = document.querySelector('#requests tbody');
const rows = Array.from(body.rows), count = document.getElementById('count');
function show() {
  const q = input.value.trim().toLowerCase(); let n = 0;
  for (const r of rows) { const hit = !q || r.textContent.toLowerCase().includes(q);
    r.style.display = hit ? '' : 'none'; n += hit; }
  count.textContent = n + ' of ' + rows.length + ' requests';
}
input.addEventListener('input', show);
const preset = new URLSearchParams(location.hash.slice(1)).get('filter');
if (preset) input.value = preset;
document.querySelectorAll('#requests th').forEach((th, i) => th.addEventListener('click', () => {
  const asc = th.dataset.dir !== 'asc'; th.dataset.dir = asc ? 'asc' : 'desc';
  const key = r => { const t = r.cells[i].textContent, v = parseFloat(t); return isNaN(v) ? t : v; };
  rows.sort((a, b) => { const x = key(a), y = key(b); return (x > y ? 1 : x < y ? -1 : 0) * (asc ? 1 : -1); });
  rows.forEach(r => body.appendChild(r));
}));
show();
document.body.dataset.ready = 'yes';
"""


def figure_svg(fig) -> str:
    """A matplotlib Figure as an inline <svg> element (text drawn as paths: no fonts needed)."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _cell(value, scale, digits) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return '<td class="n">-</td>'
    if scale is None:
        if isinstance(value, (int, float)):
            return f'<td class="n">{value}</td>'
        return f"<td>{html.escape(str(value))}</td>"
    return f'<td class="n">{float(value) * scale:.{digits}f}</td>'


def requests_table(requests: pd.DataFrame) -> str:
    """The per-request table (columns of REQUEST_COLUMNS the run has)."""
    columns = [c for c in REQUEST_COLUMNS if c[0] in requests.columns]
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _, _ in columns)
    data = requests[[c for c, *_ in columns]].to_numpy(dtype=object)
    body = "\n".join("<tr>" + "".join(_cell(v, s, d) for v, (_, _, s, d) in zip(row, columns)) + "</tr>"
                     for row in data)
    return f'<table id="requests"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>'


def config_table(config: dict) -> str:
    """The configuration, one row per field, `section.field` as TOML names it."""
    rows = []
    for section, fields in config.items():
        items = fields.items() if isinstance(fields, dict) else [("", fields)]
        for name, value in items:
            key = f"{section}.{name}" if name else section
            rows.append(f"<tr><td>{html.escape(key)}</td><td>{html.escape(repr(value))}</td></tr>")
    return f'<table class="config">{"".join(rows)}</table>'


def render_report(results, title: str | None = None) -> str:
    """The whole page for a Results (as `Results.load` returns it)."""
    from sim.api.report import describe_setup, format_summary
    from sim.plots.run_plots import PLOTS
    setup = describe_setup(results.meta)
    figures = "\n".join(f'<figure id="plot-{name}"><figcaption>{html.escape(name.replace("_", " "))}'
                        f"</figcaption>{figure_svg(make(results))}</figure>" for name, make in PLOTS.items())
    version = results.meta.get("servesim_version", "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title or "servesim report")}</title>
<style>{STYLE}</style></head><body>
<h1>{html.escape(title or "servesim report")}</h1>
<p>{html.escape(setup)}</p>
<h2>Summary</h2><pre id="summary">{html.escape(format_summary(results.summary, results.meta))}</pre>
<h2>Plots</h2>{figures}
<h2>Requests</h2>
<input id="filter" type="search" placeholder="filter rows, e.g. length or a request id"> <span id="count"></span>
{requests_table(results.requests)}
<h2>Configuration</h2>{config_table(results.meta.get("config") or {})}
<p><small>servesim {html.escape(str(version))}</small></p>
<script>{SCRIPT}</script>
</body></html>
"""


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Read the run saved in `run_dir` and write its report (default RUN_DIR/report.html)."""
    from sim.api.results import Results
    run_dir = Path(run_dir)
    results = Results.load(run_dir)
    path = Path(out) if out is not None else run_dir / "report.html"
    path.write_text(render_report(results, f"servesim report: {run_dir.name}"), encoding="utf-8")
    return path
