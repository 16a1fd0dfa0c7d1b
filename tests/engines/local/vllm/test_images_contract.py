"""contract test: needs GPUs to run for real (a vLLM install with torchvision, which vLLM's
LLaVA imports: .venv-vllm, vLLM's CPU build, cannot have it, see the README's VLLM section).

Images on the VLLM engine, against the vLLM stand-in (see vllm_standin/README.md): a row's
images go as vLLM's `multi_modal_data` beside the template's text with one placeholder per
image, and vLLM's refusals fail that row alone. This proves the adapter, not vLLM:
benchmarks/vllm_check.py sends images to the real one on a GPU machine."""

from __future__ import annotations

import asyncio
import json

import pytest

from lmpress.builtin_models.tiny import VLM_TEMPLATE
from lmpress.vocabulary.types import ContentPart, GenerationParams, Message, Request
from tests.engines.local.vllm.contract_support import model_dir, standin, write_model_dir
from tests.engines.local.vllm.test_engine_contract import close, make_engine, vllm_side
from tests.image_files import CORRUPT_PNG, data_url, picture, picture_file

__all__ = ["model_dir", "standin"]  # fixtures

PIL = pytest.importorskip("PIL.Image")
IMAGE_TOKENS = 3


@pytest.fixture
def vlm_dir(tmp_path) -> str:
    """A vision-language model directory as the stand-in reads it."""
    path = write_model_dir(tmp_path / "standin-vlm", chat_template=VLM_TEMPLATE, context=200)
    config = {"max_position_embeddings": 200, "vision_config": {}, "image_token": "<image>",
              "image_seq_length": IMAGE_TOKENS}  # fmt: skip
    (tmp_path / "standin-vlm" / "config.json").write_text(json.dumps(config))
    return path


def ask(rid: str, *urls: str, text: str = "What is this?") -> Request:
    parts = [ContentPart("image_url", image_url=url) for url in urls]
    return Request(rid, [Message("user", [*parts, ContentPart("text", text=text)])],
                   GenerationParams(max_new_tokens=40))  # fmt: skip


def run(engine, *requests):
    async def both():
        return await asyncio.gather(*(engine.complete(r) for r in requests))

    return asyncio.run(both())


def test_images_go_as_multi_modal_data_with_a_placeholder_each(standin, vlm_dir, tmp_path):
    small = picture_file(tmp_path, 1)
    engine = make_engine(vlm_dir)
    try:
        text, one, two = run(
            engine,
            ask("t"),
            ask("one", small.as_uri()),
            ask("two", data_url(picture(2, size=(20, 10))), str(small)),
        )
        sent = {r.request_id.rsplit("-", 1)[0]: r for r in vllm_side().requests}
    finally:
        close(engine)
    assert all(r.ok for r in (text, one, two)), [r.error for r in (text, one, two)]
    assert "multi_modal_data" not in sent["t"].prompt
    assert sent["one"].prompt["prompt"] == (
        "<|im_start|>user\n<image>\nWhat is this?<|im_end|>\n<|im_start|>assistant\n"
    )
    images = sent["two"].prompt["multi_modal_data"]["image"]
    assert [(i.mode, i.size) for i in images] == [("RGB", (20, 10)), ("RGB", (40, 30))]
    # The stand-in echoes the prompt: each image's tokens stand where the template put it.
    assert two.text.split()[1:8] == ["<image1:20x10>"] * 3 + ["<image2:40x30>"] * 3 + ["What"]
    assert one.usage.prompt_tokens == text.usage.prompt_tokens + IMAGE_TOKENS  # "<image>" grew
    assert sent["two"].tokenization_kwargs == {"add_special_tokens": False}


def test_bad_images_and_vllms_refusals_fail_their_row_alone(standin, vlm_dir, model_dir, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(CORRUPT_PNG)
    good = data_url(picture(1))
    engine = make_engine(vlm_dir, **{"model.model_kwargs": {"limit_mm_per_prompt": {"image": 1}}})
    try:
        corrupt, too_many, fine = run(
            engine, ask("bad", broken.as_uri()), ask("many", good, good), ask("ok", good)
        )
    finally:
        close(engine)
    assert "broken.png): cannot be decoded as PNG" in corrupt.error.message
    assert too_many.error.kind == "invalid_request" and "At most 1 image" in too_many.error.message
    assert fine.ok

    engine = make_engine(model_dir)  # a text model: vLLM refuses its images
    try:
        (refused,) = run(engine, ask("text-model", good))
    finally:
        close(engine)
    assert refused.error.kind == "invalid_request"
    assert "does not support multi-modal inputs" in refused.error.message


def test_vllm_check_images_plumbing_runs_on_the_standin(vlm_dir):
    """Only benchmarks/vllm_check.py --images' plumbing: both sides send the same pictures."""
    from tests.engines.local.vllm.contract_support import standin_env
    from tests.engines.local.vllm.test_cli_contract import run_check

    run = run_check(vlm_dir, "--rows", "6", "--max-new-tokens", "40", "--images", env=standin_env())
    assert run.returncode == 0, run.stderr
    assert "identical replies (greedy): 6 of 6" in run.stdout
