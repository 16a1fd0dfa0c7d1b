"""The samplers of NATIVE and LLAMACPP (tiny real models): settings that leave one token are
greedy, draws at temperature 1 follow the model's own softmax (a chi-square test against the
logits of the reference library), and seeded rows keep what README's "Seeds" paragraph promises.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from lmpress.builtin_models.tiny import tiny_model
from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request

MODELS = {"NATIVE": lambda: str(tiny_model("llama")), "LLAMACPP": lambda: str(tiny_gguf("llama"))}
PROMPTS = ["Why is the sky blue?", "one two three four", "Tell me about the sea.", "hello", "Pick a word.", "the cat sat"]  # fmt: skip


def make(engine: str, batch_size: int):
    overrides = {"engine": engine, "model.model_name": MODELS[engine](), "generation.batch_size": batch_size}  # fmt: skip
    if engine == "NATIVE":
        # float32 wherever the suite runs: on a CUDA GPU `auto` is bfloat16, where the tiny
        # model's logits tie (min_p 1.0 then keeps several tokens) and repeat less.
        overrides["model.torch_dtype_str"] = "float32"
    return create_engine(load_config(overrides=overrides))


@pytest.fixture(scope="module", params=list(MODELS))
def engine(request):
    eng = make(request.param, batch_size=16)
    yield eng
    asyncio.run(eng.aclose())


def texts(engine, params: GenerationParams) -> list[str]:
    results = engine.generate([Request(str(i), [Message("user", p)], params) for i, p in enumerate(PROMPTS)])  # fmt: skip
    assert all(r.ok for r in results)
    return [r.text for r in results]


@pytest.mark.parametrize("narrowing", [{"top_k": 1}, {"top_p": 1e-9}, {"min_p": 1.0}], ids=str)
def test_a_setting_that_leaves_one_token_is_greedy(engine, narrowing):
    greedy = texts(engine, GenerationParams(max_new_tokens=16, min_tokens=16))
    wild = GenerationParams(max_new_tokens=16, min_tokens=16, temperature=1.5, seed=5)
    assert texts(engine, wild.replace(**narrowing)) == greedy
    assert texts(engine, wild) != greedy  # without it, the same seed does sample


# --- draws follow the softmax ----------------------------------------------------------------

DRAWS, PER_REQUEST = 400, 16


def first_token_distribution(engine, ids: list[int], end_ids: set[int]) -> list[float]:
    """The softmax at temperature 1 of the logits after `ids`, computed by the reference library
    (transformers for NATIVE, llama-cpp-python for LLAMACPP), end tokens held off as
    min_tokens holds them off."""
    import numpy as np

    if engine.name == "NATIVE":
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(MODELS["NATIVE"](), dtype=torch.float32)
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1].double().numpy()
    else:
        import llama_cpp

        llm = llama_cpp.Llama(MODELS["LLAMACPP"](), verbose=False, n_ctx=512, logits_all=True)
        try:
            llm.eval(ids)
            logits = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
        finally:
            llm.close()
    logits[sorted(end_ids)] = -np.inf
    probs = np.exp(logits - logits.max())
    return (probs / probs.sum()).tolist()


def chi_square_critical(df: int) -> float:
    """The chi-square value that p = 0.001 exceeds (Wilson-Hilferty; within 0.2% of the
    tables for df >= 5: 20.52 at 5, 29.59 at 10, 45.32 at 20)."""
    z = 3.0902  # the standard normal's 0.999 quantile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_draws_at_temperature_1_follow_the_models_softmax(engine):
    request = Request("d", [Message("user", "Pick a word.")])
    ids = engine.encode(request)
    if engine.name == "NATIVE":
        end_ids, label = engine.eos_ids, lambda t: engine.hf_tokenizer.decode([t])
    else:
        end_ids, label = set(engine.vocab.end_ids()), engine.vocab.string
    probs = first_token_distribution(engine, ids, end_ids)
    # One token each, sampled with its own seed; tokens are told apart by their text.
    params = GenerationParams(max_new_tokens=1, min_tokens=1, temperature=1.0, logprobs=True, n=PER_REQUEST)  # fmt: skip
    requests = [Request(str(k), request.messages, params.replace(seed=k * PER_REQUEST)) for k in range(DRAWS // PER_REQUEST)]  # fmt: skip
    drawn: dict[str, int] = {}
    for result in engine.generate(requests):
        for sample in result.samples:
            drawn[sample.logprobs[0].token] = drawn.get(sample.logprobs[0].token, 0) + 1
    expected: dict[str, float] = {}
    for token, p in enumerate(probs):
        if p > 0:
            expected[label(token)] = expected.get(label(token), 0.0) + p * DRAWS
    assert set(drawn) <= set(expected)  # nothing drawn that the model gives no chance
    # Tokens expected fewer than 5 times pooled into one bin, as the test requires.
    common = [t for t, e in expected.items() if e >= 5]
    bins = [(drawn.get(t, 0), expected[t]) for t in common]
    rest = [(DRAWS - sum(o for o, _ in bins), DRAWS - sum(e for _, e in bins))]
    bins += rest if rest[0][1] >= 5 else []
    assert len(bins) >= 6  # the distribution is spread enough for the test to mean something
    statistic = sum((o - e) ** 2 / e for o, e in bins)
    assert statistic < chi_square_critical(len(bins) - 1), (statistic, bins)


# --- seeds -------------------------------------------------------------------------------------

MIXED = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 20},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.05, "repetition_penalty": 1.3},
    {"temperature": 0.0},
    {"temperature": 0.9, "presence_penalty": 1.0, "frequency_penalty": 0.5},
]


def mixed_rows(count: int, max_new_tokens: int) -> list[Request]:
    return [
        Request(
            f"r{i}",
            [Message("user", PROMPTS[i % len(PROMPTS)])],
            GenerationParams(max_new_tokens=max_new_tokens, seed=300 + i, **MIXED[i % len(MIXED)]),
        )  # fmt: skip
        for i in range(count)
    ]


def test_llamacpp_seeded_rows_at_batch_size_1_do_not_depend_on_order_or_neighbours():
    """What README states for LLAMACPP: at batch_size 1 a seeded row's text is a function of
    its seed and settings (at larger batch sizes it need not be)."""
    engine = make("LLAMACPP", batch_size=1)
    try:
        rows = mixed_rows(8, 16)
        forward = {r.request_id: r.text for r in engine.generate(rows)}
        backward = {r.request_id: r.text for r in engine.generate(rows[::-1])}
        alone = engine.generate([rows[3]])[0].text
    finally:
        asyncio.run(engine.aclose())
    assert forward == backward
    assert alone == forward["r3"]
    assert len(set(forward.values())) == len(rows)


# --- NATIVE's pick without sorting the whole vocabulary -----------------------------------------


def full_sort_pick(logits, top_k: int, top_p: float, min_p: float, draw: float) -> int:
    """The token a row's draw picks, written out plainly: its whole vocabulary sorted from the
    most likely, the tail top_k, top_p and min_p cut left out (the most likely token always
    kept), then the first token whose cumulative share reaches the draw's share of what is
    left."""
    import torch

    ordered, order = logits.sort(descending=True)
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    keep = (torch.arange(len(probs)) < top_k) & (before <= top_p) & (probs >= min_p * probs[0])
    keep[0] = True
    cdf = (probs * keep).cumsum(dim=-1)
    return int(order[min(int(torch.searchsorted(cdf, draw * cdf[-1])), len(probs) - 1)])


def test_native_picks_the_token_a_sort_of_the_whole_vocabulary_picks(monkeypatch):
    """NATIVE sorts a row's whole vocabulary only where its draw may land past its most likely
    tokens (native/sampling.py): over peaked and flat distributions and settings that cut the
    tail early, late or not at all, every pick is the full sort's, and both ways are taken."""
    import random

    import torch

    from lmpress.engines.local.native import sampling
    from lmpress.engines.local.worker import Submission

    full_sorts = []
    real = sampling.BatchControl._sample_sorted
    monkeypatch.setattr(
        sampling.BatchControl,
        "_sample_sorted",
        lambda self, logits, *rest: full_sorts.append(len(logits)) or real(self, logits, *rest),
    )
    control = sampling.BatchControl([], tokenizer=None, eos_ids=set())
    draw_rng = random.Random(55)
    picks = 0
    for trial in range(24):
        vocab = [49152, 1000, 130][trial % 3]
        peak = [1.0, 4.0, 10.0][trial // 3 % 3]  # flat to peaked
        scores = torch.randn(16, vocab, generator=torch.Generator().manual_seed(trial)) * peak
        settings = [
            {"temperature": draw_rng.choice([0.5, 1.0, 1.5])}
            | draw_rng.choice([{}, {"top_k": 5}, {"top_k": 500}, {"top_p": 0.9}, {"min_p": 0.05}])
            for _ in range(16)
        ]  # fmt: skip
        seeds = [draw_rng.randrange(2**31) for _ in range(16)]
        rows = [
            sampling.BatchRow(
                Submission(Request(str(b), [], GenerationParams(**setting)), [], started=0.0),
                index=0,
                generator=torch.Generator().manual_seed(seed),
            )
            for b, (setting, seed) in enumerate(zip(settings, seeds, strict=True))
        ]
        picked = control._sample(scores.clone(), rows).tolist()
        for b, (setting, seed) in enumerate(zip(settings, seeds, strict=True)):
            draw = float(torch.rand(1, generator=torch.Generator().manual_seed(seed)))
            p = GenerationParams(**setting)
            logits = scores[b] / p.sampling_temperature()
            assert picked[b] == full_sort_pick(logits, p.top_k or vocab, p.top_p, p.min_p, draw)
            picks += 1
    assert 0 < sum(full_sorts) < picks / 2, (sum(full_sorts), picks)
