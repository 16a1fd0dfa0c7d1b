"""NATIVE's dequantized copy of a packaged GGUF model: it loads what transformers loads from the
GGUF file itself (tokenizer, config, generation config, every weight bit for bit, at float32 and
at bfloat16), and loads that make it at once end with one whole copy."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import torch

from lmpress.builtin_models.packaged import SMOLLM2, resolve_packaged_name
from lmpress.builtin_models.tiny_gguf import tiny_gguf
from lmpress.configs import load_config
from lmpress.configs.schema import ModelParams
from lmpress.engines.common.checkpoints import model_source
from lmpress.engines.common.dequantized import existing_copy
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request
from tests.conftest import REPO

TEXTS = ["Hello world", " café naïve 東京 ☀ <|im_start|>x", "What is 2+2?\n\n  spaces", ""]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def from_gguf(path: Path, dtype: torch.dtype):
    """transformers' own load of the GGUF file: the reference."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    # The config read once and handed to the model's load, which would read the file's metadata
    # again for it (about 4 of SmolLM2's 13 CPU-s); the same model, config and generation config.
    config = AutoConfig.from_pretrained(**source)
    with contextlib.redirect_stderr(io.StringIO()):  # its dequantization progress bar
        tokenizer = AutoTokenizer.from_pretrained(**source)
        model = AutoModelForCausalLM.from_pretrained(**source, config=config, dtype=dtype)
    return tokenizer, config, model


def config_fields(config) -> dict:
    # What a copy's config.json adds: the class save_pretrained records, the dtype it stored
    # the weights in (F16 values) and the path it was read from; no GGUF quantization config.
    dropped = ("_name_or_path", "architectures", "dtype", "quantization_config")
    return {k: v for k, v in config.to_diff_dict().items() if k not in dropped}


def test_the_engine_loads_from_the_copy_exactly_what_the_gguf_file_holds():
    gguf = Path(resolve_packaged_name(SMOLLM2))
    engine = create_engine(load_config(overrides={
        "engine": "NATIVE", "model.model_name": SMOLLM2, "model.torch_dtype_str": "float32",
    }))  # fmt: skip
    try:
        copy = existing_copy(gguf)
        assert copy is not None and model_source(ModelParams(model_name=SMOLLM2)) == (
            str(copy),
            None,
        )
        assert not (copy / "config.json").read_text().count("quantization_config")
        tokenizer, config, model = from_gguf(gguf, torch.float32)
        ours = engine.model.state_dict()
        assert ours.keys() == model.state_dict().keys()
        assert all(torch.equal(ours[k], t) for k, t in model.state_dict().items())
        assert {t.dtype for t in ours.values()} == {torch.float32}
        assert config_fields(engine.model.config) == config_fields(config)
        # The engine keeps only the token ids of the checkpoint's generation config (its
        # generation_defaults is "ignore"); the copy holds the whole of it.
        from transformers import GenerationConfig

        shipped = GenerationConfig.from_pretrained(copy)
        assert shipped.to_diff_dict() == model.generation_config.to_diff_dict()
        theirs = tokenizer
        assert engine.hf_tokenizer.get_vocab() == theirs.get_vocab()
        assert engine.hf_tokenizer.special_tokens_map == theirs.special_tokens_map
        assert engine.hf_tokenizer.chat_template == theirs.chat_template
        for text in TEXTS:
            assert engine.hf_tokenizer(text)["input_ids"] == theirs(text)["input_ids"]
        ids = theirs.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"]
        assert torch.equal(engine.hf_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt")["input_ids"], ids)  # fmt: skip
        with torch.inference_mode():
            want = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False)
        reply = theirs.decode(want[0, ids.shape[1] :], skip_special_tokens=True)
        params = GenerationParams(max_new_tokens=12)
        [result] = engine.generate([Request("q", [Message("user", CHAT[0]["content"])], params)])
        assert result.text == reply and "Paris" in reply
    finally:
        asyncio.run(engine.aclose())
    # transformers casts each dequantized float32 tensor to the dtype asked for; so does a load
    # of the copy.
    half = create_engine(load_config(overrides={
        "engine": "NATIVE", "model.model_name": SMOLLM2, "model.torch_dtype_str": "bfloat16",
    }))  # fmt: skip
    try:
        bf16 = half.model.state_dict()
        assert all(
            torch.equal(bf16[k], t.to(torch.bfloat16)) for k, t in model.state_dict().items()
        )
    finally:
        asyncio.run(half.aclose())


def test_copies_made_at_once_end_as_one_whole_copy(tmp_path):
    gguf = tiny_gguf("llama")
    make = f"from lmpress.engines.common.dequantized import dequantized_copy as d; from pathlib import Path as P; print(d(P({str(gguf)!r}), P({str(tmp_path)!r})))"  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", make], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    made = {Path(proc.communicate(timeout=300)[0].strip()) for proc in procs}
    assert [proc.returncode for proc in procs] == [0, 0]
    [copy] = (tmp_path / "packaged").iterdir()  # one copy; no scratch directory left behind
    assert made == {copy} and existing_copy(gguf, tmp_path) == copy
    from transformers import AutoModelForCausalLM

    _, _, model = from_gguf(gguf, torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(copy, dtype=torch.float32).state_dict()
    assert all(torch.equal(loaded[k], t) for k, t in model.state_dict().items())
