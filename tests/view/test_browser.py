"""The viewer's page in a real browser (issue 56): Debian's Chromium, driven by Playwright for
Python (`make test` installs Chromium as root where apt-get is; Playwright's own browser
download is not used). One browser for the module and one `lmpress view` per output it opens:
a SmolLM2 batch output with two rows that fail alone, compared with the same rows run with fewer
new tokens; an output written by hand, of hostile rows and of one row with everything the Row
tab draws; and a job still writing its output. What the page shows is checked against the
output files and the viewer's own API, and no page error or failed request may happen on the
way.

Screenshots: into $LMPRESS_SCREENSHOTS (`LMPRESS_SCREENSHOTS=docs/images` refreshes the ones
docs/looking-at-results.md shows), else into the module's temporary folder.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, dies_with_its_parent, lmpress_process, run_lmpress

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the dev extra has it)"
)
expect = sync_api.expect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed: `make test` installs it with apt-get when run as "
        "root (apt-get install chromium); without apt-get or root the browser tests skip",
    ),
    pytest.mark.timeout(300),
]

URL_LINE = re.compile(r"lmpress view: (http://\S+)")
VIEWPORT = {"width": 1100, "height": 700}  # the docs' screenshots: small, and readable

# Six questions SmolLM2 answers, and two rows that fail alone: a prompt past its 8,192-token
# context and a row whose messages are no list.
ROWS = [
    {"id": "capital", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"id": "colours", "prompt": "Name three colours."},
    {"id": "too-long", "prompt": "word " * 9000},
    {
        "id": "haiku",
        "messages": [
            {"role": "system", "content": "You are a poet."},
            {"role": "user", "content": "Write a haiku about rivers."},
        ],
    },
    {"id": "sky", "prompt": "Why is the sky blue?"},
    {"id": "no-messages", "messages": "not a list"},
    {"id": "code", "prompt": "Write a Python function that adds two numbers."},
    {"id": "greet", "prompt": "Say hello in French."},
]
FAILING = {"too-long": "context_length_exceeded", "no-messages": "invalid_row"}


def _reply(text: str, **response) -> dict:
    return {"text": text, "finish_reason": "stop", "model": "hand-written", **response}


def _hostile_row(rid: str, user: str, reply: str, **response) -> dict:
    return {
        "id": rid,
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}],
        "response": _reply(reply, **response),
    }


# Rows a model (or an attacker's prompt) could have written: the page must show every one as text.
HOSTILE = [
    _hostile_row(
        "script",
        "<script>window.__pwned = 'user'</script> hello",
        "Sure: <script>window.__pwned = 'reply'</script> and **bold** `<b>code</b>`",
    ),
    _hostile_row(
        "img",
        "<img src=x onerror=\"window.__pwned = 'img'\">",
        "<img src=x onerror=\"window.__pwned = 'img2'\"> [click](javascript:window.__pwned='link')"
        " <iframe src='https://example.com'></iframe> <svg onload=\"window.__pwned='svg'\">",
        reasoning="I think <script>window.__pwned = 'reasoning'</script>, so I am.",
        logprobs=[{"token": "<script>", "logprob": -2.5}, {"token": "alert(1)", "logprob": -0.1}],
    ),
    _hostile_row("long", "One long line, please.", "x" * 1_000_000),
    _hostile_row(
        "markdown",
        "Markdown, please.",
        "# Title\n\nSome *emphasis* and a list:\n\n- one <b>two</b>\n- three\n\n"
        "```html\n<script>window.__pwned = 'code'</script>\n```",
    ),
]


def red_square() -> str:
    """A 64x64 PNG as a data: URL, as a row's image part carries it."""
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (64, 64), (220, 40, 40)).save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


# A row with everything the Row tab draws: an image in the prompt, reasoning, a tool call,
# structured output, logprobs and a judge's verdict (a judge step's columns).
RICH_LOGPROBS = [(" It", -0.05), (" is", -0.3), (" a", -1.6), (" red", -3.2), (" square", -0.9)]
RICH = {
    "id": "rich",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture? Describe it with the tool."},
                {"type": "image_url", "image_url": {"url": "RED_SQUARE"}},
            ],
        }
    ],
    "response": _reply(
        "It is a **red** square:\n\n- one colour\n- four sides",
        reasoning="The picture is one colour, red, and it is square.",
        finish_reason="tool_calls",
        tool_calls=[
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "describe", "arguments": '{"colour": "red", "sides": 4}'},
            }
        ],
        structured={"colour": "red", "shape": {"name": "square", "sides": 4}},
        logprobs=[{"token": token, "logprob": lp} for token, lp in RICH_LOGPROBS],
        usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
    ),
    "judge_score": 4,
    "judge_explanation": "Right colour; the shape was *guessed*.",
}
BAD_UTF8_LINE = (
    b'{"id": "bytes", "messages": [{"role": "user", "content": "caf\xe9?"}], '
    b'"response": {"text": "caf\xe9 au lait \xff", "finish_reason": "stop"}}\n'
)
HOSTILE_ERROR = {
    "line": 6,
    "id": "error",
    "error": {"kind": "invalid_row", "message": "<script>window.__pwned = 'error'</script>"},
}


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def reply_of(row: dict) -> str:
    return row["response"]["text"]


@dataclass
class Outputs:
    long: Path  # max_new_tokens 16
    short: Path  # the same rows, max_new_tokens 6
    handmade: Path  # written by hand: the hostile rows, and RICH

    def answered(self, path: Path) -> dict[str, dict]:
        return {row["id"]: row for row in jsonl(path)}

    def failed(self, path: Path) -> dict[str, dict]:
        return {row["id"]: row for row in jsonl(Path(f"{path}.errors.jsonl"))}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Outputs:
    root = tmp_path_factory.mktemp("outputs")
    src = root / "questions.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    for name, tokens in (("answers.jsonl", "16"), ("short.jsonl", "6")):
        run = run_lmpress(
            "batch", "-c", "smollm2", "-i", str(src), "-o", str(root / name),
            "--generation.max_new_tokens", tokens,
        )  # fmt: skip
        assert run.returncode == 1, run.stderr[-3000:]  # the two failed rows, and only those
        assert "Traceback" not in run.stderr, run.stderr[-3000:]
    handmade = root / "handmade.jsonl"
    with handmade.open("wb") as out:
        for row in HOSTILE:
            out.write(json.dumps(row).encode() + b"\n")
        out.write(BAD_UTF8_LINE)
        out.write(json.dumps(RICH).replace("RED_SQUARE", red_square()).encode() + b"\n")
    Path(f"{handmade}.errors.jsonl").write_text(json.dumps(HOSTILE_ERROR) + "\n")
    return Outputs(root / "answers.jsonl", root / "short.jsonl", handmade)


class Viewer:
    """A running `lmpress view PATH [PATH2]`, at the address it printed; started in the
    outputs' folder and given their names, as a user would (the page shows them)."""

    def __init__(self, *paths: Path):
        self.proc = lmpress_process(
            "view", *(path.name for path in paths), cwd=paths[0].parent,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=dies_with_its_parent,
        )  # fmt: skip
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        line = self.proc.stdout.readline()  # the first line, or "" if it exits first
        found = URL_LINE.search(line)
        if not found:
            self.proc.wait(timeout=30)
            raise AssertionError(f"lmpress view printed {line!r}; stderr:\n{self.log}")
        self.url = found.group(1)
        # The address is printed once it answers: a browser (or a script) may open it at once.
        host, port = self.url.split("//")[1].rstrip("/").rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except ConnectionRefusedError:
            self.stop()
            raise AssertionError(f"lmpress view printed {self.url} before it listened") from None

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)

    @property
    def log(self) -> str:
        return "".join(self.stderr)

    def api(self, route: str) -> dict:
        with urllib.request.urlopen(self.url + route.lstrip("/"), timeout=60) as answer:
            return json.load(answer)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def answers(outputs) -> Iterator[Viewer]:
    viewer = Viewer(outputs.long, outputs.short)
    yield viewer
    viewer.stop()


@pytest.fixture(scope="module")
def handmade(outputs) -> Iterator[Viewer]:
    viewer = Viewer(outputs.handmade)
    yield viewer
    viewer.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> tuple[Path, Path]:
    """Where the docs' screenshots go, and where the others go."""
    own = tmp_path_factory.mktemp("screenshots")
    wanted = os.environ.get("LMPRESS_SCREENSHOTS")
    docs = (REPO / wanted) if wanted else own
    docs.mkdir(parents=True, exist_ok=True)
    return docs, own


@dataclass
class Tab:
    """A browser page, with everything that went wrong in it."""

    page: object
    problems: list[str]
    dialogs: list[str]
    shots: tuple[Path, Path]

    def shot(self, name: str, height: int | None = None, docs: bool = True) -> None:
        """A screenshot of the page's top `height` pixels (all of the window by default)."""
        clip = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height or VIEWPORT["height"]}
        folder = self.shots[0] if docs else self.shots[1]
        self.page.screenshot(path=folder / f"view-{name}.png", clip=clip)


@pytest.fixture
def tab(browser, shots) -> Iterator[Tab]:
    context = browser.new_context(viewport=VIEWPORT, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(20_000)
    found = Tab(page, [], [], shots)
    page.on("pageerror", lambda error: found.problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda msg: msg.type == "error" and found.problems.append(f"console: {msg.text}"),
    )
    page.on("requestfailed", lambda request: found.problems.append(f"failed: {request.url}"))

    def dialog(d) -> None:
        found.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    yield found
    context.close()
    assert not found.problems, found.problems
    assert not found.dialogs, found.dialogs


def test_overview_counts_the_rows_and_draws_a_bar_per_bin(tab, answers, outputs):
    answered, failed = outputs.answered(outputs.long), outputs.failed(outputs.long)
    assert sorted(failed) == sorted(FAILING) and len(answered) == len(ROWS) - len(FAILING)
    overview = answers.api("api/overview?source=a")
    assert overview["rows"]["ok"] == len(answered) and overview["rows"]["failed"] == len(failed)

    page = tab.page
    page.goto(answers.url)
    expect(page.locator("#plot-prompt_tokens .bar").first).to_be_attached()
    expect(page.locator("#count-ok")).to_have_text(str(len(answered)))
    expect(page.locator("#count-failed")).to_have_text(str(len(failed)))
    expect(page.locator("#count-total")).to_have_text(str(len(ROWS)))
    completion = sum(row["response"]["usage"]["completion_tokens"] for row in answered.values())
    expect(page.locator("#tokens-completion")).to_have_text(f"{completion:,}")
    kinds = page.locator("#errors-by-kind tbody tr").all_inner_texts()
    assert sorted(kinds) == sorted(f"{kind}\t1" for kind in FAILING.values())

    plots = overview["plots"]
    for name in ("prompt_tokens", "completion_tokens", "latency_s"):
        drawn = page.eval_on_selector_all(
            f"#plot-{name} rect.bar", "bars => bars.map(bar => Number(bar.dataset.count))"
        )
        assert drawn == plots[name]["counts"], name  # one bar per bin, in order
        assert sum(drawn) == len(answered), name
        heights = page.eval_on_selector_all(
            f"#plot-{name} rect.bar", "bars => bars.map(bar => bar.getBBox().height)"
        )
        tallest = max(plots[name]["counts"])
        assert all((h > 0) == (c > 0) for h, c in zip(heights, drawn, strict=True)), name
        assert heights[drawn.index(tallest)] == max(heights), name
    points = page.get_attribute("#plot-throughput polyline", "points").split()
    assert len(points) == len(plots["throughput"]["t"])
    priced = any(cost for cost in plots["cost_by_part"]["cost_usd"])
    bars = len(plots["cost_by_part"]["names"]) if priced else 0
    assert page.locator("#plot-cost_by_part .bar").count() == bars
    expect(page.locator("#live-badge")).to_be_hidden()  # the job is over
    tab.shot("overview", height=650)


def test_failed_rows_filter_to_exactly_those_and_one_shows_its_error(tab, answers, outputs):
    failed = outputs.failed(outputs.long)
    page = tab.page
    page.goto(answers.url + "#rows")
    expect(page.locator("#rows-total")).to_have_text(str(len(ROWS)))
    expect(page.locator("#rows .row")).to_have_count(len(ROWS))
    tab.shot("rows", height=340)
    page.select_option("#filter-status", "failed")
    expect(page.locator("#rows-total")).to_have_text(str(len(FAILING)))
    expect(page.locator("#rows .row")).to_have_count(len(FAILING))
    assert sorted(page.locator("#rows .row .id").all_inner_texts()) == sorted(FAILING)
    tab.shot("rows-failed", height=260, docs=False)

    page.locator("#rows .row", has_text="too-long").click()
    error = page.locator("#row-view .error-box")
    expect(error).to_contain_text("context_length_exceeded")
    expect(error).to_contain_text(failed["too-long"]["error"]["message"])
    expect(error).to_contain_text(f"input line {failed['too-long']['line']}")
    tab.shot("row-error", height=260)


def word_in_one_row(outputs: Outputs) -> tuple[str, str]:
    """A word of one reply that no other line of the output (nor its errors) holds: the code
    row's if it has one (its reply is a code block, which the docs' screenshot shows)."""
    lines = [
        line.lower()
        for path in (outputs.long, Path(f"{outputs.long}.errors.jsonl"))
        for line in path.read_text().splitlines()
    ]
    answered = outputs.answered(outputs.long)
    for rid, row in sorted(answered.items(), key=lambda item: (item[0] != "code", item[0])):
        for word in sorted(set(re.findall(r"[A-Za-z]{5,}", reply_of(row))), key=len, reverse=True):
            if sum(word.lower() in line for line in lines) == 1:
                return word, rid
    raise AssertionError("no reply has a word of its own")


def test_search_finds_the_one_row_whose_reply_has_the_word(tab, answers, outputs):
    word, rid = word_in_one_row(outputs)
    page = tab.page
    page.goto(answers.url + "#rows")
    expect(page.locator("#rows .row")).to_have_count(len(ROWS))
    page.fill("#search", word)
    expect(page.locator("#rows-total")).to_have_text("1")
    expect(page.locator("#rows .row")).to_have_count(1)
    expect(page.locator("#rows .row .id")).to_have_text(rid)

    page.locator("#rows .row").click()
    row = outputs.answered(outputs.long)[rid]
    user = page.locator("#row-view .role-user")
    expect(user).to_have_text(re.compile(re.escape(row["messages"][-2]["content"])))
    assistant = page.locator("#row-view .role-assistant")
    reply = reply_of(row)
    fence = re.match(r"```\w*\n(.+)", reply, re.S)
    if fence:  # a Markdown code block, drawn as one
        expect(assistant.locator("pre code")).to_have_text(fence.group(1).split("\n```")[0])
    else:
        expect(assistant).to_contain_text(reply.split("\n")[0])
    expect(page.locator("#row-view")).to_contain_text(word)
    tab.shot("row", height=330, docs=False)

    # Back to the rows, as they were; then a column's value instead of the search.
    page.click("text=← rows")
    expect(page.locator("#search")).to_have_value(word)
    expect(page.locator("#rows .row .id")).to_have_text(rid)
    page.fill("#search", "")
    page.fill("#filter-column", "id")
    page.fill("#filter-value", "greet")
    page.press("#filter-value", "Enter")
    expect(page.locator("#rows .row .id")).to_have_text("greet")
    expect(page.locator("#rows-total")).to_have_text("1")


def test_compare_marks_the_words_that_differ(tab, answers, outputs):
    long, short = outputs.answered(outputs.long), outputs.answered(outputs.short)
    differ = [rid for rid in long if reply_of(long[rid]) != reply_of(short[rid])]
    assert differ, "max_new_tokens 6 and 16 gave the same replies"
    page = tab.page
    page.goto(answers.url + "#compare")
    expect(page.locator("#compare-total")).to_have_text(str(len(differ)))
    expect(page.locator("#compare .compare-row")).to_have_count(len(differ))
    assert page.locator("#compare .compare-row .id").all_inner_texts() == differ

    first = differ[0]  # opened by itself
    expect(page.locator("#compare-detail h2")).to_contain_text(first)
    sides = page.locator("#compare-detail .diff-text")
    expect(sides.nth(0)).to_have_text(reply_of(long[first]))
    expect(sides.nth(1)).to_have_text(reply_of(short[first]))
    marked = page.locator("#compare-detail .diff-del, #compare-detail .diff-ins")
    expect(marked.first).to_be_visible()
    for text in page.locator("#compare-detail .diff-del").all_inner_texts():
        assert text.strip() in reply_of(long[first])
    for text in page.locator("#compare-detail .diff-ins").all_inner_texts():
        assert text.strip() in reply_of(short[first])

    # The row whose replies differ most, for the screenshot.
    most = max(differ, key=lambda rid: abs(len(reply_of(long[rid])) - len(reply_of(short[rid]))))
    page.locator("#compare .compare-row", has_text=most).first.click()
    expect(page.locator("#compare-detail h2")).to_contain_text(most)
    expect(page.locator("#compare-detail .diff-text").nth(0)).to_have_text(reply_of(long[most]))
    tab.shot("compare", height=470)

    for only in ("only_a", "only_b"):  # the same ids on both sides
        page.select_option("#compare-only", only)
        expect(page.locator("#compare-total")).to_have_text("0")
    page.select_option("#compare-only", "all")
    expect(page.locator("#compare-total")).to_have_text(str(len(ROWS)))


def test_one_row_draws_its_image_reasoning_tool_call_structure_logprobs_and_judge(tab, handmade):
    n = next(row["n"] for row in handmade.api("api/rows?q=describe")["rows"] if row["id"] == "rich")
    page = tab.page
    page.goto(f"{handmade.url}#row?source=a&n={n}")
    view = page.locator("#row-view")
    expect(view.locator("h2")).to_contain_text("rich")
    image = view.locator(".role-user img.inline-image")
    expect(image).to_be_visible()
    assert image.evaluate("img => [img.complete, img.naturalWidth]") == [True, 64]  # it loaded
    reply = view.locator(".role-assistant")
    expect(reply.locator("p strong")).to_have_text("red")
    expect(reply.locator("li")).to_have_text(["one colour", "four sides"])
    reasoning = reply.locator("details.reasoning")
    expect(reasoning).not_to_have_attribute("open", "")  # collapsed until asked
    expect(reasoning).to_contain_text("one colour, red")
    call = reply.locator(".tool-call")
    expect(call.locator("code").first).to_have_text("describe")
    expect(call).to_contain_text('colour: "red"')  # the arguments, parsed, as a tree
    expect(call).to_contain_text("sides: 4")
    tree = reply.locator(".structured")
    expect(tree).to_contain_text('name: "square"')
    tokens = reply.locator(".lp")
    expect(tokens).to_have_text([token for token, _ in RICH_LOGPROBS])
    shades = tokens.evaluate_all("spans => spans.map(s => getComputedStyle(s).backgroundColor)")
    alpha = [float(shade.rsplit(",", 1)[1].rstrip(")")) for shade in shades]
    likely_first = sorted(range(len(alpha)), key=lambda i: -RICH_LOGPROBS[i][1])
    assert [alpha[i] for i in likely_first] == sorted(alpha)  # the less likely, the darker
    judge = view.locator(".judge")
    expect(judge.locator(".judge-score")).to_have_text("4")
    expect(judge.locator("em")).to_have_text("guessed")
    expect(view.locator(".facts")).to_contain_text("finish: tool_calls")
    reasoning.locator("summary").click()
    page.set_viewport_size({"width": VIEWPORT["width"], "height": 900})
    tab.shot("row-rich", height=900)


def test_a_running_job_is_followed_as_it_writes(tab, outputs, tmp_path):
    """A job that holds its output's lock (data/output_lock.py, as `lmpress batch` takes it)
    and appends rows: the page shows the live badge, and new rows within 2 s of their
    writing (the page polls every second), then the badge goes when the job lets go."""
    from lmpress.data.output_lock import OutputLock

    answered = outputs.long.read_text().splitlines()
    rows = [
        json.dumps({**json.loads(line), "id": f"{json.loads(line)['id']}-{k}"})
        for k in range(3)
        for line in answered
    ]
    out = tmp_path / "live.jsonl"
    lock = OutputLock.take(Path(f"{out}.lock"), out)
    viewer = None
    try:
        lock.note(rows_total=len(rows))
        out.write_text("\n".join(rows[:2]) + "\n")
        viewer = Viewer(out)
        page = tab.page
        page.goto(viewer.url + "#rows")
        expect(page.locator("#rows-total")).to_have_text("2")
        badge = page.locator("#live-badge")
        expect(badge).to_be_visible()
        expect(badge).to_contain_text("live")
        for upto in (len(answered), len(rows)):
            with out.open("a") as more:
                more.write("\n".join(rows[int(page.inner_text("#rows-total")) : upto]) + "\n")
            # The page polls each second, without a reload; how soon after the write a poll
            # lands and the page draws is the machine's, so the timeout only guards a hang.
            expect(page.locator("#rows-total")).to_have_text(str(upto), timeout=60_000)
            expect(page.locator("#rows .row")).to_have_count(upto)  # all in view
            expect(badge).to_contain_text("rows/s")
            if upto < len(rows):
                tab.shot("live", height=360)
        lock.release()
        expect(badge).to_be_hidden()
    finally:
        lock.release()
        if viewer is not None:
            viewer.stop()


def test_hostile_rows_show_as_text_and_run_nothing(tab, handmade):
    page = tab.page
    page.goto(handmade.url + "#rows")
    total = len(HOSTILE) + 3  # and the line of bad bytes, RICH, and the failed row
    expect(page.locator("#rows .row")).to_have_count(total)
    expect(page.locator("#rows")).to_contain_text("<img src=x onerror=")

    for n in range(total):
        if handmade.api(f"api/row?source=a&n={n}")["id"] == "rich":
            continue  # its image is the row's own, a data: URL
        page.goto(f"{handmade.url}#row?source=a&n={n}")
        expect(page.locator("#row-view h2")).to_contain_text(f"Row {n}")
        view = page.locator("#row-view")
        assert view.locator("script, img, iframe, svg, object, embed").count() == 0
        assert view.locator("a[href^='javascript']").count() == 0
        row = handmade.api(f"api/row?source=a&n={n}")
        if row["id"] == "script":
            expect(view).to_contain_text("Sure: <script>window.__pwned = 'reply'</script>")
            expect(view.locator(".msg.role-user")).to_contain_text("<script>window.__pwned")
            tab.shot("hostile", height=330, docs=False)
        elif row["id"] == "img":
            expect(view).to_contain_text("<iframe src='https://example.com'></iframe>")
            expect(view.locator("details.reasoning")).to_contain_text("<script>")
            expect(view.locator(".lp").first).to_have_text("<script>")
        elif row["id"] == "markdown":
            expect(view.locator("pre code")).to_have_text(
                "<script>window.__pwned = 'code'</script>"
            )
            expect(view.locator("li").first).to_have_text("one <b>two</b>")
        elif row["id"] == "long":
            show_all = view.locator("button.show-all").first
            expect(show_all).to_contain_text("1,000,000 characters")
            shown = len(view.locator(".role-assistant .md").inner_text())
            assert shown < 20_000  # cut, not a million characters laid out at once
            show_all.click()  # how long a million characters take to lay out is the machine's
            expect(view.locator(".role-assistant .md")).to_contain_text("x" * 1000)
            assert len(view.locator(".role-assistant .md").inner_text()) >= 1_000_000
        elif row["id"] == "bytes":
            expect(view).to_contain_text("caf\ufffd")  # the bad bytes, replaced
        elif row["id"] == "error":
            expect(view.locator(".error-box")).to_contain_text("<script>window.__pwned = 'error'")
        assert page.evaluate("window.__pwned") is None, row["id"]


class InProcessViewer:
    """The viewer on a thread of this process (as `lmpress.view(path)` runs it), so that a
    test's gate holds the thread that reads its facts (conftest.FactsGate)."""

    def __init__(self, *paths: Path):
        from lmpress.view.app import Viewer as Sources
        from lmpress.view.app import create_app, listen, url_of, uvicorn_server

        self.sources = Sources([str(path) for path in paths])
        sock = listen("127.0.0.1", 0)
        self.server = uvicorn_server(create_app(self.sources))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.01)
        self.url = url_of(sock)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sources.close()


def test_a_fresh_output_shows_its_rows_while_its_facts_are_read(tab, tmp_path, facts_behind):
    """A file opened for the first time (issue 56): its row count and first rows at once, the
    page saying how far indexing got, the overview and a filter on facts counted over the rows
    read so far and saying so; once every row is read, the page follows without a reload: the
    overview complete, the second model in the filter, the note and the badge gone."""
    from tests.view.conftest import MODELS, write_output

    out = write_output(tmp_path / "fresh", 3000, other_model_from=1000)  # 75 rows failed
    first = [json.loads(line) for line in out.read_text().splitlines()[:500]]
    length = sum(row["response"]["finish_reason"] == "length" for row in first)
    gate = facts_behind(out)
    viewer = InProcessViewer(out)
    page = tab.page
    try:
        gate.hold()  # the first 500 rows' facts are in, and the errors file's
        page.goto(viewer.url + "#rows")
        expect(page.locator("#rows-total")).to_have_text("3,000")
        expect(page.locator("#rows .row .id").first).to_have_text("row-0")
        expect(page.locator("#rows .row").nth(1)).to_contain_text("tiny:llama")
        badge = page.locator("#indexing-badge")
        expect(badge).to_have_text("indexing 575 of 3,000 rows")
        page.fill("#filter-finish-reason", "length")
        page.press("#filter-finish-reason", "Enter")
        expect(page.locator("#rows-total")).to_have_text(str(length))
        expect(page.locator("#rows-partial")).to_have_text("so far (575 of 3,000 rows indexed)")
        tab.shot("indexing-rows", height=300, docs=False)
        page.goto(viewer.url + "#overview?source=a")
        note = page.locator("#overview-partial")
        expect(note).to_contain_text("575 of 3,000 rows indexed")
        expect(page.locator("#count-ok")).to_have_text("500")
        expect(page.locator("#count-total")).to_have_text("3,000")
        expect(page.locator("#filter-model")).to_be_hidden()  # one model among the rows read
        tab.shot("indexing", height=420, docs=False)

        gate.open()
        viewer.sources.sources["a"].wait()
        expect(badge).to_be_hidden()
        expect(note).to_be_hidden()
        expect(page.locator("#count-ok")).to_have_text(f"{3000 - 75:,}")
        expect(page.locator("#plot-throughput")).not_to_contain_text("indexed")
        page.goto(viewer.url + "#rows?source=a&finish_reason=length")
        expect(page.locator("#rows-total")).to_have_text("600")
        expect(page.locator("#rows-partial")).to_be_hidden()
        expect(page.locator("#filter-model option")).to_have_text(["any", *MODELS])
        page.goto("about:blank")  # no request in flight as the viewer stops
    finally:
        viewer.stop()
