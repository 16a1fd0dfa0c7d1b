"""NATIVE scores prompts: each prompt token's logprob and top-k (`prompt_logprobs`) against
transformers' own forward pass on the same weights (a tiny Llama, and SmolLM2's real weights),
log-likelihoods of a question's choices, scoring mixed with generation in one batch, prompts
given as token ids, `max_new_tokens` 0, the engine's tokenizer, and EOS in a reply's logprobs."""

from __future__ import annotations

import asyncio
import sys

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.configs import load_config
from lmpress.engines.common.checkpoints import model_source
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.likelihood import LoglikelihoodRequest
from lmpress.vocabulary.types import GenerationParams, Message, Request

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on in the warm sun."
CONTEXT = "Question: which of these animals lives in the sea, far from any land? Answer:"
CHOICES = [" a whale", " a camel", " a squirrel in a tree", " the horse"]


def make(model: str, **generation):
    overrides = {"model.model_name": model, "generation.batch_size": 4}
    overrides.update({f"generation.{k}": v for k, v in generation.items()})
    return create_engine(load_config(overrides=overrides))


def reference_model(engine):
    """transformers' own model on the engine's weights, loaded apart: the engine's copy has its
    linear layers packed and its attention replaced."""
    from transformers import AutoModelForCausalLM

    path, gguf = model_source(engine.config.model)
    return AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf, dtype="float32").eval()


def reference_logprobs(model, ids: list[int]):
    """The log-softmax of transformers' logits at every position, in float32."""
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)


def scored(ids: list[int], k: int = 3, new: int = 0, score_from: int = 1, rid: str = "s"):
    params = GenerationParams(max_new_tokens=new, prompt_logprobs=k)
    return Request(rid, [], params, prompt_ids=ids, score_from=score_from)


def assert_equals_reference(result, ids, reference, k: int, abs: float, score_from: int = 1):
    assert result.ok, result.error
    assert result.prompt_ids == ids
    entries = result.prompt_logprobs
    assert len(entries) == len(ids)
    assert entries[:score_from] == [None] * score_from
    for i in range(score_from, len(ids)):
        entry, step = entries[i], reference[i - 1]
        assert entry.id == ids[i]
        assert entry.logprob == pytest.approx(float(step[ids[i]]), abs=abs)
        values, top_ids = step.topk(k)
        assert entry.top_ids == top_ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=abs)


def run(coroutine):
    return asyncio.run(coroutine)


# --- a tiny Llama --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tiny_llama):
    engine = make(tiny_llama)
    yield engine
    run(engine.aclose())


@pytest.fixture(scope="module")
def llama_reference(llama):
    return reference_model(llama)


def test_prompt_logprobs_equal_transformers_forward(llama, llama_reference):
    ids = llama.tokenizer().encode(TEXT, special=True)
    reference = reference_logprobs(llama_reference, ids)
    (result,) = llama.generate([scored(ids, k=3)])
    assert_equals_reference(result, ids, reference, 3, abs=1e-5)
    # Each entry's text is the token's own piece, and the pieces are the prompt's text.
    pieces = llama.tokenizer().pieces(ids)
    assert [e.token for e in result.prompt_logprobs[1:]] == pieces[1:]
    assert "".join(pieces) == llama.tokenizer().decode(ids)
    # From score_from on only, and alike when the prefill is cut into passes of 16 positions.
    chunk, llama.scheduler._chunk = llama.scheduler._chunk, 16
    try:
        (late,) = llama.generate([scored(ids, k=2, score_from=9)])
    finally:
        llama.scheduler._chunk = chunk
    assert_equals_reference(late, ids, reference, 2, abs=1e-5, score_from=9)


def test_choices_scored_together_equal_each_alone(llama, llama_reference):
    tokenizer = llama.tokenizer()
    context = tokenizer.encode(CONTEXT, special=True)
    choices = [tokenizer.encode(c) for c in CHOICES]
    together = run(llama.loglikelihood(LoglikelihoodRequest("q", context, choices)))
    assert together.error is None
    for choice, score in zip(choices, together.scores, strict=True):
        (alone,) = run(llama.loglikelihood(LoglikelihoodRequest("one", context, [choice]))).scores
        assert score.tokens == alone.tokens == len(choice)
        assert score.logprob == pytest.approx(alone.logprob, abs=1e-5)
        reference = reference_logprobs(llama_reference, context + choice)[len(context) - 1 : -1]
        expected = [float(step[t]) for step, t in zip(reference, choice, strict=True)]
        assert score.token_logprobs == pytest.approx(expected, abs=1e-5)
        argmax = [int(step.argmax()) for step in reference]
        assert score.is_greedy == (argmax == choice)
    assert together.best == max(range(4), key=lambda i: together.scores[i].logprob)


def test_choices_are_prefilled_together_over_one_context(llama):
    """The prefill's inputs, seen by a hook on transformers' model: one pass feeds the context
    once (but its last token, whose logits score each choice's first), and one more feeds
    every choice's span together, packed (the context's last token and the choice but its
    last, which nothing follows). An engine's first scored prompt with nothing stored runs one
    more pass, of one token, to learn the shape of an empty cache: a question of another
    context is scored first, so that this one's passes do not depend on the tests before it.
    The choices reach the worker at once, whenever its thread runs: here it is offered the GIL
    every microsecond, where it once took three of four choices in a loaded run."""
    tokenizer = llama.tokenizer()
    other = tokenizer.encode("Owls hunt at night over the fields and rivers of the valley.", special=True)  # fmt: skip
    assert run(llama.loglikelihood(LoglikelihoodRequest("o", other, [[other[-1]]]))).error is None
    context = tokenizer.encode("Zebras graze on the open plains while lions rest nearby. Q:", special=True)  # fmt: skip
    choices = [tokenizer.encode(c) for c in CHOICES]
    assert len(context) > 16  # the store shares prefixes of 16 tokens or more
    fed: list[int] = []
    hook = llama.model.register_forward_pre_hook(
        lambda _, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        result = run(llama.loglikelihood(LoglikelihoodRequest("q", context, choices)))
    finally:
        sys.setswitchinterval(interval)
        hook.remove()
    assert result.error is None
    assert fed == [len(context) - 1, sum(len(c) for c in choices)]


def test_many_questions_scored_at_once_equal_transformers(llama, llama_reference):
    """More scored prompts than the batch has rows, prefilled together: questions of several
    contexts, choices of one token (whose prompts but their last token are the same), a
    prompt scored from its first token, each as transformers' forward reads it alone."""
    tokenizer = llama.tokenizer()
    contexts = [tokenizer.encode(c, special=True) for c in (CONTEXT, TEXT, "Pick one:")]
    choices = [tokenizer.encode(c) for c in (*CHOICES, " a", " b")]
    prompts = [(c + choice, len(c)) for c in contexts for choice in choices]
    prompts.append((tokenizer.encode(TEXT, special=True), 1))
    results = llama.generate([scored(ids, 2, score_from=f) for ids, f in prompts])
    assert len(prompts) > 4 * 4  # beyond batch_size's count of requests
    for result, (ids, score_from) in zip(results, prompts, strict=True):
        reference = reference_logprobs(llama_reference, ids)
        assert_equals_reference(result, ids, reference, 2, abs=1e-5, score_from=score_from)


def test_scoring_mixed_with_generation_gives_the_same_as_alone(llama):
    tokenizer = llama.tokenizer()
    ids = [tokenizer.encode(t, special=True) for t in (TEXT, CONTEXT)]
    generating = GenerationParams(max_new_tokens=12, logprobs=True, prompt_logprobs=2)
    rows = [
        Request("g1", [Message("user", "Tell me a story.")], GenerationParams(max_new_tokens=16)),
        scored(ids[0], rid="s1"),
        Request("g2", [], generating, prompt_ids=ids[1]),
        scored(ids[1], k=1, score_from=5, rid="s2"),
        Request("g3", [Message("user", "And another one.")], GenerationParams(max_new_tokens=9)),
    ]
    together = llama.generate(rows)
    alone = [llama.generate([row])[0] for row in rows]
    for mixed, single in zip(together, alone, strict=True):
        assert mixed.ok and single.ok
        assert mixed.text == single.text
        if single.prompt_logprobs is None:
            assert mixed.prompt_logprobs is None
            continue
        got = [(e.id, e.top_ids) if e else None for e in mixed.prompt_logprobs]
        assert got == [(e.id, e.top_ids) if e else None for e in single.prompt_logprobs]
        values = [e.logprob for e in mixed.prompt_logprobs if e]
        assert values == pytest.approx([e.logprob for e in single.prompt_logprobs if e], abs=1e-5)
    assert together[2].usage.completion_tokens == 12  # it scored its prompt and generated


def test_token_ids_prompt_equals_the_same_text_prompt(llama):
    params = GenerationParams(max_new_tokens=8, prompt_logprobs=2)
    (text,) = llama.generate([Request("t", [], params, prompt=TEXT)])
    (by_ids,) = llama.generate([Request("i", [], params, prompt_ids=text.prompt_ids)])
    assert text.prompt_ids == llama.tokenizer().encode(TEXT, special=True)
    assert by_ids.prompt_ids == text.prompt_ids
    assert by_ids.text == text.text
    assert [e.logprob for e in by_ids.prompt_logprobs[1:]] == pytest.approx(
        [e.logprob for e in text.prompt_logprobs[1:]], abs=1e-6
    )


def test_max_new_tokens_zero_generates_nothing(llama):
    tokenizer = llama.tokenizer()
    ids = tokenizer.encode(TEXT)
    (result,) = llama.generate(
        [Request("z", [], GenerationParams(max_new_tokens=0), prompt_ids=ids)]
    )
    assert result.ok
    assert (result.text, result.finish_reason) == ("", "length")
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (len(ids), 0)
    assert result.prompt_logprobs is None and result.prompt_ids == ids
    # Nothing follows the last token, so it is scored but never fed: a prompt one longer than
    # the context fits, as lm-eval's rolling windows are; one more does not.
    context = tokenizer.context_length
    whole = (ids * context)[: context + 1]
    fits, over = llama.generate([scored(whole, k=0, score_from=context), scored(whole + ids[:1])])
    assert fits.ok and fits.prompt_logprobs[context].id == whole[context]
    assert over.error is not None and f"context is {context}" in over.error.message


def test_perplexity_of_a_text_longer_than_the_context(llama, llama_reference):
    """lm-eval's rolling windows: the first fills the whole context after the BOS, so its
    prompt is the context and one token more; each token of the text is scored once."""
    from lmpress.engines.scoring import perplexity
    from lmpress.vocabulary.likelihood import rolling_windows

    tokenizer = llama.tokenizer()
    tokens = (tokenizer.encode(TEXT) * 40)[: tokenizer.context_length + 90]
    args = (tokens, tokenizer.bos_id, tokenizer.context_length)
    whole, result = run(perplexity(llama, "p", *args))
    assert result.error is None
    assert whole.tokens == len(tokens)
    expected: list[float] = []
    for context, continuation in rolling_windows(*args):
        window = context + continuation
        steps = reference_logprobs(llama_reference, window[:-1])[len(context) - 1 :]
        expected += [float(s[t]) for s, t in zip(steps, continuation, strict=True)]
    got = [lp for score in result.scores for lp in score.token_logprobs]
    assert got == pytest.approx(expected, abs=1e-5)
    assert whole.logprob == pytest.approx(sum(expected), abs=1e-3)


def test_bad_token_ids_fail_their_row_in_one_line(llama):
    bad, empty, good = llama.generate([scored([5, 10**7, 6]), scored([]), scored([5, 6, 7])])
    assert "prompt_ids: 10000000 is not a token id of this model" in bad.error.message
    assert "prompt_ids is empty" in empty.error.message
    assert good.ok and good.prompt_logprobs[2].id == 7


def test_tokenizer_meets_the_contract(llama):
    tokenizer = llama.tokenizer()
    plain = tokenizer.encode(TEXT)
    assert plain == llama.hf_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    # With its special tokens, a text is what a raw prompt of it reads.
    assert tokenizer.encode(TEXT, special=True) == llama.encode(Request("r", [], prompt=TEXT))
    assert tokenizer.decode(plain) == TEXT
    assert tokenizer.eos_id in llama.eos_ids
    assert tokenizer.context_length == llama.context_length


# --- SmolLM2's real weights, in float32 ------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    engine = make(SMOLLM2)
    yield engine
    run(engine.aclose())


def test_prompt_logprobs_equal_transformers_on_smollm2(smollm2):
    reference_model_ = reference_model(smollm2)
    tokenizer = smollm2.tokenizer()
    context = tokenizer.encode("The capital of France is")
    greedy = smollm2.generate(
        [Request("g", [], GenerationParams(max_new_tokens=3), prompt_ids=context)]
    )
    answer = tokenizer.encode(greedy[0].text)
    choices = [
        answer,
        tokenizer.encode(" Berlin"),
        tokenizer.encode(" a city"),
        tokenizer.encode(" big"),
    ]
    (whole,) = smollm2.generate([scored(context + answer, k=5)])
    reference = reference_logprobs(reference_model_, context + answer)
    assert_equals_reference(whole, context + answer, reference, 5, abs=1e-4)
    result = run(smollm2.loglikelihood(LoglikelihoodRequest("paris", context, choices)))
    assert "Paris" in greedy[0].text
    assert [s.is_greedy for s in result.scores] == [True, False, False, False]
    assert result.best == 0
    for choice, score in zip(choices, result.scores, strict=True):
        steps = reference_logprobs(reference_model_, context + choice)[len(context) - 1 : -1]
        assert score.logprob == pytest.approx(
            sum(float(s[t]) for s, t in zip(steps, choice, strict=True)), abs=1e-4
        )


def test_a_reply_that_ends_on_eos_lists_it_in_logprobs(smollm2):
    params = GenerationParams(max_new_tokens=40, logprobs=True, top_logprobs=1)
    (result,) = smollm2.generate([Request("e", [Message("user", "What is 2+2?")], params)])
    assert result.finish_reason == "stop"
    logprobs = result.samples[0].logprobs
    assert len(logprobs) == result.usage.completion_tokens
    assert logprobs[-1].id in smollm2.eos_ids
    assert logprobs[-1].token == smollm2.hf_tokenizer.decode([logprobs[-1].id])
    assert logprobs[-1].id == logprobs[-1].top_ids[0]  # greedy: the likeliest ended it
