"""`--compare`'s report (lmpress/batch/compare.py) on output lines of each shape lmpress writes:
agreement after whitespace is normalised, reply length and refusals per model, and scored
rows' metrics side by side."""

from __future__ import annotations

from lmpress.batch.compare import compare, is_refusal


def lmpress_row(text: str, finish: str = "stop") -> dict:
    return {"id": "x", "response": {"text": text, "finish_reason": finish}}


def openai_line(text: str) -> dict:
    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    return {"custom_id": "x", "response": {"status_code": 200, "body": {"choices": [choice]}}}


def test_report_counts_agreement_lengths_refusals_and_metrics():
    rows = [
        ("a", "r1", lmpress_row("Paris is  the capital.\n")),
        ("b", "r1", openai_line("Paris is the capital.")),  # agrees once spaces are normalised
        ("c", "r1", {"response": "Paris is the capital.", "finish_reason": "stop"}),  # Parquet
        ("a", "r2", lmpress_row("I'm sorry, but I can't help with that.")),
        ("b", "r2", openai_line("Sure: here it is.")),
        ("c", "r2", lmpress_row("", "content_filter")),
        ("a", "s1", {"id": "s1", "logprob": -2.0, "is_greedy": True, "response": {}}),
        ("b", "s1", {"id": "s1", "logprob": -4.0, "is_greedy": False, "response": {}}),
    ]
    report = compare(["a", "b", "c"], rows).markdown()
    assert "1 of 2 rows answered by every model" in report
    assert "| a / b | 1 of 2 |" in report and "| b / c | 1 of 2 |" in report
    assert "| a | 2 | 30.5 | 1 (50%) |" in report  # the lengths as written: 23 and 38
    assert "| b | 2 | 19.0 | 0 (0%) |" in report
    assert "| c | 2 | 10.5 | 1 (50%) |" in report
    assert "| logprob | -2.0000 | -4.0000 | - |" in report
    assert "| is_greedy | 1.0000 | 0.0000 | - |" in report


def test_refusal_screen_reads_the_opening_only():
    assert is_refusal("I cannot do that.") and is_refusal("As an AI, I do not have views.")
    assert not is_refusal("Here is why I can't sleep: coffee.")
    assert not is_refusal("Sorry to hear that! Try this.")
