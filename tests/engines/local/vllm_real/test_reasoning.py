"""lmpress's VLLM engine on a reasoning model, against vLLM itself: `tiny:think` (random
weights, `<think>` and `</think>` as tokens of their own, a template that opens the thinking
block). vLLM's `deepseek_r1` parser is chosen from the template's marks, with no setting.

Random weights never close the block themselves, so vLLM's thinking budget is what ends it:
raw vLLM (a process of its own, started beside this module's engine) answers the same chats
with `thinking_token_budget` written here by hand as N + 1, since vLLM counts the newline the
template writes after `<think>` as thinking too. lmpress, asked for `max_reasoning_tokens: N`,
must give the same tokens, split at `</think>`: N of thinking, then the answer.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from lmpress.builtin_models.tiny import tiny_model
from lmpress.configs import load_config
from lmpress.engines.local.vllm.api import VllmApi
from lmpress.engines.local.vllm.reasoning import VllmReasoning
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import Delta, GenerationParams, Message, Request, Result
from tests.engines.local.vllm_real.conftest import raw_vllm_beside, worker_in_the_engine_core

END = 513  # "</think>" in tiny:think's vocabulary
MAX_TOKENS = 40
QUESTIONS = ["why is the sky blue", "the cat runs over the moon", "a quick brown fox", "hello"]
BUDGETS = [0, 3, 8, None]  # None: no budget (this reply closes its thinking itself)
SCHEMA = {
    "type": "object",
    # Short values only: a random model writes an integer's digits until max_tokens.
    "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
JSON_BUDGET = 4
# Compact JSON, as test_smollm2.py explains: a random model otherwise fills it with whitespace.
COMPACT_JSON = {"backend": "guidance", "disable_any_whitespace": True}
ENGINE_ARGS = {
    "dtype": "float32",
    "max_model_len": 512,
    "enforce_eager": True,
    "structured_outputs_config": COMPACT_JSON,
}


def chat(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(tiny_model("think"))


@pytest.fixture(scope="module")
def raw_answers(model_dir, tmp_path_factory):
    greedy = {"temperature": 0, "max_tokens": MAX_TOKENS}
    cases = {
        "model": model_dir,
        "engine_args": {**ENGINE_ARGS, "reasoning_parser": "deepseek_r1"},
        "chat": [
            {"messages": chat(q), "sampling": greedy if n is None
             else {**greedy, "thinking_token_budget": n + 1}}
            for q, n in zip(QUESTIONS, BUDGETS, strict=True)
        ] + [
            {"messages": chat("a person as JSON"),
             "sampling": {**greedy, "thinking_token_budget": JSON_BUDGET + 1,
                          "structured_outputs": {"json": SCHEMA}}},
        ],
    }  # fmt: skip
    with raw_vllm_beside(cases, tmp_path_factory.mktemp("raw-think")) as answers:
        yield answers


@pytest.fixture(scope="module")
def reference(raw_answers) -> dict:
    return raw_answers()


@pytest.fixture(scope="module")
def engine(raw_answers, model_dir):
    overrides = {
        "engine": "VLLM",
        "model.model_name": "tiny:think",
        "model.model_max_length": 512,
        "model.model_kwargs": {"enforce_eager": True, "structured_outputs_config": COMPACT_JSON},
    }
    with worker_in_the_engine_core():
        engine = create_engine(load_config(overrides=overrides))
    yield engine
    asyncio.run(engine.aclose())


def row(rid: str, question: str, **params) -> Request:
    return Request(rid, [Message("user", question)], GenerationParams(**params))


def split_raw(raw: dict) -> tuple[str, str, int]:
    """Raw vLLM's reply cut at its `</think>` token: (thinking, answer, thinking tokens), with
    the template's newlines around them left out as lmpress leaves them out."""
    ids = raw["token_ids"]
    if END not in ids:
        return raw["text"].strip("\n"), "", len(ids)
    thinking, _, answer = raw["text"].partition("</think>")
    return thinking.strip("\n"), answer.lstrip("\n"), ids.index(END)


def test_thinking_and_answer_apart_each_row_bounded_by_its_own_budget(engine, reference):
    requests = [
        row(f"r{i}", q, temperature=0, max_new_tokens=MAX_TOKENS, max_reasoning_tokens=n)
        for i, (q, n) in enumerate(zip(QUESTIONS, BUDGETS, strict=True))
    ]
    results = engine.generate(requests)
    for result, raw, budget in zip(results, reference["chat"], BUDGETS, strict=False):
        assert result.ok, result.error
        (sample,) = result.samples
        thinking, answer, spent = split_raw(raw[0])
        assert (sample.reasoning, sample.text) == (thinking, answer)
        assert sample.reasoning_tokens == spent
        if budget is not None:  # cut at exactly N: vLLM wrote `</think>` in place of token N+1
            assert spent == budget
        assert sample.completion_tokens == len(raw[0]["token_ids"])
        assert result.usage.reasoning_tokens == spent
        if budget is not None:
            assert answer  # the model answered after vLLM closed its thinking
    assert len({r.samples[0].reasoning for r in results[1:]}) == 3  # by the prompt and budget


def test_a_json_schema_row_answers_valid_json_and_thinks_first(engine, reference):
    results = engine.generate([
        row("json", "a person as JSON", temperature=0, max_new_tokens=MAX_TOKENS,
            max_reasoning_tokens=JSON_BUDGET, guided_decoding={"json": SCHEMA}),
        row("json-off", "a person as JSON", temperature=0, max_new_tokens=MAX_TOKENS,
            reasoning_effort="none", guided_decoding={"json": SCHEMA}),
    ])  # fmt: skip
    thinking, answer, spent = split_raw(reference["chat"][-1][0])
    sample = results[0].samples[0]
    assert (sample.reasoning, sample.text, sample.reasoning_tokens) == (
        thinking,
        answer,
        JSON_BUDGET,
    )
    assert spent == JSON_BUDGET
    assert sample.finish_reason == "stop", sample.text
    jsonschema.validate(json.loads(sample.text), SCHEMA)
    # Thinking off (the template's enable_thinking): the grammar holds from the first token.
    off = results[1].samples[0]
    assert off.reasoning is None and off.reasoning_tokens == 0
    assert off.finish_reason == "stop", off.text
    jsonschema.validate(json.loads(off.text), SCHEMA)


def test_a_grammar_row_whose_prompt_leaves_the_block_to_the_model_thinks_first(engine):
    """A raw prompt that does not open the block (as Qwen3's own template leaves it to the
    model): lmpress opens it, so that vLLM's grammar, which waits for `</think>`, applies once
    the budget has closed it. Without the opening this random model never writes `</think>`."""
    (result,) = engine.generate([
        Request("raw", [], GenerationParams(temperature=0, max_new_tokens=MAX_TOKENS,
                max_reasoning_tokens=2, guided_decoding={"json": SCHEMA}), prompt=NOT_OPENED),
    ])  # fmt: skip
    sample = result.samples[0]
    assert sample.reasoning and sample.reasoning_tokens == 2, (result.error, sample)
    assert sample.finish_reason == "stop", sample.text
    jsonschema.validate(json.loads(sample.text), SCHEMA)


def test_reasoning_effort_none_answers_without_thinking_and_a_level_is_refused(engine):
    results = engine.generate([
        row("off", QUESTIONS[0], temperature=0, max_new_tokens=12, reasoning_effort="none"),
        row("low", QUESTIONS[0], temperature=0, max_new_tokens=12, reasoning_effort="low"),
        row("on", QUESTIONS[0], temperature=0, max_new_tokens=12),
    ])  # fmt: skip
    off, low, on = results
    assert off.ok and off.samples[0].reasoning is None and off.usage.reasoning_tokens == 0
    assert off.text and "</think>" not in off.text
    assert not low.ok and low.error.kind == "unsupported_param"
    assert "reasoning_effort" in low.error.message and "\n" not in low.error.message
    assert on.ok and on.samples[0].reasoning and on.text == ""  # thinks all 12 tokens


def test_streaming_gives_the_thinking_then_the_answer(engine):
    request = row("s", QUESTIONS[1], temperature=0, max_new_tokens=20, max_reasoning_tokens=6)

    async def read() -> tuple[list[Delta], Result]:
        deltas, result = [], None
        async for item in engine.stream(request):
            if isinstance(item, Delta):
                deltas.append(item)
            else:
                result = item
        return deltas, result

    deltas, result = asyncio.run(read())
    kinds = [d.reasoning for d in deltas]
    assert kinds == sorted(kinds, reverse=True) and True in kinds and False in kinds
    assert "".join(d.text for d in deltas if d.reasoning) == result.samples[0].reasoning
    assert "".join(d.text for d in deltas if not d.reasoning) == result.text
    assert result.samples[0].reasoning_tokens == 6
    # The same reply as without streaming.
    (whole,) = engine.generate([request])
    assert (whole.samples[0].reasoning, whole.text) == (result.samples[0].reasoning, result.text)


# vLLM's parsers read through lmpress's readers on tiny:think's tokenizer, without an engine:
# the prompt decides whether the reply starts inside the thinking, and the streamed pieces join
# to the whole reply's split.
OPENED = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
CLOSED = OPENED + "\n</think>\n\n"
NOT_OPENED = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def read(name: str, tokenizer, prompt: str, pieces: list[str]):
    """(thinking, answer, thinking tokens) of the whole reply, and (thinking, answer) as the
    pieces stream, each piece with its own tokens."""
    reasoning = VllmReasoning(name, VllmApi.reasoning_parser_class(name), tokenizer)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    reader = reasoning.reader(prompt_ids)
    streamed = [reader.feed(p, tokenizer.encode(p, add_special_tokens=False)) for p in pieces]
    streamed.append(reader.finish())
    text = "".join(pieces)
    whole = reasoning.reader(prompt_ids).whole(
        text, tokenizer.encode(text, add_special_tokens=False)
    )
    return whole, tuple("".join(part) for part in zip(*streamed, strict=True))


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize(
    ("prompt", "pieces", "thinking", "answer"),
    [
        (OPENED, ["I think", " so", "\n</think>", "\n\nYes", "."], "I think so", "Yes."),
        (OPENED, ["hm\n", "\n"], "hm", ""),  # cut short while thinking
        (OPENED, ["a <", "/th"], "a </th", ""),  # ... at what may have begun the end mark
        (CLOSED, ["Yes", "."], None, "Yes."),
        (NOT_OPENED, ["<think>", "\nhm", "</think>", "\n\nYes."], "hm", "Yes."),
        (NOT_OPENED, ["Yes", "."], None, "Yes."),
    ],
)
def test_vllms_parsers_split_by_what_the_prompt_left_open(
    tokenizer, name, prompt, pieces, thinking, answer
):
    (whole_thinking, whole_answer, spent), streamed = read(name, tokenizer, prompt, pieces)
    assert (whole_thinking, whole_answer) == (thinking, answer)
    assert streamed == (thinking or "", answer)
    ids = tokenizer.encode("".join(pieces), add_special_tokens=False)
    if thinking is None:
        assert spent == 0
    else:  # the reply's tokens before </think>, its own <think> left out
        before = ids[: ids.index(END)] if END in ids else ids
        assert spent == len([i for i in before if i != 512])


def test_the_budget_counts_what_the_prompt_already_thought(tokenizer):
    reasoning = VllmReasoning(
        "deepseek_r1", VllmApi.reasoning_parser_class("deepseek_r1"), tokenizer
    )
    assert reasoning.budget(5, OPENED) == 6  # the newline after <think>, as vLLM counts it
    assert reasoning.budget(5, CLOSED) == 5
    assert reasoning.budget(5, NOT_OPENED) == 5


def test_tool_calls_are_read_from_the_answer_only(tokenizer):
    """The scheduler's reading of a reply, on vLLM's own output classes: a call written while
    thinking is thinking; the one in the answer is the call. (On tiny:think's 512-token context
    lmpress's tool instruction leaves no room for a reply, so no engine runs this.)"""
    from vllm.outputs import CompletionOutput, RequestOutput

    from lmpress.engines.common.tool_parsers import ToolPlan
    from lmpress.engines.local.vllm.translate import OutputAssembler

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text = f"maybe {call.replace('Paris', 'Oslo')}\n</think>\n\n{call}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt_ids = tokenizer.encode(OPENED, add_special_tokens=False)
    reasoning = VllmReasoning(
        "deepseek_r1", VllmApi.reasoning_parser_class("deepseek_r1"), tokenizer
    )
    assembler = OutputAssembler("r", reasoning=reasoning, stream=False)
    done = CompletionOutput(0, text, ids, None, None, finish_reason="stop")
    assembler.feed(RequestOutput("r-1", OPENED, prompt_ids, None, [done], True))
    (sample,) = assembler.result(model="m", engine="VLLM", latency_s=0).samples
    sample = ToolPlan("hermes", [], None).read(sample)
    assert sample.finish_reason == "tool_calls" and sample.text == ""
    assert [(c.name, json.loads(c.arguments)) for c in sample.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert sample.reasoning == f"maybe {call.replace('Paris', 'Oslo')}"
    assert sample.reasoning_tokens == ids.index(END)


def test_gpt_oss_channels_are_read_by_lmpress_harmony_reader(tokenizer):
    """vLLM's openai_gptoss parser only finds where the thinking ends; the channels are read
    by common/reasoning.py's harmony reader, streamed and whole alike."""
    reasoning = VllmReasoning(
        "openai_gptoss", VllmApi.reasoning_parser_class("openai_gptoss"), tokenizer
    )
    pieces = ["<|channel|>analysis", "<|message|>Let me", " think.<|end|>", "<|start|>assistant",
              "<|channel|>final<|message|>Yes", ".<|return|>"]  # fmt: skip
    reader = reasoning.reader([])
    streamed = [reader.feed(p, []) for p in pieces] + [reader.finish()]
    thinking, answer, spent = reasoning.reader([]).whole("".join(pieces), [])
    assert (thinking, answer) == ("Let me think.", "Yes.")
    assert tuple("".join(part) for part in zip(*streamed, strict=True)) == (thinking, answer)
    assert spent == len(tokenizer.encode("Let me think.", add_special_tokens=False))
