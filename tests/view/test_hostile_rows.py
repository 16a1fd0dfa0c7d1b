"""Rows that would harm a page that trusted them: HTML and scripts in a reply, a 1 MB line and
bytes that are no UTF-8, appended to a real batch output. The API hands each back as JSON
text (the page sets it as text), invalid bytes replaced; the report escapes them."""

from __future__ import annotations

import html
import json

import pytest

from lmpress.view.report import write_report
from tests.view.conftest import all_rows, client, input_rows, run_batch

SCRIPT = "<script>alert('reply')</script><img src=x onerror=alert(2)>"
LONG = "A" * 1_000_000 + "<b>end</b>"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    out = run_batch(folder, [r for r in input_rows(3) if r["id"].startswith("g")], "out.jsonl")
    real = json.loads(out.read_text().splitlines()[0])

    def row(rid: str, text: str) -> dict:
        reply = {**real["messages"][-1], "content": text}
        return {**real, "id": rid, "messages": [*real["messages"][:-1], reply],
                "response": {**real["response"], "text": text}}  # fmt: skip

    lines = [
        json.dumps(row("script", SCRIPT)).encode(),
        json.dumps(row("long", LONG)).encode(),
        json.dumps(row("bytes", "before BAD after")).encode().replace(b"BAD", b"\xff\xfe\xc3("),
        # A lone surrogate (valid JSON, no UTF-8) and a number JSON has no word for, which
        # Python's reader takes.
        json.dumps({**row("odd", "half \ud800 a pair"), "score": float("nan")}).encode(),
    ]
    with out.open("ab") as handle:
        handle.write(b"\n".join(lines) + b"\n")
    return out


def by_id(viewer) -> dict[str, dict]:
    return {r["id"]: r for r in all_rows(viewer)}


def test_html_and_scripts_come_back_as_text(hostile):
    viewer = client(hostile)
    answer = viewer.get("/api/rows", params={"q": "onerror"})
    assert answer.headers["content-type"] == "application/json"
    (found,) = answer.json()["rows"]
    assert found["id"] == "script" and found["preview"] == SCRIPT
    row = viewer.get("/api/row", params={"n": found["n"]}).json()
    assert row["reply"]["text"] == SCRIPT and SCRIPT in row["raw"]


def test_a_long_line_comes_back_whole_and_its_preview_short(hostile):
    viewer = client(hostile)
    rows = by_id(viewer)
    assert rows["long"]["preview"] == LONG[:200]
    row = viewer.get("/api/row", params={"n": rows["long"]["n"]}).json()
    assert row["reply"]["text"] == LONG and len(row["raw"]) > 1_000_000


def test_bytes_that_are_no_utf8_are_replaced(hostile):
    viewer = client(hostile)
    rows = by_id(viewer)
    assert rows["bytes"]["status"] == "ok"
    row = viewer.get("/api/row", params={"n": rows["bytes"]["n"]}).json()
    assert row["reply"]["text"] == "before \ufffd\ufffd\ufffd( after"
    assert "\ufffd" in row["raw"] and json.loads(row["raw"])["id"] == "bytes"
    assert [r["id"] for r in all_rows(viewer, q="after")] == ["bytes"]


def test_the_report_escapes_them(hostile):
    page = write_report(hostile).read_text(encoding="utf-8")
    assert html.escape(SCRIPT) in page
    assert "<script" not in page and "<img" not in page and "\xff" not in page
    assert len(page) < 200_000  # the long row shown by its first characters


def test_a_lone_surrogate_and_nan_come_back_as_json(hostile):
    viewer = client(hostile)
    rows = by_id(viewer)
    answer = viewer.get("/api/row", params={"n": rows["odd"]["n"]})
    assert answer.status_code == 200
    row = answer.json()
    assert row["reply"]["text"] == "half \ud800 a pair"
    assert row["response"]["text"] == "half \ud800 a pair"
