"""The local engines' reasoning parser (lmpress/engines/common/reasoning.py) on each family's
real marks: the templates' excerpts below are the generation-prompt and thinking parts of the
models' public chat templates (tokenizer_config.json), and the replies are written here in the
shape each family writes them."""

from __future__ import annotations

import random

import jinja2
import pytest

from lmpress.vocabulary.errors import ConfigError
from lmpress.vocabulary.reasoning import (
    HARMONY,
    THINK,
    ReasoningBudget,
    StreamSplitter,
    check_parser,
    closed_in,
    format_for,
    opened_in,
    split,
)

# Qwen/Qwen3-0.6B: earlier turns' thinking cut at '</think>'; the generation prompt opens no
# block (the model writes `<think>` itself) unless enable_thinking is false, which writes an
# empty one.
QWEN3 = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.role == 'assistant' and '</think>' in message.content %}"
    "{{ message.content.split('</think>')[-1].lstrip('\\n') }}"
    "{%- else %}{{ message.content }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
# deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B: the generation prompt opens the block itself.
R1_DISTILL = (
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{'<｜User｜>' + message['content']}}{%- else %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}"
    "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
)
# HuggingFaceTB/SmolLM3-3B: a system prompt that names the marks; no block opened in /think
# mode, an empty one written in /no_think (enable_thinking false).
SMOLLM3 = (
    "{%- if enable_thinking is not defined -%}{%- set enable_thinking = true -%}{%- endif -%}"
    "{%- if enable_thinking -%}{%- set reasoning_mode = '/think' -%}"
    "{%- else -%}{%- set reasoning_mode = '/no_think' -%}{%- endif -%}"
    "<|im_start|>system\nPlease structure your response into two main sections: Thought and "
    "Solution using the specified format: <think> Thought section </think> Solution section."
    "<|im_end|>\n"
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}{%- if reasoning_mode == '/think' -%}"
    "{{ '<|im_start|>assistant\\n' }}{%- else -%}"
    "{{ '<|im_start|>assistant\\n' + '<think>\\n\\n</think>\\n' }}{%- endif -%}{%- endif -%}"
)
# openai/gpt-oss-20b: harmony; the effort goes into the system message, earlier thinking into
# the analysis channel, and the generation prompt starts an assistant message.
GPT_OSS = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message.<|end|>"
    "{%- for message in messages -%}{%- if message.role == 'assistant' -%}"
    "{%- if message.thinking is defined -%}"
    "{{ '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}"
    "{%- endif -%}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}"
    "{%- else -%}{{ '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

USER = [{"role": "user", "content": "What is 17 * 3?"}]


def render(template: str, **variables) -> str:
    env = jinja2.Environment()
    return env.from_string(template).render(messages=USER, add_generation_prompt=True, **variables)


def test_each_familys_template_names_its_format():
    assert format_for(QWEN3) is THINK
    assert format_for(R1_DISTILL) is THINK
    assert format_for(SMOLLM3) is THINK
    assert format_for(GPT_OSS) is HARMONY
    assert format_for(CHATML) is None  # a model that does not think is never split
    assert format_for(CHATML, "qwen3") is THINK  # model.reasoning_parser names it anyway
    assert format_for(QWEN3, "none") is None  # or turns it off


def test_a_reasoning_parser_outside_the_list_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="model.reasoning_parser 'r1' is not one of"):
        check_parser("r1")


def test_deepseek_r1_reply_starts_inside_the_block_its_template_opened():
    prompt = render(R1_DISTILL)
    assert prompt.endswith("<｜Assistant｜><think>\n")
    assert opened_in(prompt, THINK) and not closed_in(prompt, THINK)
    reply = "Okay, 17 times 3: 10*3 is 30, 7*3 is 21, so 51.\n</think>\n\n17 × 3 = **51**."
    assert split(reply, THINK, opened=True) == (
        "Okay, 17 times 3: 10*3 is 30, 7*3 is 21, so 51.",
        "17 × 3 = **51**.",
    )
    # cut short by max_new_tokens while still thinking: all of it is thinking
    assert split("Okay, 17 times", THINK, opened=True) == ("Okay, 17 times", "")


def test_qwen3_writes_its_own_block_or_none_when_thinking_is_off():
    prompt = render(QWEN3)
    assert not opened_in(prompt, THINK) and not closed_in(prompt, THINK)
    reply = "<think>\nThe user wants 17*3. That is 51.\n</think>\n\nThe answer is 51."
    assert split(reply, THINK) == ("The user wants 17*3. That is 51.", "The answer is 51.")
    off = render(QWEN3, enable_thinking=False)
    assert off.endswith("<think>\n\n</think>\n\n")
    assert closed_in(off, THINK) and not opened_in(off, THINK)
    assert split("The answer is 51.", THINK) == (None, "The answer is 51.")


def test_smollm3_thinks_in_think_mode_and_not_in_no_think():
    prompt = render(SMOLLM3)
    assert not opened_in(prompt, THINK) and not closed_in(prompt, THINK)
    reply = "<think>\nMultiply: 17 * 3 = 51.\n</think>\n17 * 3 = 51"
    assert split(reply, THINK) == ("Multiply: 17 * 3 = 51.", "17 * 3 = 51")
    assert closed_in(render(SMOLLM3, enable_thinking=False), THINK)


GPT_OSS_REPLY = (
    "<|channel|>analysis<|message|>We need to compute 17*3 = 51. Simple.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>17 × 3 = 51.<|return|>"
)


def test_gpt_oss_analysis_channel_is_the_thinking_and_final_the_answer():
    prompt = render(GPT_OSS, reasoning_effort="low")
    assert "Reasoning: low" in prompt and prompt.endswith("<|start|>assistant")
    assert not opened_in(prompt, HARMONY) and not closed_in(prompt, HARMONY)
    assert split(GPT_OSS_REPLY, HARMONY) == (
        "We need to compute 17*3 = 51. Simple.",
        "17 × 3 = 51.",
    )
    # a header naming a recipient and a constrained format (a tool call, structured output)
    call = (
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}'
        "<|call|>"
    )
    assert split(call, HARMONY) == ("Need the weather.", '{"city":"Oslo"}')
    assert split("no channels at all", HARMONY) == (None, "no channels at all")


CASES = [
    (THINK, True, "Okay, 17 times 3.\n\nSo 51.\n</think>\n\n17 × 3 = **51**."),
    (THINK, True, "thinking cut short\n"),
    (THINK, True, "\n</think>\n\nclosed at once"),
    (THINK, False, "<think>\nThe user wants 17*3.\n</think>\n\nThe answer is 51."),
    (THINK, False, "The answer is 51, no thinking: <think> is only text here"),
    (THINK, False, "  <thin"),
    (THINK, True, "\n\nlead\n\n\nand trail\n\n</think>\n\n\n\nanswer\n\nends\n"),
    (THINK, True, "cut inside the end mark </thi"),
    (THINK, True, "twice </think> answer </think> still answer"),
    (THINK, False, "\n\n<think>late start</think>answer"),
    (HARMONY, False, GPT_OSS_REPLY),
    (HARMONY, False, GPT_OSS_REPLY.replace("<|return|>", "")),
    (
        HARMONY,
        False,
        GPT_OSS_REPLY.replace(
            "<|channel|>final",
            "<|channel|>analysis<|message|>more<|end|><|start|>assistant<|channel|>final",
        ),
    ),
    (HARMONY, False, "<|channel|>analysis<|message|>cut in the hea"),
    (HARMONY, False, "plain text from a harmony model"),
]


@pytest.mark.parametrize(("fmt", "opened", "reply"), CASES)
def test_streamed_pieces_join_up_to_the_whole_replys_split(fmt, opened, reply):
    rng = random.Random(len(reply))
    for sizes in ([1] * len(reply), [rng.randint(1, 9) for _ in reply]):
        splitter = StreamSplitter(fmt, opened)
        thinking, answer, at, order = "", "", 0, []
        for size in sizes:
            if at >= len(reply):
                break
            t, a = splitter.feed(reply[at : at + size])
            at += size
            thinking, answer = thinking + t, answer + a
            order += ["t"] * bool(t) + ["a"] * bool(a)
        t, a = splitter.flush()
        thinking, answer = thinking + t, answer + a
        whole = split(reply, fmt, opened)
        assert (thinking, answer) == (whole[0] or "", whole[1])
        assert order == sorted(order, key=lambda kind: kind == "a")  # thinking first


def test_a_budget_forces_the_close_after_exactly_its_limit_then_lets_the_model_answer():
    close, end = [7, 8, 7, 7], [8]
    budget = ReasoningBudget(opened=True, limit=3, close_ids=close, end_ids=end)
    for token in (1, 2, 3):
        assert budget.forced() is None and budget.waits
        budget.accept(token)
    written = []
    while (token := budget.forced()) is not None:
        written.append(token)
        budget.accept(token)
    assert written == close and budget.spent == 3
    assert not budget.waits and not budget.thinking
    budget.accept(5)  # the answer
    assert budget.spent == 3


def test_a_model_that_closes_its_own_thinking_is_not_forced():
    budget = ReasoningBudget(opened=True, limit=10, close_ids=[7, 8], end_ids=[8])
    for token in (1, 2, 8):
        assert budget.forced() is None
        budget.accept(token)
    assert budget.spent == 2 and not budget.waits


def test_under_a_grammar_the_engine_opens_the_block_and_writes_what_follows_its_end():
    budget = ReasoningBudget(
        opened=False, limit=None, close_ids=[9, 8, 9], end_ids=[8], start_ids=[6],
        force_open=True, after_end_ids=[9],
    )  # fmt: skip
    assert budget.forced() == 6 and budget.waits
    budget.accept(6)
    assert budget.thinking and budget.forced() is None
    budget.accept(1)
    budget.accept(8)  # the model ends its thinking: the blank line after it is written
    assert budget.forced() == 9 and budget.waits
    budget.accept(9)
    assert not budget.waits and budget.spent == 1


def test_a_reply_that_may_open_the_block_counts_only_once_it_has():
    budget = ReasoningBudget(opened=False, limit=None, close_ids=[], end_ids=[8], start_ids=[6])
    for token in (6, 1, 2, 8, 3):
        budget.accept(token)
    assert budget.spent == 2
    straight = ReasoningBudget(opened=False, limit=1, close_ids=[9], end_ids=[8], start_ids=[6])
    for token in (1, 2, 3):
        assert straight.forced() is None
        straight.accept(token)
    assert straight.spent == 0 and not straight.waits


def test_a_users_own_think_mark_opens_no_block():
    """Qwen3's prompt does not open the block; a question about the mark must not look as if it
    did, or the whole answer would be filed as thinking."""
    prompt = "<|im_start|>user\nWhat does <think> do?<|im_end|>\n<|im_start|>assistant\n"
    assert not opened_in(prompt, THINK)
    assert split("It marks a model's thinking.", THINK, opened_in(prompt, THINK)) == (
        None,
        "It marks a model's thinking.",
    )
    assert opened_in(prompt + "<think>\n", THINK)
