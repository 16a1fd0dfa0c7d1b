"""`--report`: one self-contained HTML file beside an output (OUT.report.html; a pipeline's or
an eval's folder gets report.html inside it) with the overview and the five plots the viewer
shows, drawn here as inline SVG, and the first failures and rows, so that it can be mailed or
attached to a pull request. It refers to no other file: no script, no stylesheet, no font,
no image. Every text from a row is escaped (html.escape); the file holds no script at all.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from lmpress.data.targets import write_text_atomically
from lmpress.version import __version__
from lmpress.view.layout import SourceKind
from lmpress.view.records import Status
from lmpress.view.rows import table_rows
from lmpress.view.sources import OpenSource
from lmpress.view.stats import overview

WIDTH, HEIGHT, PAD = 460, 180, 34  # one plot's size and margin, in pixels
SHOWN_ROWS = 10  # failures, and rows, listed at the end
PLOTS = (
    ("prompt_tokens", "Prompt tokens", "rows"),
    ("completion_tokens", "Completion tokens", "rows"),
    ("latency_s", "Latency (s)", "rows"),
)
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#1d2330;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #d5d9e0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f2f4f7}.num{text-align:right}.plots{display:flex;flex-wrap:wrap;gap:14px}
figure{margin:0}figcaption{font-weight:600;margin-bottom:2px}svg text{font-size:10px;fill:#555}
.bar{fill:#4c78a8}.line{fill:none;stroke:#e45756;stroke-width:2}.muted{color:#777}
pre{white-space:pre-wrap;word-break:break-word;margin:0;max-height:12em;overflow:auto}
"""


def report_path(output: str | Path) -> Path:
    """Where the report of an output goes: OUT.report.html, or DIR/report.html."""
    path = Path(output).expanduser()
    return path / "report.html" if path.is_dir() else path.with_name(f"{path.name}.report.html")


def write_report(output: str | Path) -> Path:
    """Write the report of an output (read, never written: its index stays in memory) and
    return where it went."""
    target = report_path(output)
    page = report_html(str(output))
    # A lone surrogate a line escaped has no UTF-8: it is written as "?".
    write_text_atomically(target, page.encode("utf-8", "replace").decode("utf-8", "replace"))
    return target


def report_html(output: str) -> str:
    source = OpenSource(output, keep=False)
    snapshot = source.wait()  # every row's facts: a report is not redrawn
    facts = overview(source, snapshot)
    status = snapshot.table.columns["status"]
    failed = np.flatnonzero(status != Status.OK)
    done = np.flatnonzero(status == Status.OK)
    plots = facts["plots"]
    figures = [_figure(title, _histogram(plots[key], unit)) for key, title, unit in PLOTS]
    figures.append(_figure("Throughput (rows/s over the run)", _line(plots["throughput"])))
    cost = plots["cost_by_part"]
    priced = any(part["cost_usd"] is not None for part in facts["by_part"])
    figures.append(
        _figure(
            f"Cost by {_part_word(snapshot.layout.kind)} (USD)",
            _bars(cost["names"], cost["cost_usd"]) if priced else _empty("no price known"),
        )
    )
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"<h1>lmpress report: {escape(Path(output).name)}</h1>",
        f'<p class="muted">{escape(output)} ({escape(snapshot.layout.kind.value)}), '
        f"written {when} by lmpress {escape(__version__)}</p>",
        "<h2>Overview</h2>",
        _overview_table(facts),
        "<h2>Errors by kind</h2>",
        _table(["kind", "rows"], [[e["kind"], e["count"]] for e in facts["errors_by_kind"]])
        if facts["errors_by_kind"]
        else "<p>No row failed.</p>",
        f"<h2>By {_part_word(snapshot.layout.kind)}</h2>",
        _parts_table(facts["by_part"]),
        "<h2>Plots</h2>",
        f'<div class="plots">{"".join(figures)}</div>',
        f"<h2>Failures {_how_many(len(failed))}</h2>",
        _rows_table(source, snapshot, failed),
        f"<h2>Rows {_how_many(len(done))}</h2>",
        _rows_table(source, snapshot, done),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>lmpress report: {escape(Path(output).name)}</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _how_many(count: int) -> str:
    return f"(the first {SHOWN_ROWS} of {count:,})" if count > SHOWN_ROWS else f"({count})"


def _part_word(kind: SourceKind) -> str:
    return {SourceKind.PIPELINE: "step", SourceKind.EVAL: "task"}.get(kind, "model")


def _number(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}"


def _table(head: list[str] | None, rows: list[list[Any]]) -> str:
    """A table of `rows` (a row's first cell its heading where there is no `head`)."""
    lines = ["<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"] if head else []
    for row in rows:
        tds = "".join(
            f"<th>{escape(str(v))}</th>"
            if head is None and i == 0
            else f'<td class="num">{escape(_number(v))}</td>'
            if isinstance(v, (int, float)) or v is None
            else f"<td>{_text(v)}</td>"
            for i, v in enumerate(row)
        )
        lines.append(f"<tr>{tds}</tr>")
    return "<table>" + "".join(lines) + "</table>"


def _text(value: Any) -> str:
    return f"<pre>{escape(str(value))}</pre>" if "\n" in str(value) else escape(str(value))


def _overview_table(facts: dict[str, Any]) -> str:
    rows, tokens, speed = facts["rows"], facts["tokens"], facts["speed"]
    shown = [
        ["rows ok", rows["ok"]],
        ["rows failed", rows["failed"]],
        *([["rows dropped", rows["dropped"]]] if "dropped" in rows else []),
        ["rows from the response cache", rows["cached"]],
        ["rows left", rows["left"]],
        ["rows in all", rows["total"]],
        ["tokens in / out", f"{tokens['prompt']:,} / {tokens['completion']:,}"],
        ["cost (USD)", facts["cost_usd"]],
        ["rows/s", speed["rows_per_s"]],
        ["tokens/s", speed["tokens_per_s"]],
    ]
    return _table(None, shown)


def _parts_table(parts: list[dict[str, Any]]) -> str:
    metrics = sorted({m for p in parts for m in p.get("metrics", {})})
    head = ["name", "ok", "failed", "tokens", "cost (USD)", *metrics]
    rows = [
        [p["name"], p["ok"], p["failed"], p["tokens"], p["cost_usd"],
         *(p.get("metrics", {}).get(m) for m in metrics)]
        for p in parts
    ]  # fmt: skip
    return _table(head, rows)


def _rows_table(source: OpenSource, snapshot: Any, chosen: np.ndarray) -> str:
    if not len(chosen):
        return "<p>None.</p>"
    shown = table_rows(source, snapshot, chosen, 0, SHOWN_ROWS)
    lines = [
        [row["id"], row["status"], row["error_kind"] or row["finish_reason"] or "", row["preview"]]
        for row in shown
    ]
    return _table(["id", "status", "kind / finish", "reply or error (first 200 characters)"], lines)


# --- plots ------------------------------------------------------------------------------------


def _figure(title: str, svg: str) -> str:
    return f"<figure><figcaption>{escape(title)}</figcaption>{svg}</figure>"


def _svg(inner: list[str]) -> str:
    return (
        f'<svg width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img">' + "".join(inner) + "</svg>"
    )


def _axes(top: float, left_label: str, right_label: str) -> list[str]:
    bottom = HEIGHT - PAD
    return [
        f'<line x1="{PAD}" y1="{bottom}" x2="{WIDTH - 8}" y2="{bottom}" stroke="#999"/>',
        f'<line x1="{PAD}" y1="8" x2="{PAD}" y2="{bottom}" stroke="#999"/>',
        f'<text x="{PAD - 4}" y="14" text-anchor="end">{escape(_number(top))}</text>',
        f'<text x="{PAD - 4}" y="{bottom}" text-anchor="end">0</text>',
        f'<text x="{PAD}" y="{bottom + 14}">{escape(left_label)}</text>',
        f'<text x="{WIDTH - 8}" y="{bottom + 14}" text-anchor="end">{escape(right_label)}</text>',
    ]


def _empty(said: str = "no data") -> str:
    return _svg([f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">{said}</text>'])


def _histogram(plot: dict[str, list], unit: str) -> str:
    """One `rect.bar` per bin, its height the bin's count."""
    counts, edges = plot["counts"], plot["edges"]
    if not counts:
        return _empty()
    return _bar_svg(counts, _number(edges[0]), _number(edges[-1]), unit)


def _bars(names: list[str], values: list[float]) -> str:
    if not names:
        return _empty()
    first, last = names[0], names[-1] if len(names) > 1 else ""
    return _bar_svg(values, first, last, "", titles=names)


def _bar_svg(
    values: list[float], left: str, right: str, unit: str, titles: list[str] | None = None
) -> str:
    top = max(values) or 1
    span = WIDTH - 8 - PAD
    width = span / len(values)
    inner = _axes(max(values), left, right)
    for i, value in enumerate(values):
        height = (HEIGHT - PAD - 8) * value / top
        x, y = PAD + i * width, HEIGHT - PAD - height
        title = f"{titles[i]}: " if titles else ""
        inner.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{y:.1f}" width="{max(width - 2, 1):.1f}" '
            f'height="{height:.1f}"><title>{escape(title + _number(value))} {unit}</title></rect>'
        )
    return _svg(inner)


def _line(plot: dict[str, list]) -> str:
    times, rates = plot["t"], plot["rows_per_s"]
    if not times:
        return _empty()
    top, end = max(rates) or 1, max(times) or 1
    span = WIDTH - 8 - PAD
    points = " ".join(
        f"{PAD + span * t / end:.1f},{HEIGHT - PAD - (HEIGHT - PAD - 8) * r / top:.1f}"
        for t, r in zip(times, rates, strict=True)
    )
    inner = _axes(max(rates), "0 s", f"{_number(end)} s")
    inner.append(f'<polyline class="line" points="{points}"/>')
    return _svg(inner)
