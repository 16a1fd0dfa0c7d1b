"""The viewer's JSON API (lmpress/view/app.py) over real batch outputs: a JSONL output with
rows that failed alone, its errors file alone, OpenAI Batch lines and Parquet; its filters,
search and one row; its errors; and the real `lmpress view` command on a loopback port."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

from tests.conftest import REPO, lmpress_process, run_lmpress
from tests.view.conftest import (
    BAD_ROLE,
    HOSTILE,
    all_rows,
    client,
    input_rows,
    read_rows,
    run_batch,
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """One input, written three ways: lmpress rows (JSONL), OpenAI Batch lines, Parquet."""
    folder = tmp_path_factory.mktemp("outputs")
    rows = input_rows()
    return {
        "jsonl": run_batch(folder, rows, "out.jsonl"),
        "openai": run_batch(folder, rows, "openai.jsonl", "--output-format", "openai"),
        "parquet": run_batch(folder, rows, "out.parquet"),
    }


@pytest.fixture(scope="module")
def viewer(outputs):
    return client(outputs["jsonl"])


def test_sources_names_the_output_and_its_model(viewer, outputs):
    (source,) = viewer.get("/api/sources").json()["sources"]
    assert source["id"] == "a" and source["path"] == str(outputs["jsonl"])
    assert source["kind"] == "batch" and source["live"] is False
    assert source["rows"] == 13  # 11 done, 2 failed
    assert source["parts"] == [{"name": "tiny-gguf:llama", "rows": 11}]


def test_overview_counts_what_the_files_hold(viewer, outputs):
    written = read_rows(outputs["jsonl"])
    failed = read_rows(outputs["jsonl"].with_name("out.jsonl.errors.jsonl"))
    overview = viewer.get("/api/overview").json()
    assert overview["rows"] == {"ok": 11, "failed": 2, "cached": 0, "left": 0, "total": 13}
    usage = [row["response"]["usage"] for row in written]
    assert overview["tokens"] == {
        "prompt": sum(u["prompt_tokens"] for u in usage),
        "completion": sum(u["completion_tokens"] for u in usage),
    }
    kinds = sorted(e["error"]["kind"] for e in failed)
    assert sorted(e["kind"] for e in overview["errors_by_kind"]) == kinds
    assert overview["by_part"][0]["ok"] == 11 and overview["by_part"][0]["failed"] == 2
    summary = json.loads(outputs["jsonl"].with_name("out.jsonl.summary.json").read_text())
    assert overview["speed"]["rows_per_s"] == summary["rows_per_s"]
    plots = overview["plots"]
    for name in ("prompt_tokens", "completion_tokens", "latency_s"):
        assert len(plots[name]["edges"]) == len(plots[name]["counts"]) + 1
    assert sum(plots["prompt_tokens"]["counts"]) == 11
    lows, highs = plots["prompt_tokens"]["edges"][:-1], plots["prompt_tokens"]["edges"][1:]
    expected = [
        sum(lo <= u["prompt_tokens"] < hi for u in usage)
        for lo, hi in zip(lows, highs, strict=True)
    ]
    assert plots["prompt_tokens"]["counts"] == expected
    assert plots["cost_by_part"]["names"] == ["tiny-gguf:llama"]
    assert overview["live"] == {"running": False, "rate_rows_per_s": None, "eta_s": None}


def test_rows_scroll_in_file_order_and_filter_by_status(viewer, outputs):
    written = read_rows(outputs["jsonl"])
    rows = all_rows(viewer)
    assert [r["n"] for r in rows] == list(range(13))
    assert [r["id"] for r in rows[:11]] == [r["id"] for r in written]
    assert rows[0]["preview"] == written[0]["response"]["text"][:200]
    failed = all_rows(viewer, status="failed")
    assert {r["id"]: r["error_kind"] for r in failed} == {
        "bad-role": "invalid_row",
        "too-long": "context_length_exceeded",
    }
    assert [r["id"] for r in all_rows(viewer, status="ok")] == [r["id"] for r in written]
    assert [r["id"] for r in all_rows(viewer, error_kind="invalid_row")] == ["bad-role"]
    assert all_rows(viewer, status="cached") == []
    lengths = [r["id"] for r in written if r["response"]["finish_reason"] == "length"]
    assert [r["id"] for r in all_rows(viewer, finish_reason="length")] == lengths
    assert all_rows(viewer, model="no-such-model") == []


def test_search_finds_the_rows_holding_a_text_in_any_case(viewer):
    assert [r["id"] for r in all_rows(viewer, q="NUMBER 7")] == ["g7"]
    assert [r["id"] for r in all_rows(viewer, q="alert('row')")] == ["html"]
    # A quote is searched as the line holds it (escaped), and a search combines with filters.
    assert [r["id"] for r in all_rows(viewer, q=BAD_ROLE[:8] + "alert(1)")] == ["bad-role"]
    assert all_rows(viewer, q="number 7", status="failed") == []
    assert all_rows(viewer, q="no row says this") == []


def test_a_page_elsewhere_naming_this_viewer_by_its_own_host_is_refused(viewer):
    """DNS rebinding: a web page whose own name points at 127.0.0.1 sends its Host; a
    viewer without a key answers only requests naming this machine."""
    for host in ("evil.example:8765", "evil.example", "127.0.0.1.evil.example"):
        refused = viewer.get("/api/sources", headers={"host": host})
        assert refused.status_code == 403, host
        assert "this machine's own address" in refused.json()["error"]["message"]
    for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765", "localhost"):
        assert viewer.get("/api/sources", headers={"host": host}).status_code == 200, host


def test_a_column_value_filter_compares_the_value(viewer):
    assert [r["id"] for r in all_rows(viewer, column="id", value="g4")] == ["g4"]
    assert [r["id"] for r in all_rows(viewer, column="response.finish_reason", value="stop")] == [
        r["id"] for r in all_rows(viewer, finish_reason="stop")
    ]
    assert viewer.get("/api/rows", params={"column": "id"}).status_code == 400


def test_one_row_is_its_conversation_reply_and_line(viewer, outputs):
    written = {r["id"]: r for r in read_rows(outputs["jsonl"])}
    (html,) = all_rows(viewer, q="alert('row')")
    row = viewer.get("/api/row", params={"n": html["n"]}).json()
    assert row["messages"] == [{"role": "user", "content": HOSTILE}]
    assert row["reply"]["text"] == written["html"]["response"]["text"]
    assert row["reply"]["finish_reason"] == written["html"]["response"]["finish_reason"]
    assert row["response"] == written["html"]["response"]
    assert json.loads(row["raw"]) == written["html"]
    assert row["error"] is None
    (bad,) = all_rows(viewer, error_kind="invalid_row")
    failed = viewer.get("/api/row", params={"n": bad["n"]}).json()
    assert failed["error"]["kind"] == "invalid_row" and failed["error"]["line"] == 4
    assert BAD_ROLE in failed["error"]["message"]


def test_requests_the_api_cannot_answer_are_json_errors(viewer):
    for path, params, status in [
        ("/api/row", {"n": 999}, 404),
        ("/api/row", {}, 400),
        ("/api/row", {"n": "x"}, 400),
        ("/api/rows", {"status": "sideways"}, 400),
        ("/api/rows", {"source": "z"}, 400),
        ("/api/compare", {"only": "whatever"}, 400),
        ("/api/nothing", {}, 404),
    ]:
        answer = viewer.get(path, params=params)
        assert answer.status_code == status, (path, params)
        assert isinstance(answer.json()["error"]["message"], str)


def test_the_errors_file_alone(outputs):
    errors = outputs["jsonl"].with_name("out.jsonl.errors.jsonl")
    viewer = client(errors)
    assert viewer.get("/api/sources").json()["sources"][0]["kind"] == "errors"
    rows = all_rows(viewer)
    assert {r["id"] for r in rows} == {"bad-role", "too-long"}
    assert {r["status"] for r in rows} == {"failed"}
    assert viewer.get("/api/overview").json()["rows"]["failed"] == 2


def test_openai_batch_lines(outputs):
    written = read_rows(outputs["openai"])
    viewer = client(outputs["openai"])
    assert viewer.get("/api/sources").json()["sources"][0]["kind"] == "openai_batch"
    rows = all_rows(viewer, status="ok")
    assert [r["id"] for r in rows] == [line["custom_id"] for line in written]
    first = viewer.get("/api/row", params={"n": 0}).json()
    choice = written[0]["response"]["body"]["choices"][0]
    assert first["reply"]["text"] == choice["message"]["content"]
    assert first["prompt_tokens"] == written[0]["response"]["body"]["usage"]["prompt_tokens"]
    failed = all_rows(viewer, status="failed")
    assert {r["error_kind"] for r in failed} == {"invalid_row", "context_length_exceeded"}


def test_parquet_output(outputs):
    import pyarrow.parquet as pq

    table = pq.read_table(outputs["parquet"]).to_pylist()
    viewer = client(outputs["parquet"])
    rows = all_rows(viewer)
    assert [r["id"] for r in rows] == [row["id"] for row in table]
    failed = {r["id"] for r in all_rows(viewer, status="failed")}
    assert failed == {row["id"] for row in table if row["error_kind"]} == {"bad-role", "too-long"}
    (html,) = all_rows(viewer, q="<script>alert('row')")
    row = viewer.get("/api/row", params={"n": html["n"]}).json()
    assert row["messages"] == [{"role": "user", "content": HOSTILE}]
    assert row["reply"]["text"] == next(r["response"] for r in table if r["id"] == "html")


def test_view_command_serves_on_loopback_with_its_key(outputs):
    """The real command: one line with the address on stdout, the key asked on every route
    (as a bearer token, or once as ?key= which leaves a cookie), and a stop on SIGTERM."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = lmpress_process(
        "view", str(outputs["jsonl"]), "--api-key", "s3cret",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("lmpress view: http://127.0.0.1:"), line
        url = line.split(": ", 1)[1].strip()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "api/sources")
        assert refused.value.code == 401
        ask = urllib.request.Request(
            url + "api/sources", headers={"Authorization": "Bearer s3cret"}
        )
        with urllib.request.urlopen(ask) as answer:
            assert json.load(answer)["sources"][0]["rows"] == 13
            assert "default-src 'self'" in answer.headers["content-security-policy"]
        with urllib.request.urlopen(url + "api/live?key=s3cret") as answer:
            assert "lmpress_view_key=s3cret" in answer.headers["set-cookie"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_view_command_says_a_bad_path_in_one_line(tmp_path):
    missing = run_lmpress("view", str(tmp_path / "nothing.jsonl"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"lmpress: error: view: {tmp_path / 'nothing.jsonl'}: no such file; give a batch "
        f"output (JSONL, compressed or not, or Parquet), its .errors.jsonl, a pipeline's output "
        f"folder or its Hugging Face dataset folder, a --models output or an eval's results "
        f"folder"
    ]
    folder = run_lmpress("view", str(tmp_path))
    assert folder.returncode == 2 and "a folder lmpress did not write" in folder.stderr
    assert "Traceback" not in folder.stderr
    (tmp_path / "out.jsonl").write_text("")
    open_port = run_lmpress("view", str(tmp_path / "out.jsonl"), "--host", "0.0.0.0")
    assert open_port.returncode == 2
    assert "needs --api-key" in open_port.stderr.strip()


def test_the_python_front_returns_the_address_of_a_running_viewer(outputs):
    import lmpress

    url = lmpress.view(outputs["jsonl"])
    assert url.startswith("http://127.0.0.1:") and url.endswith("/")
    with urllib.request.urlopen(url + "api/sources") as answer:
        assert json.load(answer)["sources"][0]["rows"] == 13
    assert f'src="{url}"' in url._repr_html_()  # a notebook shows the page in its place
