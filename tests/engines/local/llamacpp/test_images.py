"""LLAMACPP with a projector (`model.model_kwargs.mmproj`): the tiny GGUF model and the tiny
LLaVA-style projector written with the gguf package (builtin_models/tiny_gguf.py "llama-mmproj", 16 tokens an
image), against llama.cpp's own multimodal path (libmtmd's mtmd_helper_eval_chunks on a
single-sequence context, then greedy decoding)."""

from __future__ import annotations

import asyncio
import ctypes

import pytest

from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import ContentPart, GenerationParams, Message, Request
from tests.image_files import CORRUPT_PNG, data_url, picture

pytest.importorskip("llama_cpp.mtmd_cpp")
pytest.importorskip("PIL")

TOKENS_PER_IMAGE = 16
MAX_NEW = 8


@pytest.fixture(scope="module")
def vlm():
    engine = create_engine(load_config(overrides={
        "engine": "LLAMACPP", "model.model_name": "tiny-gguf:llama",
        "model.model_kwargs": {"mmproj": "tiny-gguf:llama-mmproj"},
        "generation.max_new_tokens": MAX_NEW, "generation.batch_size": 4,
    }))  # fmt: skip
    yield engine
    asyncio.run(engine.aclose())


def ask(rid: str, *seeds: int, text: str = "What is this?") -> Request:
    parts = [ContentPart("image_url", image_url=data_url(picture(seed))) for seed in seeds]
    return Request(rid, [Message("user", [*parts, ContentPart("text", text=text)])],
                   GenerationParams(max_new_tokens=MAX_NEW))  # fmt: skip


def reference(engine, request: Request) -> str:
    """llama.cpp's own path: libmtmd tokenizes and evaluates the prompt into a fresh
    one-sequence context (mtmd_helper_eval_chunks), then greedy decoding."""
    import llama_cpp as lc
    import numpy as np
    from llama_cpp import mtmd_cpp as m

    from lmpress.vocabulary.images import load_images

    images = load_images(request)
    text = engine.render(request).encode()
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 512, 512, 1, 1
    ctx = lc.llama_init_from_model(engine.llama._model.model, params)
    chunks = m.mtmd_input_chunks_init()
    bitmaps = [m.mtmd_bitmap_init(i.width, i.height, (ctypes.c_uint8 * len(i.tobytes())).from_buffer_copy(i.tobytes())) for i in images]  # fmt: skip
    try:
        given = m.mtmd_input_text(text, len(text), False, True)
        array = (m.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
        assert m.mtmd_tokenize(engine.projector.ctx, chunks, ctypes.byref(given), array, len(bitmaps)) == 0  # fmt: skip
        n_past = lc.llama_pos(0)
        assert m.mtmd_helper_eval_chunks(engine.projector.ctx, ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past)) == 0  # fmt: skip
        batch, pos, out = lc.llama_batch_init(1, 0, 1), n_past.value, []
        for _ in range(MAX_NEW):
            logits = np.ctypeslib.as_array(
                lc.llama_get_logits_ith(ctx, -1), shape=(engine.n_vocab,)
            )
            token = int(logits.argmax())
            if engine.vocab.is_end(token):
                break
            out.append(token)
            batch.n_tokens, batch.token[0], batch.pos[0] = 1, token, pos
            batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 1, 0, 1
            assert lc.llama_decode(ctx, batch) == 0
            pos += 1
        lc.llama_batch_free(batch)
    finally:
        m.mtmd_input_chunks_free(chunks)
        for bitmap in bitmaps:
            m.mtmd_bitmap_free(bitmap)
        lc.llama_free(ctx)
    return b"".join(engine.vocab.piece(t, special=False) for t in out).decode("utf-8", "replace")


def test_a_mixed_batch_matches_llama_cpps_own_multimodal_path(vlm):
    seeds = [(), (1,), (2, 3), (4,), (), (5, 6)]
    requests = [ask(f"r{i}", *s, text=f"What is {i}?") for i, s in enumerate(seeds)]
    results = vlm.generate(requests)
    assert all(r.ok for r in results), [r.error for r in results]
    for request, result in zip(requests, results, strict=True):
        assert result.text == reference(vlm, request), request.id


def test_prompt_tokens_count_each_images_tokens_and_images_change_the_reply(vlm):
    text, one, other, two = vlm.generate([ask("t"), ask("1", 1), ask("o", 9), ask("2", 1, 2)])
    newline = one.usage.prompt_tokens - text.usage.prompt_tokens - TOKENS_PER_IMAGE
    assert newline >= 0  # the marker's line break, as the template renders it
    assert two.usage.prompt_tokens == text.usage.prompt_tokens + 2 * (TOKENS_PER_IMAGE + newline)
    assert one.text != other.text
    # The same image again: the same reply, whether or not its prefix is reused.
    assert vlm.generate([ask("again", 1)])[0].text == one.text


def test_a_corrupt_image_fails_only_its_row(vlm):
    corrupt = Request("bad", [Message("user", [
        ContentPart("image_url", image_url=data_url(CORRUPT_PNG)), ContentPart("text", text="x"),
    ])])  # fmt: skip
    results = vlm.generate([ask("ok", 1), corrupt, ask("text")])
    assert [r.ok for r in results] == [True, False, True]
    assert "cannot be decoded as PNG" in results[1].error.message


def test_a_missing_or_wrong_projector_fails_at_load(tmp_path):
    from lmpress.vocabulary.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"^model.model_kwargs.mmproj: '.*' does not exist"):
        create_engine(load_config(overrides={
            "engine": "LLAMACPP", "model.model_name": "tiny-gguf:llama",
            "model.model_kwargs": {"mmproj": str(tmp_path / "missing.gguf")},
        }))  # fmt: skip
    with pytest.raises(ModelLoadError, match="cannot load .* as a projector for this model"):
        create_engine(load_config(overrides={
            "engine": "LLAMACPP", "model.model_name": "tiny-gguf:llama",
            "model.model_kwargs": {"mmproj": str(tiny_gguf("gpt2"))},  # a model, not a projector
        }))  # fmt: skip
