"""Each engine against its reference library, compared by value: NATIVE's greedy text and
per-token log-probabilities against transformers' own `generate` on the same prompt ids (tiny
models, a checkpoint that ships sampling defaults, and SmolLM2's real weights), and LLAMACPP's
prompt ids against the ids llama-cpp-python's own chat completion feeds its model."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from lmpress.builtin_models.packaged import SMOLLM2
from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

QUESTIONS = [
    "Why is the sky blue?",
    "Tell me about the sea.",
    "one two three four",
    "What is the capital of France?",
    "Write a line about rain, café and 東京.",
    "Name a fruit.",
]
NEW_TOKENS = 20


def make(model: str, engine: str = "NATIVE", **overrides):
    return create_engine(load_config(overrides={"engine": engine, "model.model_name": model, **overrides}))  # fmt: skip


def close(engine) -> None:
    asyncio.run(engine.aclose())


def chat(question: str, params: GenerationParams, rid: str = "q") -> Request:
    return Request(rid, [Message("user", question)], params)


def transformers_greedy(model, tokenizer, question: str, max_new_tokens: int, **kwargs):
    """transformers' own greedy decoding of one chat prompt, alone: its prompt ids, its reply's
    ids (up to and including an end token), and the log-softmax of each step's raw logits."""
    import torch

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
    )["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            ids,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    reply = out.sequences[0, ids.shape[1] :].tolist()
    eos = model.generation_config.eos_token_id
    ends = set(eos if isinstance(eos, list) else [eos])
    for i, token in enumerate(reply):
        if token in ends:
            reply = reply[: i + 1]
            break
    raw = [step[0].float().log_softmax(-1) for step in out.logits[: len(reply)]]
    return ids[0].tolist(), reply, raw, ends


def assert_equals_reference(engine, tokenizer, result, request, reference):
    prompt_ids, reply, steps, ends = reference
    assert engine.encode(request) == prompt_ids  # the same chat template, by value
    text_ids = [t for t in reply if t not in ends]
    assert result.text == tokenizer.decode(text_ids, skip_special_tokens=True)
    assert result.usage.completion_tokens == len(reply)
    expected = [float(step[token]) for step, token in zip(steps, reply, strict=True)]
    got = [entry.logprob for entry in result.samples[0].logprobs]
    assert got == pytest.approx(expected, abs=1e-4)
    # The top alternatives are the reference's, in its order.
    for entry, step in zip(result.samples[0].logprobs, steps, strict=True):
        values, top_ids = step.topk(3)
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-4)
        assert [t for t, _ in entry.top] == [tokenizer.decode([i]) for i in top_ids.tolist()]


# --- tiny models -------------------------------------------------------------------------------


WINDOW = 16  # tokens a layer of the sliding-window model attends to; the prompts are longer


def windowed(tmp_path_factory) -> str:
    """The tiny llama's weights as a Mistral whose layers attend to the last WINDOW tokens."""
    from lmpress.builtin_models.tiny import tiny_model

    path = tmp_path_factory.mktemp("mistral-window")
    shutil.copytree(tiny_model("llama"), path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=WINDOW)  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module", params=["llama", "gpt2", "llama-eager", "mistral-window"])
def tiny(request, tmp_path_factory):
    """A tiny model on NATIVE, and transformers' own model and tokenizer loaded apart from it:
    on its default attention (sdpa), on eager attention, and with a sliding window."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmpress.builtin_models.tiny import tiny_model

    name, _, variant = request.param.partition("-")
    path = windowed(tmp_path_factory) if variant == "window" else str(tiny_model(name))
    attention = {"attn_implementation": "eager"} if variant == "eager" else {}
    overrides = {f"model.{k}": v for k, v in attention.items()}
    engine = make(path, **{"generation.batch_size": 4, **overrides})
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **attention).eval()
    yield engine, model, AutoTokenizer.from_pretrained(path)
    close(engine)


def test_a_sliding_window_changes_the_replies(tmp_path_factory):
    """The windowed model is not the llama it was copied from: its replies differ, so the
    equality test above checks that NATIVE honours the window."""
    from lmpress.builtin_models.tiny import tiny_model

    params = GenerationParams(max_new_tokens=NEW_TOKENS)
    replies = []
    for path in (windowed(tmp_path_factory), str(tiny_model("llama"))):
        engine = make(path)
        try:
            replies.append([r.text for r in engine.generate([chat(q, params) for q in QUESTIONS])])
        finally:
            close(engine)
    assert replies[0] != replies[1]


def test_native_greedy_text_and_logprobs_equal_transformers_generate(tiny):
    """All rows submitted at once (batch 4: rows join and leave a batch already decoding);
    each must equal transformers decoding it alone."""
    engine, model, tokenizer = tiny
    params = GenerationParams(max_new_tokens=NEW_TOKENS, logprobs=True, top_logprobs=3)
    requests = [chat(q, params, str(i)) for i, q in enumerate(QUESTIONS)]
    results = engine.generate(requests)
    texts = set()
    for request, result in zip(requests, results, strict=True):
        question = request.messages[0].content
        reference = transformers_greedy(model, tokenizer, question, NEW_TOKENS)
        assert_equals_reference(engine, tokenizer, result, request, reference)
        texts.add(result.text)
    assert len(texts) == len(QUESTIONS)  # the replies depend on the prompt


def test_rows_leaving_joining_and_growing_the_slot_cache_equal_transformers_generate(
    tiny, monkeypatch
):
    """The slot cache grown 8 columns at a time, so that it grows again and again while rows of
    different lengths and reply limits join, leave (the last live row moving into the freed
    slot) and decode across each growth: every row still equals transformers decoding it
    alone, text and logprobs."""
    from lmpress.engines.local.native import batch_cache

    monkeypatch.setattr(batch_cache, "GROW_COLUMNS", 8)
    monkeypatch.setattr(batch_cache, "MASK_COLUMNS", 8)
    seen: list[tuple[int, int]] = []  # (rows, capacity) at each step
    step_inputs = batch_cache.BatchCache.step_inputs

    def watched(self, width=1):
        out = step_inputs(self, width)
        seen.append((len(self.lengths), self.capacity))
        return out

    monkeypatch.setattr(batch_cache.BatchCache, "step_inputs", watched)
    engine, model, tokenizer = tiny
    limits = [3, 25, 7, 1, 18, 30, 2, 12]
    questions = [QUESTIONS[i % len(QUESTIONS)] + " go" * (3 * i) for i in range(len(limits))]
    requests = [
        chat(q, GenerationParams(max_new_tokens=m, logprobs=True, top_logprobs=3), str(i))
        for i, (q, m) in enumerate(zip(questions, limits, strict=True))
    ]
    results = engine.generate(requests)
    for question, limit, request, result in zip(questions, limits, requests, results, strict=True):
        reference = transformers_greedy(model, tokenizer, question, limit)
        assert_equals_reference(engine, tokenizer, result, request, reference)
    assert len({capacity for _, capacity in seen}) > 3
    assert len({rows for rows, _ in seen}) > 2


SHIPPED = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
NEUTRAL = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}  # what they are unset


@pytest.fixture(scope="module")
def opinionated(tmp_path_factory):
    """tiny:llama whose generation_config.json sets repetition_penalty and
    no_repeat_ngram_size, and transformers' own model loaded from it (which reads them)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmpress.builtin_models.tiny import tiny_model

    path = tmp_path_factory.mktemp("opinionated") / "model"
    shutil.copytree(tiny_model("llama"), path)
    config_file = path / "generation_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **SHIPPED}))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert model.generation_config.no_repeat_ngram_size == 2
    return str(path), model, AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("policy", ["ignore", "use"])
def test_native_follows_the_generation_defaults_policy_as_transformers_does(opinionated, policy):
    """README: `ignore` (the default) gives the recipe's sampling whatever the checkpoint ships,
    so the reference is transformers with the shipped values neutralised; `use` applies them as
    transformers' generate does."""
    path, model, tokenizer = opinionated
    neutral = NEUTRAL if policy == "ignore" else {}
    engine = make(path, **{"model.generation_defaults": policy, "generation.batch_size": 4})
    try:
        params = GenerationParams(max_new_tokens=NEW_TOKENS, logprobs=True, top_logprobs=3)
        requests = [chat(q, params, str(i)) for i, q in enumerate(QUESTIONS[:4])]
        results = engine.generate(requests)
        for request, result in zip(requests, results, strict=True):
            question = request.messages[0].content
            reference = transformers_greedy(model, tokenizer, question, NEW_TOKENS, **neutral)
            # Log-probabilities are the model's own distribution, before penalties, as on
            # LLAMACPP and VLLM: transformers' raw logits, not its processed scores.
            assert_equals_reference(engine, tokenizer, result, request, reference)
    finally:
        close(engine)
    if policy == "use":  # the shipped values did change the replies
        plain = [transformers_greedy(model, tokenizer, q, NEW_TOKENS, **NEUTRAL) for q in QUESTIONS[:4]]  # fmt: skip
        assert [r.text for r in results] != [tokenizer.decode(p[1], skip_special_tokens=True) for p in plain]  # fmt: skip


# --- SmolLM2, real weights -----------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    engine = make(SMOLLM2, **{"generation.batch_size": 16})
    yield engine
    close(engine)


def test_native_greedy_text_and_logprobs_equal_transformers_generate_on_smollm2(smollm2):
    """The engine's model object is transformers' own: its `generate` is the reference."""
    params = GenerationParams(max_new_tokens=NEW_TOKENS, logprobs=True, top_logprobs=3)
    questions = [QUESTIONS[0], QUESTIONS[3], QUESTIONS[5], "What is 2+2?"]
    requests = [chat(q, params, str(i)) for i, q in enumerate(questions)]
    results = smollm2.generate(requests)
    for question, request, result in zip(questions, requests, results, strict=True):
        reference = transformers_greedy(smollm2.model, smollm2.hf_tokenizer, question, NEW_TOKENS)
        assert_equals_reference(smollm2, smollm2.hf_tokenizer, result, request, reference)
    assert "Paris" in results[1].text
    assert any(r.finish_reason == "stop" for r in results)  # an end token was compared too


MIXED = [
    {"temperature": 0.8},
    {"temperature": 1.0, "top_k": 20},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.2, "min_p": 0.05, "repetition_penalty": 1.2},
    {"temperature": 0.0},
    {"temperature": 0.9, "presence_penalty": 0.5, "frequency_penalty": 0.3},
]
TOPICS = ["cats", "rivers", "bread", "snow", "tea", "iron", "maps", "salt"] * 2


def test_native_seeded_rows_do_not_depend_on_the_batch_on_smollm2(smollm2):
    """README: on NATIVE a seeded row's text does not depend on the batch. 16 rows with mixed
    settings, decoded all sixteen together (batch_size 16) and four at a time, and the first six
    (one of each setting in MIXED) alone: each row alone costs a fifth of all sixteen together,
    and the ten others repeat those settings with other seeds."""
    rows = [
        chat(
            f"Tell me something about {topic}.",
            GenerationParams(max_new_tokens=10, seed=500 + i, **MIXED[i % len(MIXED)]),
            str(i),
        )  # fmt: skip
        for i, topic in enumerate(TOPICS)
    ]
    together = [r.text for r in smollm2.generate(rows)]
    fours = [r.text for k in range(0, 16, 4) for r in smollm2.generate(rows[k : k + 4][::-1])[::-1]]  # fmt: skip
    alone = [smollm2.generate([row])[0].text for row in rows[: len(MIXED)]]
    assert together == fours
    assert together[: len(MIXED)] == alone
    assert len(set(together)) > 12  # seeds and settings do make the rows differ


# --- LLAMACPP: prompt ids by value -------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": "Light scatters."},
    {"role": "user", "content": "And at sunset, café? 東京"},
]


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_llamacpp_prompt_ids_equal_llama_cpp_pythons_own(tokenizer):
    """The ids llama-cpp-python's `create_chat_completion` evaluates as the prompt (the first
    `prompt_tokens` of its model's input ids) and `Llama.tokenize` of its own formatter's text,
    by value."""
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    path = str(tiny_gguf(tokenizer))
    conversations = [CONVERSATION, CONVERSATION[1:2], [{"role": "user", "content": "hi"}]]
    engine = make(path, "LLAMACPP", **{"generation.batch_size": 2})
    try:
        ours = [engine.encode(Request("r", [Message(**m) for m in c])) for c in conversations]
    finally:
        close(engine)
    llm = llama_cpp.Llama(model_path=path, verbose=False, n_ctx=1024)
    try:
        formatter = Jinja2ChatFormatter(
            template=llm.metadata["tokenizer.chat_template"],
            eos_token=llm._model.token_get_text(llm.token_eos()),
            bos_token=llm._model.token_get_text(llm.token_bos()),
        )
        for conversation, ids in zip(conversations, ours, strict=True):
            reply = llm.create_chat_completion(conversation, max_tokens=1, temperature=0.0)
            # Its input ids: the prompt, then whatever it generated.
            evaluated = [int(t) for t in llm._input_ids[: reply["usage"]["prompt_tokens"]]]
            assert ids == evaluated
            text = formatter(messages=conversation).prompt
            assert ids == llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    finally:
        llm.close()
    assert len({tuple(ids) for ids in ours}) == len(conversations)
