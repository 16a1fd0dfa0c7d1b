"""Text that breaks naive code, through batch, serve and chat: emoji and ZWJ sequences,
right-to-left scripts and bidi controls, combining marks, U+2028 and U+2029 (which
`str.splitlines` takes for line ends, JSON does not), and a 10 MB line. The ECHO engine
replies with exactly what reached it, so each front must hand the text over unchanged and
bring the reply back unchanged."""

from __future__ import annotations

import json

from tests.conftest import run_lmpress, with_plugin

TEXTS = {
    "emoji": "crab 🦀 rocket 🚀 and a face 🫠",
    "zwj": "family 👩\u200d👩\u200d👧\u200d👦 and flag 🏳\ufe0f\u200d🌈",
    "rtl": "שלום עולם and مرحبا بالعالم",
    "bidi": "total \u202e321\u202c and \u2067مرحبا\u2069",
    "separators": "before\u2028after\u2029end",
    "combining": "cafe\u0301 and Z\u0324\u0354\u0367\u0311 and \u1100\u1161\u11a8",
}
BIG = "x" * 10_000_000  # one 10 MB word
LIMIT = ["--generation.max_new_tokens", "4096"]


def echo_of(content: str) -> str:
    """ECHO's reply to one user message."""
    return "ECHO " + json.dumps([{"role": "user", "content": content}], ensure_ascii=False)


def test_batch_keeps_every_character(tmp_path, echo_plugin):
    rows = [{"id": key, "messages": [{"role": "user", "content": t}]} for key, t in TEXTS.items()]
    rows.append({"id": "big", "messages": [{"role": "user", "content": BIG}]})
    src = tmp_path / "in.jsonl"
    # As other tools write JSONL: characters raw, not \u escapes, U+2028 included.
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--engine", "ECHO", "-i", str(src), "-o", str(out), *LIMIT,
        env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = out.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == len(rows)  # one line a row, U+2028 or not
    written = {row["id"]: row for row in map(json.loads, lines[:-1])}
    for key, text in [*TEXTS.items(), ("big", BIG)]:
        assert written[key]["messages"][0]["content"] == text, key
        assert written[key]["response"]["text"] == echo_of(text), key


def test_piped_chat_keeps_every_character(echo_plugin):
    """Each stdin line is a message (U+2028 and U+2029 do not end one); ECHO's reply shows the
    whole conversation so far, so the last reply holds every message unchanged."""
    texts = [*TEXTS.values(), BIG]
    run = run_lmpress(
        "chat", "--engine", "ECHO", *LIMIT,
        input="".join(t + "\n" for t in texts), env=with_plugin(echo_plugin),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    replies = [line for line in run.stdout.split("\n") if line.startswith("ECHO [")]
    assert len(replies) == len(texts)
    sent = json.loads(replies[-1][len("ECHO ") :])
    assert [m["content"] for m in sent if m["role"] == "user"] == texts
