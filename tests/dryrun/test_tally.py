"""The dry run's tally: rows, bad rows, duplicate ids, rows over the context, prompt tokens
(checked against transformers' own chat template), the output bound and the cost; and its
table, which marks estimates."""

from __future__ import annotations

import io
import json

import pytest

from lmpress.batch import RowFailure
from lmpress.cli.report import dry_run_table
from lmpress.configs import load_config
from lmpress.configs.overrides import generation_with_overrides
from lmpress.data.row_shapes import parse_row, row_id
from lmpress.dryrun.tally import DryRun, output_bound
from lmpress.engines.prompt_count import estimate_request_tokens
from lmpress.vocabulary.types import GenerationParams, Message, Request


def read(config, line: int, text: str):
    """A row as the batch runner reads it: its id, and its parsed row and request, or why it
    cannot run."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return f"line-{line}", RowFailure(line, f"line-{line}", "invalid_json", str(exc))
    rid = row_id(raw, line)
    row = parse_row(raw, line)
    params = generation_with_overrides(config.generation, row.overrides)
    return rid, (row, row.request(params))


def chat(rid: str, text: str, **row) -> str:
    return json.dumps({"id": rid, "messages": [{"role": "user", "content": text}], **row})


@pytest.fixture
def native(tiny_llama):
    """NATIVE on the tiny Llama: a context of 64 tokens (model_max_length), 16 new tokens a
    row, and a price the config gives (a local engine has none of its own)."""
    return load_config(overrides={
        "engine": "NATIVE", "model.model_name": tiny_llama, "model.model_max_length": 64,
        "generation.max_new_tokens": 16,
        "remote_params.input_price_per_million": 1.0,
        "remote_params.output_price_per_million": 3.0,
    })  # fmt: skip


def reference_tokens(model_dir: str, text: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_the_tally_of_a_small_job(native, tiny_llama):
    lines = [
        chat("a", "the cat runs"),
        chat("b", "a red bird flies over the river", generation={"n": 2}),
        chat("c", "why is the sky blue", generation={"max_new_tokens": 4}),
        "{not json",
        chat("a", "the dog swims"),  # a duplicate id, and a row that would run
        chat("long", "the quick dog " * 40),  # over the 64-token context
        chat("d", "the sky is blue " * 3),  # fits, with less room than 16 tokens left
        json.dumps({"id": "img", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
    ]  # fmt: skip
    dry = DryRun(native)
    for number, text in enumerate(lines, start=1):
        dry.add(*read(native, number, text))
    summary = dry.summary()

    counts = {
        rid: reference_tokens(tiny_llama, text)
        for rid, text in [
            ("a", "the cat runs"),
            ("b", "a red bird flies over the river"),
            ("c", "why is the sky blue"),
            ("a2", "the dog swims"),
            ("long", "the quick dog " * 40),
            ("d", "the sky is blue " * 3),
        ]
    }
    assert counts["long"] >= 64 > counts["d"] > 64 - 16  # the rows test what they say
    assert summary.rows == 8
    assert summary.bad_rows == 2 and summary.bad_kinds == {"invalid_json": 1, "invalid_request": 1}
    assert summary.duplicates == 1
    assert summary.over_context == 1 and summary.context == 64
    assert summary.rows_to_run == 5
    running = ["a", "b", "c", "a2", "d"]
    assert summary.prompt_tokens == sum(counts[r] for r in running)
    assert summary.prompt_tokens_exact
    assert summary.longest_prompt == counts["d"]
    bound = 16 + 2 * 16 + 4 + 16 + (64 - counts["d"])
    assert summary.output_token_bound == bound
    assert summary.cost_live == pytest.approx((summary.prompt_tokens * 1.0 + bound * 3.0) / 1e6)
    assert summary.cost_batch is None  # a local engine has no batch API
    assert summary.as_dict()["rows_to_run"] == 5


def test_a_hosted_provider_is_estimated_and_priced_live_and_batch():
    config = load_config("openai", {"model.model_name": "gpt-4o-mini-2024-07-18"})
    dry = DryRun(config)
    lines = [chat(f"r{i}", "Tell me about rivers. " * i) for i in range(1, 6)]
    for number, text in enumerate(lines, start=1):
        dry.add(*read(config, number, text))
    summary = dry.summary()
    expected = sum(estimate_request_tokens(read(config, 1, t)[1][1]) for t in lines)
    assert summary.prompt_tokens == expected and not summary.prompt_tokens_exact
    assert summary.output_token_bound == 5 * 512  # the recipe's max_new_tokens
    live = (expected * 0.15 + 5 * 512 * 0.60) / 1e6
    assert summary.cost_live == pytest.approx(live)
    assert summary.cost_batch == pytest.approx(live / 2)


def test_a_model_with_no_price_is_tallied_without_a_cost(tiny_llama):
    config = load_config(overrides={"engine": "NATIVE", "model.model_name": tiny_llama})
    dry = DryRun(config)
    dry.add(*read(config, 1, chat("a", "the cat")))
    summary = dry.summary()
    assert summary.price is None and summary.cost_live is None and summary.cost_batch is None
    assert summary.prompt_tokens > 0


def test_the_summary_is_a_snapshot_and_rows_may_follow(native):
    dry = DryRun(native)
    dry.add(*read(native, 1, chat("a", "the cat")))
    first = dry.summary()
    dry.add(*read(native, 2, chat("a", "the dog")))
    assert (first.rows, first.duplicates) == (1, 0)
    assert (dry.summary().rows, dry.summary().duplicates) == (2, 1)


def test_the_output_bound_of_one_request():
    request = Request("r", [Message("user", "hi")], GenerationParams(max_new_tokens=100, n=3))
    assert output_bound(request, 10, None) == 300
    assert output_bound(request, 10, 50) == 3 * 40  # the context leaves 40
    unset = Request("r", [Message("user", "hi")], GenerationParams(max_new_tokens=None))
    assert output_bound(unset, 10, 50) == 40
    assert output_bound(unset, 10, None) is None


def test_a_row_with_no_bound_leaves_the_cost_unknown():
    config = load_config("openai")
    dry = DryRun(config)
    unset = Request("r", [Message("user", "hi")], GenerationParams(max_new_tokens=None))
    dry.add("r", (None, unset))
    summary = dry.summary()
    assert summary.output_token_bound is None and summary.cost_live is None


def table_text(summary) -> str:
    """The table's words in order, a wrapped cell joined up again."""
    out = io.StringIO()
    dry_run_table(summary, out)
    return " ".join(out.getvalue().replace("│", " ").split())


def test_the_table_marks_an_estimate_and_shows_both_costs():
    config = load_config("openai", {"model.model_name": "gpt-4o-mini"})
    dry = DryRun(config)
    dry.add(*read(config, 1, chat("a", "Tell me about rivers.")))
    text = table_text(dry.summary())
    assert "prompt tokens ~" in text and "cost live, at most ~$" in text
    assert "tokenizer estimate, ~4 characters a token" in text
    assert "cost live, at most" in text and "cost with the batch API, at most" in text
    assert "$0.15 in, $0.60 out (OPENAI price list, gpt-4o-mini)" in text


def test_the_table_says_how_to_give_a_price_when_none_is_known(tiny_llama):
    config = load_config(overrides={"engine": "NATIVE", "model.model_name": tiny_llama})
    dry = DryRun(config)
    dry.add(*read(config, 1, chat("a", "the cat")))
    text = table_text(dry.summary())
    assert "remote_params.input_price_per_million" in text
    assert "~" not in text and "estimate" not in text


LONG_SYSTEM = " ".join(f"rule{i}" for i in range(1200))  # ~2400 tokens by the estimate


def shared_prefix_job(config, rows: int = 5) -> tuple:
    dry = DryRun(config)
    for i in range(rows):
        messages = [{"role": "system", "content": LONG_SYSTEM},
                    {"role": "user", "content": f"question {i}"}]  # fmt: skip
        dry.add(*read(config, i + 1, json.dumps({"id": f"r{i}", "messages": messages})))
    # A short system prompt is never cached, however often it comes.
    for i in range(3):
        dry.add(*read(config, 10 + i, chat(f"s{i}", "hi", system="Be brief.")))
    return dry.summary()


def test_anthropic_rows_sharing_a_long_prefix_are_priced_as_cache_writes_then_reads():
    config = load_config("anthropic", {"model.model_name": "claude-sonnet-4-5"})
    summary = shared_prefix_job(config)
    prefix = Request("p", [Message("system", LONG_SYSTEM)], GenerationParams())
    tokens = estimate_request_tokens(prefix)
    # Row 1 sends it unmarked, row 2 writes it, rows 3 to 5 read it.
    assert summary.cache_creation_tokens == tokens and summary.cached_tokens == 3 * tokens
    bound = summary.output_token_bound
    plain = summary.prompt_tokens - 4 * tokens
    # claude-sonnet-4-5: $3 in, $15 out, $0.30 cache read, $3.75 cache write.
    live = (plain * 3.00 + 3 * tokens * 0.30 + tokens * 3.75 + bound * 15.00) / 1e6
    assert summary.cost_live == pytest.approx(live)
    assert summary.cost_batch == pytest.approx(live / 2)
    shown = io.StringIO()
    dry_run_table(summary, shown)
    assert f"~{3 * tokens:,}" in shown.getvalue() and "$0.30 cached in" in shown.getvalue()
    off = shared_prefix_job(load_config("anthropic", {
        "model.model_name": "claude-sonnet-4-5", "remote_params.prompt_cache": "off"}))  # fmt: skip
    assert off.cached_tokens == off.cache_creation_tokens == 0
    assert off.cost_live == pytest.approx(
        (off.prompt_tokens * 3.00 + off.output_token_bound * 15.00) / 1e6
    )


def test_openai_rows_sharing_a_long_prefix_read_it_from_the_second_on():
    config = load_config("openai", {"model.model_name": "gpt-4.1"})
    summary = shared_prefix_job(config)
    tokens = estimate_request_tokens(Request("p", [Message("system", LONG_SYSTEM)],
                                             GenerationParams()))  # fmt: skip
    assert summary.cached_tokens == 4 * tokens and summary.cache_creation_tokens == 0
    plain = summary.prompt_tokens - 4 * tokens
    live = (plain * 2.00 + 4 * tokens * 0.50 + summary.output_token_bound * 8.00) / 1e6
    assert summary.cost_live == pytest.approx(live)
