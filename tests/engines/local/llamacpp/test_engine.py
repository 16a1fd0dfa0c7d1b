"""The LLAMACPP engine on tiny real GGUF files (SentencePiece-style "llama" and byte-level BPE
"gpt2" tokenizers) run by the real llama-cpp-python."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import ConfigError, ModelLoadError, UnsupportedParamError
from lmpress.vocabulary.types import ContentPart, Delta, GenerationParams, Message, Request, Result
from tests.conftest import REPO

TOKENIZERS = ["llama", "gpt2"]
PROMPTS = [f"Question {i}: why is the {['sky', 'sea', 'cat', 'tree'][i % 4]} " + "so " * (i % 5) + "blue?" for i in range(24)]  # fmt: skip


def make(model: str, model_kwargs: dict | None = None, **generation):
    overrides = {
        "engine": "LLAMACPP",
        "model.model_name": model,
        **{f"generation.{k}": v for k, v in {"max_new_tokens": 12, **generation}.items()},
    }
    if model_kwargs:
        overrides["model.model_kwargs"] = model_kwargs
    return create_engine(load_config(overrides=overrides))


def close(engine) -> None:
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module", params=TOKENIZERS)
def engine(request):
    eng = make(str(tiny_gguf(request.param)), batch_size=4)
    yield eng
    close(eng)


@pytest.fixture(scope="module")
def llama():
    eng = make(str(tiny_gguf("llama")), batch_size=4)
    yield eng
    close(eng)


def gguf_fields(path) -> dict:
    """The GGUF metadata as the gguf package reads it, independently of llama.cpp."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()}


# --- many sequences at once ------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_greedy_is_identical_at_batch_size_1_and_16(tokenizer):
    path = str(tiny_gguf(tokenizer))
    one, many = make(path, batch_size=1), make(path, batch_size=16)
    try:
        params = GenerationParams(max_new_tokens=16)
        alone = one.generate(PROMPTS, params.replace(batch_size=1))
        together = many.generate(PROMPTS, params.replace(batch_size=16))
    finally:
        close(one)
        close(many)
    assert len(PROMPTS) == 24
    assert all(r.ok for r in alone + together)
    assert [r.text for r in alone] == [r.text for r in together]
    assert [r.usage.completion_tokens for r in alone] == [
        r.usage.completion_tokens for r in together
    ]
    assert len({r.text for r in alone}) > 12  # replies depend on the prompt


def test_requests_in_flight_are_decoded_together():
    """Requests submitted together are decoded in the same steps; when they end, no sequence
    is in flight and the KV cache holds only what the engine keeps for reuse."""
    eng = make(str(tiny_gguf("llama")), batch_size=4)
    try:
        params = GenerationParams(max_new_tokens=48, min_tokens=48)
        results = eng.generate(PROMPTS[:6], params)
        assert all(r.ok and r.usage.completion_tokens == 48 for r in results)
        assert eng.scheduler.most_in_flight == 4
        assert eng.sequences_in_flight() == 0
        assert eng.kv_cells_used() == eng.kv_cells_cached() > 0
    finally:
        close(eng)


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_a_shared_prompt_prefix_is_read_once_per_sequence(tokenizer):
    """Rows with the same long system prompt: a sequence reused for a later row keeps the
    system prompt's KV cells and reads only the rest, and the replies are those of an engine
    that reads every prompt whole."""
    system = " ".join(["you answer in the words of the rivers and the sea"] * 6)
    params = GenerationParams(max_new_tokens=12)
    rows = [
        Request(str(i), [Message("system", system), Message("user", p)], params)
        for i, p in enumerate(PROMPTS[:8])
    ]
    path = str(tiny_gguf(tokenizer))
    cached = make(path, batch_size=2)
    try:
        replies = cached.generate(rows)
        system_tokens = len(cached.encode(Request("s", [Message("system", system)]))) // 2
    finally:
        close(cached)
    alone = []
    for row in rows:  # a new engine per row: nothing cached, every prompt read whole
        fresh = make(path, batch_size=2)
        try:
            alone += fresh.generate([row])
            assert fresh.scheduler.prompt_tokens_reused == 0
        finally:
            close(fresh)
    # The first two rows fill the two sequences; each later row reuses the system prompt.
    assert cached.scheduler.prompt_tokens_reused >= 6 * system_tokens
    assert [r.text for r in replies] == [r.text for r in alone]


def test_the_next_turn_of_a_chat_reads_only_what_is_new():
    eng = make(str(tiny_gguf("gpt2")), batch_size=1)
    try:
        params = GenerationParams(max_new_tokens=20)
        turn = [Message("user", "tell me about the sea")]
        first = eng.generate([Request("1", turn, params)])[0]
        before = eng.scheduler.prompt_tokens_reused
        turn += [Message("assistant", first.text), Message("user", "and the rivers?")]
        second = eng.generate([Request("2", turn, params)])[0]
        assert second.ok
        # The whole first turn (its prompt, at least) was already in the sequence's cells.
        assert eng.scheduler.prompt_tokens_reused - before >= first.usage.prompt_tokens
    finally:
        close(eng)


def test_each_sequence_gets_an_equal_part_of_n_ctx():
    path = str(tiny_gguf("gpt2"))
    shared = make(path, {"n_ctx": 1024}, batch_size=4)
    alone = make(path, {"n_ctx": 1024}, batch_size=1)
    try:
        assert (shared.n_ctx, shared.n_ctx_seq, alone.n_ctx_seq) == (1024, 256, 1024)
        endless = GenerationParams(max_new_tokens=2000, min_tokens=2000)
        [full] = shared.generate(["Go on."], endless)
        assert full.finish_reason == "length"
        assert full.usage.prompt_tokens + full.usage.completion_tokens == 256
        long_prompt = ["word " * 300]
        [refused] = shared.generate(long_prompt, GenerationParams(max_new_tokens=4))
        assert refused.error is not None and refused.error.kind == "context_length_exceeded"
        assert (
            "the context of a sequence is 256 (model.model_kwargs.n_ctx 1024 shared by "
            "generation.batch_size 4): raise n_ctx or lower batch_size" in refused.error.message
        )
        assert alone.generate(long_prompt, GenerationParams(max_new_tokens=4))[0].ok
    finally:
        close(shared)
        close(alone)


def test_one_row_may_use_the_whole_n_ctx_and_rows_wait_for_room():
    """With model_kwargs.kv_unified the sequences share one KV cache of n_ctx cells: a long
    prompt or a long reply gets all of it, rows start while their prompt and max_new_tokens fit beside those in flight (the
    others wait, none is cut short), and only a prompt the whole context cannot hold fails,
    alone, naming n_ctx."""
    eng = make(str(tiny_gguf("gpt2")), {"n_ctx": 1024, "kv_unified": True}, batch_size=4)
    try:
        assert eng.n_ctx == eng.n_ctx_seq == 1024
        endless = GenerationParams(max_new_tokens=2000, min_tokens=2000)
        [full] = eng.generate(["Go on."], endless)
        assert full.finish_reason == "length"
        assert full.usage.prompt_tokens + full.usage.completion_tokens == 1024
        long, short = ["word " * 300], GenerationParams(max_new_tokens=4)
        [answered] = eng.generate(long, short)
        assert answered.ok and answered.usage.prompt_tokens > 300
        # Four rows of 400 tokens: two fit in 1024 cells at a time, and all four end whole.
        params = GenerationParams(max_new_tokens=400, min_tokens=400)
        eng.scheduler.most_in_flight = 0
        results = eng.generate(PROMPTS[:4], params)
        assert [r.usage.completion_tokens for r in results] == [400] * 4
        assert eng.scheduler.most_in_flight == 2
        assert eng.scheduler.reserved == 0 and eng.sequences_in_flight() == 0
        [refused, fine] = eng.generate(["word " * 1100, "hi"], short)
        assert refused.error is not None and refused.error.kind == "context_length_exceeded"
        assert "the context is 1024 (model.model_kwargs.n_ctx)" in refused.error.message
        assert fine.ok
    finally:
        close(eng)


# --- agreement with llama-cpp-python ---------------------------------------------------------


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_rendered_prompt_matches_llama_cpp_python(tokenizer):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    path = tiny_gguf(tokenizer)
    fields = gguf_fields(path)
    tokens = fields["tokenizer.ggml.tokens"]
    formatter = Jinja2ChatFormatter(
        template=fields["tokenizer.chat_template"],
        eos_token=tokens[fields["tokenizer.ggml.eos_token_id"]],
        bos_token=tokens[fields["tokenizer.ggml.bos_token_id"]],
    )
    conversation = [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": "Light scatters."},
        {"role": "user", "content": "And at sunset, café?"},
    ]
    eng = make(str(path), batch_size=2)
    try:
        request = Request("r", [Message(m["role"], m["content"]) for m in conversation])
        assert eng.render(request) == formatter(messages=conversation).prompt
    finally:
        close(eng)


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_greedy_replies_match_llama_cpp_python_token_for_token(tokenizer):
    """Same model, same prompt tokens, greedy: the batched engine produces what llama-cpp-python's
    own one-sequence generation produces."""
    import llama_cpp

    path = str(tiny_gguf(tokenizer))
    kwargs = {"n_ctx": 1024, "flash_attn": False}
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS[:6]]
    eng = make(path, kwargs, batch_size=6)
    try:
        requests = [
            Request(str(i), [Message(**m) for m in c], GenerationParams(max_new_tokens=20))
            for i, c in enumerate(conversations)
        ]
        results = eng.generate(requests)
        prompt_ids = [eng.encode(r) for r in requests]
    finally:
        close(eng)
    llm = llama_cpp.Llama(model_path=path, verbose=False, **kwargs)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    try:
        for conversation, ids, result in zip(conversations, prompt_ids, results, strict=True):
            usage = llm.create_chat_completion(conversation, max_tokens=1)["usage"]
            # The prompt ids its own chat completion evaluated, by value, not only by count.
            assert ids == [int(t) for t in llm._input_ids[: usage["prompt_tokens"]]]
            assert result.usage.prompt_tokens == len(ids)
            reply = []
            for token in llm.generate(ids, temp=0.0):
                if llama_cpp.llama_vocab_is_eog(vocab, token) or len(reply) == 20:
                    break
                reply.append(token)
            expected = llm.detokenize(reply).decode("utf-8", errors="replace")
            assert result.text == expected
            assert result.usage.completion_tokens == len(reply) + (len(reply) < 20)
    finally:
        llm.close()


# --- generation parameters ---------------------------------------------------------------------


def test_usage_and_length_finish(engine):
    result = engine.generate(["Tell me everything."], GenerationParams(max_new_tokens=5, min_tokens=5))[0]  # fmt: skip
    assert result.ok
    assert result.usage.prompt_tokens > 3
    assert result.usage.completion_tokens == 5
    assert result.finish_reason == "length"
    assert result.engine == "LLAMACPP" and result.model == engine.model_name


def test_seeded_rows_are_reproducible_whatever_the_batch(llama):
    params = GenerationParams(max_new_tokens=16, temperature=1.0, seed=11)
    alone = llama.generate(["Pick a word."], params)[0].text
    others = [Request(str(i), [Message("user", p)], params.replace(seed=i)) for i, p in enumerate(PROMPTS[:5])]  # fmt: skip
    mixed = llama.generate([*others[:2], Request("x", [Message("user", "Pick a word.")], params), *others[2:]])  # fmt: skip
    assert mixed[2].text == alone
    assert llama.generate(["Pick a word."], params.replace(seed=12))[0].text != alone
    unseeded = {r.text for r in llama.generate(["Pick a word."] * 4, params.replace(seed=None))}
    assert len(unseeded) > 1


def test_sampling_settings_narrow_the_choice(llama):
    params = GenerationParams(max_new_tokens=12, temperature=5.0, seed=3)
    wild = llama.generate(["Pick a word."], params)[0].text
    top1 = llama.generate(["Pick a word."], params.replace(top_k=1))[0].text
    greedy = llama.generate(["Pick a word."], GenerationParams(max_new_tokens=12))[0].text
    assert top1 == greedy != wild
    for narrowing in ({"top_p": 1e-6}, {"min_p": 1.0}):
        assert llama.generate(["Pick a word."], params.replace(**narrowing))[0].text == greedy


def test_n_samples(llama):
    params = GenerationParams(max_new_tokens=10, temperature=1.0, seed=5, n=3)
    result = llama.generate(["Give me options."], params)[0]
    assert result.ok and len(result.samples) == 3
    assert len({s.text for s in result.samples}) > 1
    assert result.usage.completion_tokens == sum(s.completion_tokens for s in result.samples)
    again = llama.generate(["Give me options."], params)[0]
    assert [s.text for s in again.samples] == [s.text for s in result.samples]


def test_n_larger_than_batch_size_fails_the_row(llama):
    result = llama.generate(["hi"], GenerationParams(max_new_tokens=4, n=5, temperature=1.0))[0]
    assert result.error is not None and "batch_size" in result.error.message


def test_stop_strings_cut_the_reply(engine):
    params = GenerationParams(max_new_tokens=24, min_tokens=24)
    full = engine.generate(["Tell a story."], params)[0].text
    stop = full[6:8]
    cut = engine.generate(["Tell a story."], params.replace(stop_strings=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]
    assert cut.samples[0].stop_sequence == stop  # the sample names the string that ended it
    later = full[full.index(stop) + 2 :][:2]  # a stop further on loses to the earlier one
    both = engine.generate(["Tell a story."], params.replace(stop_strings=[later, stop]))[0]
    assert both.text == cut.text and both.samples[0].stop_sequence == stop
    # Ended by the length limit, a stop string that never appears is not named.
    long = engine.generate(["Tell a story."], params.replace(stop_strings=["\x00never"]))[0]
    assert long.finish_reason == "length" and long.samples[0].stop_sequence is None


def test_streamed_deltas_add_up_to_the_reply(engine):
    async def run(params):
        request = Request("s", [Message("user", "Stream this please")], params)
        deltas, final = [], None
        async for item in engine.stream(request):
            if isinstance(item, Delta):
                deltas.append(item.text)
            else:
                final = item
        return deltas, final

    params = GenerationParams(max_new_tokens=16, min_tokens=16)
    plain = asyncio.run(run(params))
    stop = plain[1].text[5:7]
    for deltas, final in (plain, asyncio.run(run(params.replace(stop_strings=[stop])))):
        assert isinstance(final, Result) and final.ok
        assert len(deltas) > 1
        assert "".join(deltas) == final.text


def test_characters_split_across_tokens_stream_whole():
    """SentencePiece byte fallback spells CJK characters as three byte tokens each; the reply
    holds whole characters, and a stream never shows part of one."""
    path = tiny_gguf("llama")
    tokens = gguf_fields(path)["tokenizer.ggml.tokens"]
    # Only byte tokens can win: the model strings the three bytes of 東 together in some order.
    bias = {str(tokens.index(f"<0x{b:02X}>")): 50.0 for b in "東".encode()}
    eng = make(str(path), batch_size=2)

    async def run():
        params = GenerationParams(max_new_tokens=30, logit_bias=bias)
        deltas, final = [], None
        async for item in eng.stream(Request("b", [Message("user", "x")], params)):
            if isinstance(item, Delta):
                deltas.append(item.text)
            else:
                final = item
        return deltas, final

    try:
        deltas, final = asyncio.run(run())
    finally:
        close(eng)
    assert final.ok
    assert any(ord(c) > 0x7F and c != "\ufffd" for c in final.text)  # e.g. 汱 = E6 B1 B1
    assert "".join(deltas) == final.text


def test_a_stop_string_drops_the_half_character_after_it():
    """BPE token 'cafÃ' is 'caf' plus the first byte of 'é': stopping at 'caf' leaves nothing
    of that byte in the reply."""
    from lmpress.builtin_models.tiny_gguf import byte_to_unicode

    path = tiny_gguf("gpt2")
    token = gguf_fields(path)["tokenizer.ggml.tokens"].index("caf" + byte_to_unicode()[0xC3])
    eng = make(str(path), batch_size=2)
    try:
        params = GenerationParams(max_new_tokens=5, logit_bias={str(token): 100.0})
        plain = eng.generate(["x"], params)[0]
        cut = eng.generate(["x"], params.replace(stop_strings=["caf"]))[0]
    finally:
        close(eng)
    assert plain.text.startswith("caf")
    assert cut.finish_reason == "stop" and cut.text == ""


def test_invalid_utf8_becomes_replacement_characters(engine):
    texts = [r.text for r in engine.generate([f"bytes {i}" for i in range(8)], GenerationParams(max_new_tokens=32))]  # fmt: skip
    assert any("\ufffd" in t for t in texts)
    for text in texts:
        text.encode("utf-8")  # always valid text


def test_min_tokens_holds_off_the_end_and_stop_token_ids_end_it(llama):
    eos = llama.llama.token_eos()
    forced_end = GenerationParams(max_new_tokens=20, logit_bias={str(eos): 100.0})
    ended = llama.generate(["hi"], forced_end)[0]
    assert ended.finish_reason == "stop" and ended.text == "" and ended.usage.completion_tokens == 1
    # The end of sequence, not a stop string, ended it: none is named.
    ended = llama.generate(["hi"], forced_end.replace(stop_strings=["zz"]))[0]
    assert ended.finish_reason == "stop" and ended.samples[0].stop_sequence is None
    held = llama.generate(["hi"], forced_end.replace(min_tokens=6))[0]
    assert held.finish_reason == "stop" and held.usage.completion_tokens == 7
    other = eos + 5
    stopped = llama.generate(["hi"], GenerationParams(max_new_tokens=20, logit_bias={str(other): 100.0}, stop_token_ids=[other]))[0]  # fmt: skip
    assert stopped.finish_reason == "stop" and stopped.usage.completion_tokens == 1


def test_token_ids_outside_the_vocabulary_fail_the_row(llama):
    result = llama.generate(["hi"], GenerationParams(max_new_tokens=4, logit_bias={"99999": 1.0}))[0]  # fmt: skip
    assert result.error is not None and "generation.logit_bias: '99999'" in result.error.message
    result = llama.generate(["hi"], GenerationParams(max_new_tokens=4, stop_token_ids=[-1]))[0]
    assert result.error is not None and "generation.stop_token_ids: -1" in result.error.message


def test_logprobs(engine):
    result = engine.generate(["hi"], GenerationParams(max_new_tokens=6, min_tokens=6, logprobs=True, top_logprobs=3))[0]  # fmt: skip
    logprobs = result.samples[0].logprobs
    assert logprobs is not None and len(logprobs) == 6
    for entry in logprobs:
        assert entry.logprob <= 0
        assert len(entry.top) == 3
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)
        # Greedy picks the most likely token.
        assert entry.top[0] == (entry.token, pytest.approx(entry.logprob))


def test_cancelling_a_stream_frees_its_sequence(tmp_path):
    eng = make(str(tiny_gguf("gpt2")), batch_size=1)

    async def run():
        long = Request("long", [Message("user", "go on")], GenerationParams(max_new_tokens=1500, min_tokens=1500))  # fmt: skip
        stream = eng.stream(long)
        async for item in stream:
            if isinstance(item, Delta):
                break  # the consumer goes away mid-reply
        assert eng.sequences_in_flight() == 1
        await stream.aclose()
        # With batch_size 1 the next request can only run once the first one's slot is free.
        short = Request("short", [Message("user", "hi")], GenerationParams(max_new_tokens=4))
        return await asyncio.wait_for(eng.complete(short), timeout=120)

    try:
        result = asyncio.run(run())
        assert result.ok and result.usage.completion_tokens <= 4
        # The cancelled sequence's cells are gone; the short one's are kept for reuse.
        assert eng.sequences_in_flight() == 0
        assert eng.kv_cells_used() == eng.kv_cells_cached() < 1500
    finally:
        close(eng)


def test_closing_the_engine_ends_the_requests_in_flight():
    eng = make(str(tiny_gguf("gpt2")), batch_size=1)

    async def run():
        params = GenerationParams(max_new_tokens=1500, min_tokens=1500)
        running = asyncio.ensure_future(eng.complete(Request("a", [Message("user", "go")], params)))
        waiting = asyncio.ensure_future(
            eng.complete(Request("b", [Message("user", "wait")], params))
        )
        for _ in range(1000):  # until the first one is being decoded
            if eng.sequences_in_flight():
                break
            await asyncio.sleep(0.01)
        await eng.aclose()
        return await asyncio.gather(running, waiting)

    for result in asyncio.run(run()):
        assert result.error is not None and result.error.kind == "engine_closed"


def test_a_closed_engine_refuses_new_requests():
    eng = make(str(tiny_gguf("gpt2")), batch_size=1)
    close(eng)
    request = Request("late", [Message("user", "hello?")], GenerationParams(max_new_tokens=2))
    with pytest.raises(RuntimeError, match="the LLAMACPP engine is closed"):
        asyncio.run(eng.complete(request))


# --- bad input -----------------------------------------------------------------------------------


def test_prompt_longer_than_the_context_fails_that_row():
    eng = make(str(tiny_gguf("llama")), {"n_ctx": 256}, batch_size=4)
    try:
        results = eng.generate(["word " * 400, "short"], GenerationParams(max_new_tokens=4))
    finally:
        close(eng)
    assert results[0].error is not None
    assert results[0].error.kind == "context_length_exceeded"
    assert "prompt is" in results[0].error.message and "raise n_ctx" in results[0].error.message
    assert results[1].ok


def test_n_ctx_defaults_to_the_models_own_context(llama):
    assert llama.n_ctx == gguf_fields(llama.path)["llama.context_length"] == 2048


def test_raw_prompt_skips_the_chat_template(llama):
    raw = Request("raw", [], GenerationParams(max_new_tokens=4), prompt="Once upon")
    result = llama.generate([raw])[0]
    assert result.ok
    expected = llama.llama.tokenize(b"Once upon", add_bos=True)  # by value, not by count
    assert llama.encode(raw) == expected
    assert result.usage.prompt_tokens == len(expected)


def test_image_parts_fail_the_row_not_the_engine(llama):
    image = Message("user", [ContentPart("image_url", image_url="file:///x.png")])
    results = llama.generate([Request("img", [image], GenerationParams(max_new_tokens=4)), "fine"])
    assert results[0].error is not None and "sends text only" in results[0].error.message
    assert results[1].ok


def test_chat_template_override():
    eng = create_engine(load_config(overrides={
        "engine": "LLAMACPP",
        "model.model_name": str(tiny_gguf("llama")),
        "model.chat_template": "chatml",
        "generation.max_new_tokens": 4,
    }))  # fmt: skip
    try:
        rendered = eng.render(Request("t", [Message("user", "abc")]))
        assert rendered == "<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\n"
    finally:
        close(eng)


def test_model_kwargs_reach_llama_cpp():
    eng = make(str(tiny_gguf("gpt2")), {"n_ctx": 2048, "n_batch": 64, "n_threads": 1}, batch_size=4)
    try:
        import llama_cpp

        assert (eng.n_ctx, eng.n_ctx_seq) == (2048, 512)
        assert llama_cpp.llama_n_batch(eng.scheduler._ctx.ctx) == 64
        assert llama_cpp.llama_n_threads(eng.scheduler._ctx.ctx) == 1
        # A prompt longer than n_batch is fed in chunks.
        assert eng.generate(["word " * 100], GenerationParams(max_new_tokens=4))[0].ok
    finally:
        close(eng)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"n_ctxx": 512},
            "model.model_kwargs.n_ctxx: not a llama-cpp-python Llama parameter; did you mean 'n_ctx'?",
        ),  # fmt: skip
        ({"seed": 1}, "model.model_kwargs.seed: set generation.seed instead"),
        ({"chat_format": "chatml"}, "model.model_kwargs.chat_format: set model.chat_template"),
    ],
)
def test_model_kwargs_are_checked_against_llama(kwargs, message):
    with pytest.raises(ConfigError) as caught:
        make(str(tiny_gguf("llama")), kwargs)
    assert message in str(caught.value)


def test_missing_and_non_gguf_models(tmp_path):
    with pytest.raises(ModelLoadError, match="'./no/such.gguf' does not exist"):
        make("./no/such.gguf")
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_text('{"not": "a model"}')
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        make(str(not_gguf))
    with pytest.raises(ModelLoadError, match="is a directory"):
        make(str(tmp_path))
    with pytest.raises(ModelLoadError, match="unknown tiny GGUF model 'nope'"):
        make("tiny-gguf:nope")


def test_truncated_gguf_is_a_load_error(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_gguf("llama").read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="cannot load GGUF model"):
        make(str(broken))


def test_settings_that_cannot_run_together_are_refused_before_loading():
    # LLAMACPP takes every generation setting; a beam search refuses a temperature.
    with pytest.raises(UnsupportedParamError, match=r"generation.temperature does not go with generation.num_beams 2"):  # fmt: skip
        make("./not/even/loaded.gguf", num_beams=2, temperature=0.7)


def test_the_module_imports_no_backend():
    code = (
        "import sys, lmpress.engines.local.llamacpp.engine, lmpress.builtin_models.tiny_gguf\n"
        "print(sorted(m for m in ('llama_cpp', 'gguf', 'numpy', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"
