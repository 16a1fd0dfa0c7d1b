"""NATIVE on a vision-language model: the tiny LLaVA-style model (builtin_models/tiny.py "llava": a CLIP
vision tower, a projector and a llama text model; 16 tokens an image), against transformers'
own `generate` on the same processor inputs."""

from __future__ import annotations

import asyncio

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import ContentPart, Delta, GenerationParams, Message, Request, Result
from tests.image_files import CORRUPT_PNG, data_url, picture

pytest.importorskip("PIL")

TOKENS_PER_IMAGE = 16  # (32 / 8) ** 2 patches
QUESTION = "What is this?"


@pytest.fixture(scope="module")
def vlm():
    engine = create_engine(
        load_config(
            overrides={
                "model.model_name": "tiny:llava",
                "generation.max_new_tokens": 8,
                "generation.batch_size": 4,
            }
        )
    )
    yield engine
    asyncio.run(engine.aclose())


def ask(rid: str, *seeds: int, text: str = QUESTION, **params) -> Request:
    parts = [ContentPart("image_url", image_url=data_url(picture(seed))) for seed in seeds]
    params = GenerationParams(**{"max_new_tokens": 8, **params})
    return Request(rid, [Message("user", [*parts, ContentPart("text", text=text)])], params)


def reference(engine, *seeds: int, text: str = QUESTION, max_new_tokens: int = 8) -> str:
    """transformers' greedy generate on the processor's inputs for the same conversation."""
    import io

    import torch
    from PIL import Image

    images = [Image.open(io.BytesIO(picture(seed))).convert("RGB") for seed in seeds]
    content = [{"type": "image"} for _ in seeds] + [{"type": "text", "text": text}]
    processor = engine.processor
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    inputs = processor(
        text=[prompt], images=[images] if images else None, add_special_tokens=False,
        return_tensors="pt",
    )  # fmt: skip
    with torch.inference_mode():
        out = engine.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(
        out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True
    )


def test_a_mixed_batch_matches_transformers_row_by_row(vlm):
    """Rows with 0, 1 and 2 images, batched together, each give transformers' own reply."""
    seeds = [(), (1,), (2, 3), (4,), (), (5, 6)]
    requests = [ask(f"r{i}", *s, text=f"{QUESTION} {i}") for i, s in enumerate(seeds)]
    results = vlm.generate(requests)
    assert all(r.ok for r in results), [r.error for r in results]
    for i, (s, result) in enumerate(zip(seeds, results, strict=True)):
        assert result.text == reference(vlm, *s, text=f"{QUESTION} {i}"), i


def test_prompt_tokens_count_each_images_tokens(vlm):
    text, one, two = vlm.generate([ask("t"), ask("1", 1), ask("2", 1, 2)])
    # Each image is its tokens plus the newline the template writes after <image>.
    assert one.usage.prompt_tokens == text.usage.prompt_tokens + TOKENS_PER_IMAGE + 1
    assert two.usage.prompt_tokens == text.usage.prompt_tokens + 2 * (TOKENS_PER_IMAGE + 1)
    ids = vlm.encode(ask("2", 1, 2))
    assert ids.count(vlm.model.config.image_token_id) == 2 * TOKENS_PER_IMAGE


def test_different_images_give_different_replies_to_the_same_text(vlm):
    replies = [r.text for r in vlm.generate([ask(str(s), s) for s in (11, 12, 13)])]
    assert len(set(replies)) == 3, replies
    # The same image twice, even with a shared prefix stored between, gives the same reply.
    again = vlm.generate([ask("again", 12)])[0]
    assert again.text == replies[1]


def test_a_corrupt_or_unreadable_image_fails_only_its_row(vlm, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(CORRUPT_PNG)
    bad_rows = [
        Request("corrupt", [Message("user", [ContentPart("image_url", image_url=broken.as_uri()),
                                             ContentPart("text", text=QUESTION)])]),
        Request("missing", [Message("user", [ContentPart("image_url", image_url="/no/cat.png"),
                                             ContentPart("text", text=QUESTION)])]),
    ]  # fmt: skip
    results = vlm.generate([ask("ok", 1), *bad_rows, ask("text")])
    assert [r.ok for r in results] == [True, False, False, True]
    assert "broken.png): cannot be decoded as PNG" in results[1].error.message
    assert results[2].error.message == "image 1 (/no/cat.png): no such file"
    assert {r.error.kind for r in results[1:3]} == {"invalid_request"}


def test_streaming_sampling_and_cancellation_work_on_image_rows(vlm):
    async def stream(request: Request) -> tuple[str, Result]:
        pieces, final = [], None
        async for item in vlm.stream(request):
            if isinstance(item, Delta):
                pieces.append(item.text)
            else:
                final = item
        return "".join(pieces), final

    streamed, result = asyncio.run(stream(ask("s", 7)))
    assert result.ok and streamed == result.text == reference(vlm, 7)

    sampled = [ask(f"seeded{i}", 7, temperature=1.0, seed=5, n=2) for i in range(2)]
    first, second = vlm.generate(sampled)
    assert [s.text for s in first.samples] == [s.text for s in second.samples]

    async def cancel_early() -> int:
        deltas = 0
        async for item in vlm.stream(ask("long", 8, max_new_tokens=400, min_tokens=400)):
            deltas += isinstance(item, Delta)
            if deltas == 2:
                break
        return deltas

    assert asyncio.run(cancel_early()) == 2
    assert vlm.generate([ask("after", 7)])[0].text == result.text  # the engine serves on


def test_the_dry_run_counts_what_the_engine_reports(vlm):
    from lmpress.dryrun.prompt_tokens import prompt_counter

    counter = prompt_counter(vlm.config)
    requests = [ask("t"), ask("1", 1), ask("2", 1, 2)]
    results = vlm.generate(requests)
    assert [counter.count(r) for r in requests] == [r.usage.prompt_tokens for r in results]
