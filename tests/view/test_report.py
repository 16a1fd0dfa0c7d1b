"""`lmpress batch --report` (lmpress/view/report.py): one HTML file beside the output that
refers to nothing outside it, shows the overview and the five plots (a bar per histogram bin,
as /api/overview counts them), and escapes every text a row brings."""

from __future__ import annotations

import html
import re

import pytest

from tests.conftest import run_lmpress
from tests.view.conftest import BAD_ROLE, GGUF, client, input_rows, write_rows


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    source = write_rows(folder / "in.jsonl", input_rows())
    out = folder / "out.jsonl"
    run = run_lmpress("batch", "-i", str(source), "-o", str(out), *GGUF, "--report")
    assert run.returncode == 1, run.stderr  # two rows failed alone
    assert f"lmpress: report: {out}.report.html" in run.stderr
    return out, (folder / "out.jsonl.report.html").read_text()


def test_the_report_refers_to_nothing_outside_it(reported):
    _, page = reported
    assert page.startswith("<!DOCTYPE html>")
    for outside in ('src="http', "src='http", 'href="http', "<script", "<link", "@import", "url("):
        assert outside not in page.lower(), outside
    assert "http://" not in page and "https://" not in page


def test_the_report_escapes_what_rows_bring(reported):
    _, page = reported
    assert html.escape(BAD_ROLE) in page  # the invalid_row failure's message names the role
    assert BAD_ROLE not in page
    assert "invalid_row" in page and "context_length_exceeded" in page


def test_the_report_draws_the_overview_and_its_plots(reported):
    out, page = reported
    overview = client(out).get("/api/overview").json()
    plots = overview["plots"]
    bins = sum(len(plots[name]["counts"]) for name in ("prompt_tokens", "completion_tokens",
                                                        "latency_s"))  # fmt: skip
    priced = any(part["cost_usd"] is not None for part in overview["by_part"])
    bars = bins + (len(plots["cost_by_part"]["names"]) if priced else 0)
    assert bins > 3 and len(re.findall(r'<rect class="bar"', page)) == bars
    assert page.count("<svg") == 5
    assert page.count('<polyline class="line"') == 1  # the throughput over the run
    rows = overview["rows"]
    assert re.search(rf"<th>rows ok</th><td class=\"num\">{rows['ok']}</td>", page)
    assert re.search(rf"<th>rows failed</th><td class=\"num\">{rows['failed']}</td>", page)


def test_report_is_refused_before_work_where_it_cannot_be_written(tmp_path):
    source = write_rows(tmp_path / "in.jsonl", input_rows(2))
    run = run_lmpress("batch", "-i", str(source), "-o", "-", *GGUF, "--report")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip() == (
        "lmpress: error: --report: the output goes to stdout; give -o FILE for a report"
    )
