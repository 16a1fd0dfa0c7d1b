"""A source's overview (/api/overview, and the report's): rows by status, tokens, cost, speed,
errors by kind, each part (model, step or task), and the five plots' data, from the index's
arrays; with the summary a finished job wrote and the lock record of a running one.

Rows carry no time of their own, so throughput over a finished run is estimated: rows were
written in the order they finished, and each row's share of the run's wall time is its share
of the rows' latency (rows finishing slowly spread out, rows from the cache bunch up). While
the viewer watches a running job, what it saw (rows counted as it looked) is used instead.

While a file's facts are still being read (index.py), every figure is over the rows read so
far; `indexing` says how many of how many, and the total counts every row.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from lmpress.view.layout import DATASET, Layout, SourceKind, card_steps, read_json
from lmpress.view.records import Status
from lmpress.view.sources import OpenSource, Snapshot
from lmpress.view.table import Table, finite, total

BINS = 20  # histogram bars at most


def overview(source: OpenSource, snapshot: Snapshot) -> dict[str, Any]:
    table, layout = snapshot.table, snapshot.layout
    columns = table.columns
    status = columns["status"]
    source.live.observe(snapshot.rows)
    ok_mask = status == Status.OK
    if layout.kind is SourceKind.PIPELINE:
        ok_mask &= columns["step"] == _code(table, "step", DATASET)
    ok, failed = int(ok_mask.sum()), int((status == Status.FAILED).sum())
    dropped = int((status == Status.DROPPED).sum())
    pending = int((status == Status.PENDING).sum())
    summary = source.summary(snapshot) or {}
    running = source.running(snapshot)
    live = live_state(source, snapshot, running)
    total_rows, left = _totals(summary, running, ok + failed + pending, live)
    cost = total(columns["cost_usd"])
    if cost is None and isinstance(summary.get("cost_usd"), (int, float)):
        cost = float(summary["cost_usd"])
    parts = by_part(source, snapshot)
    return {
        "rows": {
            "ok": ok,
            "failed": failed,
            **({"dropped": dropped} if dropped else {}),
            "cached": int(columns["cached"].sum()),
            "left": left,
            "total": total_rows,
        },
        "tokens": _tokens(table, layout),
        "cost_usd": cost,
        "speed": _speed(summary, running, live),
        "errors_by_kind": [
            {"kind": kind, "count": count}
            for kind, count in sorted(
                table.counts("error_kind", status != Status.OK).items(), key=lambda kv: -kv[1]
            )
        ],
        "by_part": parts,
        "plots": {
            "prompt_tokens": histogram(finite(columns["prompt_tokens"]), integers=True),
            "completion_tokens": histogram(finite(columns["completion_tokens"]), integers=True),
            "latency_s": histogram(finite(columns["latency_s"])),
            "throughput": throughput(source, table, summary, running),
            "cost_by_part": {
                "names": [p["name"] for p in parts],
                "cost_usd": [p["cost_usd"] or 0.0 for p in parts],
            },
        },
        "live": live,
        "indexing": snapshot.indexing,
    }


def _tokens(table: Table, layout: Layout) -> dict[str, int]:
    """Tokens the rows used; a pipeline's rows carry none, its card counts them."""
    if layout.kind is SourceKind.PIPELINE:
        steps = card_steps(layout.card)
        return {
            "prompt": sum(_number(row.get("tokens in")) or 0 for row in steps),
            "completion": sum(_number(row.get("tokens out")) or 0 for row in steps),
        }
    return {
        "prompt": int(total(table.columns["prompt_tokens"]) or 0),
        "completion": int(total(table.columns["completion_tokens"]) or 0),
    }


def _code(table: Table, name: str, label: str) -> int:
    code = table.code(name, label)
    return -2 if code is None else code


def _totals(
    summary: dict[str, Any], running: dict[str, Any] | None, done: int, live: dict[str, Any]
) -> tuple[int, int | None]:
    """(rows in all, rows not done yet) as the running job or the last summary says."""
    if running is not None:
        expected = running.get("rows_total")
        if expected is None:
            return done, None
        return max(expected, done), max(expected - done, 0)
    if isinstance(summary.get("rows_total"), int):
        left = summary.get("rows_left")
        return max(summary["rows_total"], done), left if isinstance(left, int) else 0
    return done, None


def live_state(
    source: OpenSource, snapshot: Snapshot, running: dict[str, Any] | None
) -> dict[str, Any]:
    """Whether a job writes the source now, its rate as the viewer saw it, and the time left."""
    rate = source.live.rate() if running is not None else None
    expected = running.get("rows_total") if running is not None else None
    eta = None
    if rate and expected is not None:
        done = int((snapshot.table.columns["status"] != Status.DROPPED).sum())
        eta = round(max(expected - done, 0) / rate, 1)
    return {
        "running": running is not None,
        "rate_rows_per_s": None if rate is None else round(rate, 3),
        "eta_s": eta,
    }


def _speed(
    summary: dict[str, Any], running: dict[str, Any] | None, live: dict[str, Any]
) -> dict[str, float | None]:
    if running is not None:
        return {"rows_per_s": live["rate_rows_per_s"], "tokens_per_s": None}
    rows, tokens = summary.get("rows_per_s"), summary.get("tokens_per_s")
    return {
        "rows_per_s": float(rows) if isinstance(rows, (int, float)) else None,
        "tokens_per_s": float(tokens) if isinstance(tokens, (int, float)) else None,
    }


# --- parts ------------------------------------------------------------------------------------


def by_part(source: OpenSource, snapshot: Snapshot) -> list[dict[str, Any]]:
    """Each model (a --models output, or rows naming several), each step (a pipeline) or each
    task (an eval), with its rows, tokens and cost."""
    layout, table = snapshot.layout, snapshot.table
    if layout.kind is SourceKind.PIPELINE:
        return _pipeline_parts(snapshot)
    column = "step" if layout.kind is SourceKind.EVAL else "model"
    names = table.labels[column]
    if len(names) <= 1:  # one model: every row is its (failures name none)
        name = names[0] if names else layout.segments[0].path.name
        parts = [_part(name, table, np.ones(table.rows, bool))]
    else:
        parts = [_part(n, table, table.columns[column] == code) for code, n in enumerate(names)]
    if layout.kind is SourceKind.EVAL:
        results = read_json(layout.results) or {}
        for part in parts:
            part["metrics"] = _metrics((results.get("results") or {}).get(part["name"]))
    return parts


def _part(name: str, table: Table, mask: np.ndarray) -> dict[str, Any]:
    columns = table.columns
    status = columns["status"][mask]
    tokens = [total(columns[c][mask]) for c in ("prompt_tokens", "completion_tokens")]
    return {
        "name": name,
        "ok": int((status == Status.OK).sum()),
        "failed": int((status == Status.FAILED).sum()),
        "tokens": int(sum(t or 0 for t in tokens)),
        "cost_usd": total(columns["cost_usd"][mask]),
    }


def _pipeline_parts(snapshot: Snapshot) -> list[dict[str, Any]]:
    """Each step as the dataset card counts it (rows, tokens, cost), else as the files do."""
    table, layout = snapshot.table, snapshot.layout
    card = {row.get("step"): row for row in card_steps(layout.card)}
    parts = []
    for name in layout.steps or sorted(set(table.labels["step"]) - {DATASET}):
        mask = table.columns["step"] == _code(table, "step", name)
        part = _part(name, table, mask)
        part["dropped"] = int((table.columns["status"][mask] == Status.DROPPED).sum())
        row = card.get(name)
        if row is not None:
            part["ok"] = _number(row.get("rows out")) or 0
            part["failed"] = _number(row.get("failed")) or 0
            part["tokens"] = (_number(row.get("tokens in")) or 0) + (
                _number(row.get("tokens out")) or 0
            )
            cost = row.get("cost (USD)", "")
            part["cost_usd"] = float(cost) if _is_float(cost) else None
        parts.append(part)
    return parts


def _number(text: Any) -> int | None:
    try:
        return int(str(text).replace(",", ""))
    except ValueError:
        return None


def _is_float(text: Any) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _metrics(task: Any) -> dict[str, float]:
    """An lm-eval task's metrics ('acc,none' -> acc), without their standard errors."""
    if not isinstance(task, dict):
        return {}
    return {
        key.split(",")[0]: value
        for key, value in task.items()
        if "," in key and "_stderr" not in key and isinstance(value, (int, float))
    }


# --- plots ------------------------------------------------------------------------------------


def histogram(values: np.ndarray, integers: bool = False, bins: int = BINS) -> dict[str, list]:
    """Counts in at most `bins` bars (one bar per value where counts are few values apart):
    len(edges) == len(counts) + 1."""
    if not len(values):
        return {"edges": [], "counts": []}
    lo, hi = float(values.min()), float(values.max())
    if integers:
        width = max(1, math.ceil((hi - lo + 1) / bins))
        edges = lo + width * np.arange(math.ceil((hi - lo + 1) / width) + 1)
    elif hi == lo:
        edges = np.array([lo, lo + max(abs(lo) * 0.01, 1e-3)])
    else:
        edges = np.linspace(lo, hi, bins + 1)
    counts, _ = np.histogram(values.astype(np.float64), edges)
    return {"edges": [_round(e) for e in edges.tolist()], "counts": counts.tolist()}


def _round(value: float) -> float | int:
    return int(value) if float(value).is_integer() else float(f"{value:.6g}")


def throughput(
    source: OpenSource, table: Table, summary: dict[str, Any], running: dict[str, Any] | None
) -> dict[str, list]:
    """Rows a second over the run, in at most BINS steps."""
    seen = source.live.seen
    if running is not None and len(seen) >= 3 and seen[-1][0] - seen[0][0] > 0:
        times = np.array([t for t, _ in seen]) - seen[0][0]
        rows = np.array([r for _, r in seen], np.float64)
        rates = np.diff(rows) / np.maximum(np.diff(times), 1e-9)
        return {"t": [_round(t) for t in times[1:].tolist()], "rows_per_s": _rates(rates)}
    if (table.columns["status"] == Status.PENDING).any():  # the run's later rows not read yet
        return {"t": [], "rows_per_s": []}
    done = table.columns["status"] == Status.OK
    latency = np.nan_to_num(table.columns["latency_s"][done].astype(np.float64))
    count = len(latency)
    wall = summary.get("wall_s") if running is None else time.time() - running["since"]
    if not count or not isinstance(wall, (int, float)) or wall <= 0:
        return {"t": [], "rows_per_s": []}
    spent = latency.sum()
    shares = np.cumsum(latency) / spent if spent > 0 else np.arange(1, count + 1) / count
    finished = shares * wall
    bins = min(BINS, count)
    edges = np.linspace(0.0, float(wall), bins + 1)
    counts, _ = np.histogram(finished, edges)
    width = edges[1] - edges[0]
    centers = (edges[:-1] + edges[1:]) / 2
    return {"t": [_round(t) for t in centers.tolist()], "rows_per_s": _rates(counts / width)}


def _rates(values: np.ndarray) -> list[float]:
    return [float(f"{v:.4g}") for v in values.tolist()]
