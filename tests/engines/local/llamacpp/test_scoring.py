"""LLAMACPP scores prompts (issue 52) on SmolLM2-135M-Instruct in F16: each prompt token's
logprob against llama-cpp-python's own logits on the same GGUF (`Llama(logits_all=True)`), the
choices of a question scored together, reading their context once, as each alone; a long text
in rolling windows; end tokens in a reply's logprobs; nothing generated at max_new_tokens 0;
prompts given as token ids."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from lmpress.builtin_models.packaged import SMOLLM2, resolve_packaged_name
from lmpress.configs import load_config
from lmpress.engines.local.llamacpp.loading import load_llama
from lmpress.engines.registry import create_engine
from lmpress.engines.scoring import perplexity
from lmpress.vocabulary.likelihood import LoglikelihoodRequest, encode_pair, rolling_windows
from lmpress.vocabulary.types import GenerationParams, Message, Request

# Over 63 tokens (scheduling.PROMPT_CHUNK): the prompt is read in two chunks.
TEXT = (
    "The river flows from the mountains to the sea, and along its banks the villages grow "
    "wheat, barley and grapes. In spring the water rises with melted snow, and the farmers "
    "wait for it to fall before they plant. By late summer the fields are gold, the markets "
    "are full, and the children swim in the shallow bends of the river."
)
CONTEXT = "Answer the question with the name of a city. Question: which city is the capital of France? Answer:"  # fmt: skip
CHOICES = [" Paris", " Berlin", " the city of Rome", " London"]
EVAL_TASKS = Path(__file__).parents[3] / "eval_tasks"
CLOSE = 0.02  # llama.cpp's own logits here and in lmpress's batches differ by rounding alone


def make(**model_kwargs):
    overrides = {
        "engine": "LLAMACPP",
        "model.model_name": SMOLLM2,
        "generation.batch_size": 4,
        "model.model_kwargs": {"n_ctx": 1024, **model_kwargs},
    }
    return create_engine(load_config(overrides=overrides))


@pytest.fixture(scope="module")
def engine():
    """Each sequence in a part of the KV cache of its own (the default)."""
    eng = make()
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def unified():
    """The sequences sharing one KV cache (the bundled smollm2 recipe's)."""
    eng = make(kv_unified=True)
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def reference():
    """llama-cpp-python's own model on the same file, keeping every position's logits; loaded
    as lmpress loads it on this CPU (the extra buffer types off on a build with AMX kernels)."""
    llm = load_llama(
        str(resolve_packaged_name(SMOLLM2)), {"verbose": False, "logits_all": True, "n_ctx": 512}
    )
    yield llm
    llm.close()


def reference_logprobs(llm, ids: list[int]) -> np.ndarray:
    """log_softmax of llama-cpp-python's logits at each position of `ids` (row i scores the
    token after position i). The positions `ids` shares with what the model read last are kept,
    as llama-cpp-python's own `generate` keeps them: a question's choices read its context once,
    and their logits are the same, bit for bit, as after reading it again (the 160 choices of
    tests/eval_tasks/ read a fresh context each took twice the CPU time)."""
    kept = llm.longest_token_prefix(llm.input_ids[: llm.n_tokens], ids)
    llm.n_tokens = min(kept, len(ids) - 1)  # the cells after it are dropped by `eval`
    llm.eval(ids[llm.n_tokens :])
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


def run(engine, *requests):
    async def all_of():
        return await asyncio.gather(*requests)

    return asyncio.run(all_of())


def test_prompt_logprobs_equal_llama_cpp_pythons_own(engine, reference):
    ids = engine.tokenizer().encode(TEXT)
    assert len(ids) > 63
    params = GenerationParams(max_new_tokens=0, prompt_logprobs=3)
    result = engine.complete(Request("p", [], params, prompt_ids=ids))
    result = asyncio.run(result)
    assert result.error is None
    entries = result.prompt_logprobs
    assert result.prompt_ids == ids and len(entries) == len(ids) and entries[0] is None
    expected = reference_logprobs(reference, ids)
    for position, entry in enumerate(entries[1:], start=1):
        row = expected[position - 1]
        assert entry.id == ids[position]
        assert entry.logprob == pytest.approx(row[ids[position]], abs=CLOSE)
        assert [lp for _, lp in entry.top] == pytest.approx(sorted(row)[::-1][:3], abs=CLOSE)
        # The ids of the top tokens are those the reference rates so (near ties aside).
        assert list(row[entry.top_ids]) == pytest.approx([lp for _, lp in entry.top], abs=CLOSE)
    # Each entry names its token as the tokenizer writes it: together, the text after the first.
    first = engine.tokenizer().decode(ids[:1])
    assert first + "".join(entry.token for entry in entries[1:]) == TEXT


@pytest.mark.parametrize("cache", ["engine", "unified"])
def test_choices_scored_together_equal_each_alone_and_read_the_context_once(
    cache, request, reference
):
    """Beside a reply being generated. The first choice reads the context; the other three
    take its KV cells (copied from its part of a split cache, shared in a unified one) and read
    only the context's last token and their own."""
    engine = request.getfixturevalue(cache)
    tokenizer = engine.tokenizer()
    context = tokenizer.encode(CONTEXT)
    choices = [tokenizer.encode(choice) for choice in CHOICES]
    chat = Request("chat", [Message("user", "Name a colour.")], GenerationParams(max_new_tokens=8))
    reused = engine.scheduler.prompt_tokens_reused
    together, replied = run(
        engine,
        engine.loglikelihood(LoglikelihoodRequest("q", context, choices)),
        engine.complete(chat),
    )
    assert engine.scheduler.prompt_tokens_reused - reused >= 3 * (len(context) - 1)
    assert replied.text == asyncio.run(engine.complete(chat)).text
    alone = [
        asyncio.run(engine.loglikelihood(LoglikelihoodRequest("q", context, [choice]))).scores[0]
        for choice in choices
    ]
    assert [s.logprob for s in together.scores] == pytest.approx([s.logprob for s in alone], abs=1e-4)  # fmt: skip
    for score, choice in zip(together.scores, choices, strict=True):
        expected = reference_logprobs(reference, context + choice)
        steps = list(zip(expected[len(context) - 1 :], choice, strict=False))
        assert score.tokens == len(choice)
        assert score.logprob == pytest.approx(sum(row[t] for row, t in steps), abs=CLOSE)
        assert score.is_greedy == all(row.argmax() == t for row, t in steps)
    assert together.best == 0  # Paris


def test_questions_sent_together_each_read_their_context_once(engine):
    """Three four-way questions at once on four sequences: each question's choices start
    together, so none finds its first choice's sequence given to another question first."""
    tokenizer = engine.tokenizer()
    cities = ["France", "Spain", "Japan"]
    contexts = [tokenizer.encode(CONTEXT.replace("France", city)) for city in cities]
    choices = [tokenizer.encode(choice) for choice in CHOICES]
    reused = engine.scheduler.prompt_tokens_reused
    results = run(
        engine,
        *(
            engine.loglikelihood(LoglikelihoodRequest(c, ctx, choices))
            for c, ctx in zip(cities, contexts, strict=True)
        ),  # fmt: skip
    )
    assert engine.scheduler.prompt_tokens_reused - reused >= sum(3 * (len(c) - 1) for c in contexts)
    assert all(r.error is None and len(r.scores) == 4 for r in results)
    assert results[0].best == 0  # Paris, for France


def test_a_text_longer_than_the_context_is_scored_in_rolling_windows(engine, reference):
    """The first window fills a sequence's whole context (its prefix token and
    `context_length` more); every token is scored once, each as llama-cpp-python scores it
    after the same window."""
    tokenizer = engine.tokenizer()
    tokens = tokenizer.encode(" ".join([TEXT] * 4))
    assert len(tokens) > tokenizer.context_length
    prefix = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    whole, windows = asyncio.run(perplexity(engine, "t", tokens, prefix, tokenizer.context_length))
    assert windows.error is None and whole.tokens == len(tokens)
    pairs = list(rolling_windows(tokens, prefix, tokenizer.context_length))
    assert len(pairs[0][0]) + len(pairs[0][1]) == engine.n_ctx_seq
    for score, (context, continuation) in zip(windows.scores, pairs, strict=True):
        expected = reference_logprobs(reference, context + continuation)[len(context) - 1 :]
        want = [row[t] for row, t in zip(expected, continuation, strict=False)]
        assert score.token_logprobs == pytest.approx(want, abs=CLOSE)


def test_an_end_token_is_in_the_replys_logprobs(engine):
    eos = engine.tokenizer().eos_id
    end = engine.tokenizer().decode([eos])
    params = GenerationParams(max_new_tokens=40, logprobs=True)
    sample = engine.complete(Request("y", [Message("user", "Say just the word yes.")], params))
    sample = asyncio.run(sample).samples[0]
    assert sample.finish_reason == "stop" and end not in sample.text
    assert sample.logprobs[-1].token == end and sample.logprobs[-1].id == eos
    assert len(sample.logprobs) == sample.completion_tokens
    # A reply that is only the end token: no text, one logprob.
    forced = GenerationParams(max_new_tokens=5, logprobs=True, logit_bias={str(eos): 100.0})
    only = asyncio.run(engine.complete(Request("e", [Message("user", "Hi")], forced))).samples[0]
    assert (only.text, only.finish_reason, only.completion_tokens) == ("", "stop", 1)
    assert [entry.id for entry in only.logprobs] == [eos]


def test_max_new_tokens_0_generates_nothing(engine):
    params = GenerationParams(max_new_tokens=0, n=2)
    result = asyncio.run(engine.complete(Request("z", [Message("user", "Hi")], params)))
    assert [(s.text, s.finish_reason) for s in result.samples] == [("", "length")] * 2
    assert result.usage.completion_tokens == 0 and result.usage.prompt_tokens > 0
    # The sequences are free again, and generate as before.
    after = asyncio.run(engine.complete(Request("a", [Message("user", "Hi")], GenerationParams(max_new_tokens=4))))  # fmt: skip
    assert after.usage.completion_tokens == 4


def test_a_prompt_as_token_ids_is_the_text_prompt(engine):
    params = GenerationParams(max_new_tokens=3, prompt_logprobs=0)
    text = asyncio.run(engine.complete(Request("t", [], params, prompt="The sea is")))
    assert text.prompt_ids == engine.tokenizer().encode("The sea is", special=True)
    ids = asyncio.run(engine.complete(Request("i", [], params, prompt_ids=text.prompt_ids)))
    assert ids.text == text.text
    assert ids.prompt_logprobs[0] is None is text.prompt_logprobs[0]
    pairs = list(zip(ids.prompt_logprobs[1:], text.prompt_logprobs[1:], strict=True))
    assert [a.id for a, _ in pairs] == [b.id for _, b in pairs] == text.prompt_ids[1:]
    assert [a.logprob for a, _ in pairs] == pytest.approx([b.logprob for _, b in pairs])


def test_token_ids_outside_the_vocabulary_fail_the_row(engine):
    params = GenerationParams(max_new_tokens=0, prompt_logprobs=1)
    result = asyncio.run(engine.complete(Request("b", [], params, prompt_ids=[1, 10**6])))
    assert result.error is not None and "1000000" in result.error.message
    empty = asyncio.run(engine.complete(Request("b", [], params, prompt_ids=[])))
    assert empty.error is not None and "empty" in empty.error.message


def test_the_tokenizer_reads_special_tokens_and_round_trips(engine):
    tokenizer = engine.tokenizer()
    ids = tokenizer.encode("Hello world<|im_end|>")
    assert ids[-1] == tokenizer.eos_id
    assert tokenizer.decode(ids) == "Hello world<|im_end|>"
    assert "".join(tokenizer.pieces(ids)) == "Hello world<|im_end|>"
    assert tokenizer.context_length == engine.n_ctx_seq - 1


def test_a_multiple_choice_task_matches_llama_cpp_pythons_own_scores(engine, reference):
    """The 40 questions of tests/eval_tasks/ as lm-eval asks them (`Question: ...\\nAnswer:`,
    each choice after a space): every choice's summed logprob within 0.02 of llama-cpp-python's
    own logits on the same file, and the same likeliest choice on at least 95% of questions
    (a near tie may fall either way on rounding)."""
    questions = [
        json.loads(line) for line in (EVAL_TASKS / "multiple_choice.jsonl").read_text().splitlines()
    ]
    assert len(questions) == 40
    tokenizer = engine.tokenizer()
    requests, pairs = [], []
    for q, question in enumerate(questions):
        text = f"Question: {question['question']}\nAnswer:"
        split = [encode_pair(tokenizer.encode, text, f" {c}", 0) for c in question["choices"]]
        context = split[0][0]
        assert all(own == context for own, _ in split)
        pairs.append((context, [choice for _, choice in split]))
        requests.append(engine.loglikelihood(LoglikelihoodRequest(f"q{q}", *pairs[-1])))
    results = run(engine, *requests)
    same = 0
    for result, (context, choices) in zip(results, pairs, strict=True):
        assert result.error is None
        expected = []
        for choice in choices:
            rows = reference_logprobs(reference, context + choice)
            expected.append(sum(rows[len(context) - 1 + i][t] for i, t in enumerate(choice)))
        got = [score.logprob for score in result.scores]
        assert got == pytest.approx(expected, abs=CLOSE)
        same += result.best == int(np.argmax(expected))
    assert same >= 0.95 * len(questions), f"the same likeliest choice on {same} of {len(questions)}"
