"""`model.generation_defaults` on NATIVE: a checkpoint whose generation_config.json sets
repetition_penalty and no_repeat_ngram_size changes nothing unless the recipe says `use`, and
then only the fields the user did not set. Checked against transformers' own `generate`."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from lmpress.configs import load_config
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import Request
from tests.conftest import run_lmpress

PROMPTS = ["the cat sat on the mat", "one two three four", "why is the sky blue"]
NEW_TOKENS = 24
SHIPPED = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}


@pytest.fixture(scope="module")
def opinionated(tiny_llama, tmp_path_factory) -> str:
    """tiny:llama with sampling defaults in its generation_config.json."""
    path = tmp_path_factory.mktemp("opinionated") / "model"
    shutil.copytree(tiny_llama, path)
    config_file = path / "generation_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, **SHIPPED}))
    return str(path)


def reference(model_dir: str, **generate_kwargs) -> list[str]:
    """Greedy replies from transformers itself, which reads the checkpoint's config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    replies = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, **generate_kwargs)
        replies.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return replies


def lmpress_replies(model_dir: str, **overrides) -> list[str]:
    config = load_config(
        overrides={
            "model.model_name": model_dir,
            "model.device_map": "cpu",
            "generation.max_new_tokens": NEW_TOKENS,
            **overrides,
        }
    )
    engine = create_engine(config)
    try:
        requests = [Request(str(i), [], config.generation, prompt=p) for i, p in enumerate(PROMPTS)]
        results = engine.generate(requests)
    finally:
        asyncio.run(engine.aclose())
    assert all(r.ok for r in results), [r.error for r in results]
    return [r.text for r in results]


def test_the_checkpoint_defaults_change_transformers_greedy_output(opinionated, tiny_llama):
    # Without this the tests below could not tell the two policies apart.
    assert reference(opinionated) != reference(tiny_llama)


def test_by_default_the_checkpoint_defaults_are_ignored(opinionated):
    neutral = reference(opinionated, repetition_penalty=1.0, no_repeat_ngram_size=0)
    assert lmpress_replies(opinionated) == neutral


def test_use_applies_the_checkpoint_defaults_as_transformers_does(opinionated):
    replies = lmpress_replies(opinionated, **{"model.generation_defaults": "use"})
    assert replies == reference(opinionated)


def test_use_never_overrides_a_value_the_user_set(opinionated):
    replies = lmpress_replies(
        opinionated,
        **{"model.generation_defaults": "use", "generation.repetition_penalty": 1.0},
    )
    # The user's 1.0 (lmpress's default value) wins; the field lmpress has no name for
    # (no_repeat_ngram_size) still comes from the checkpoint.
    assert replies == reference(opinionated, repetition_penalty=1.0)


def test_config_show_prints_the_policy_and_refuses_others():
    shown = run_lmpress("config", "show", "-c", "tiny-native")
    assert shown.returncode == 0, shown.stderr
    assert "generation_defaults: ignore" in shown.stdout
    bad = run_lmpress("config", "show", "-c", "tiny-native", "--model.generation_defaults=auto")
    assert bad.returncode == 2
    assert "model.generation_defaults: 'auto' must be ignore or use" in bad.stderr


def test_an_engine_that_cannot_read_checkpoint_defaults_refuses_use():
    run = run_lmpress(
        "infer", "-c", "tiny-llamacpp", "--model.generation_defaults", "use", "hello"
    )  # fmt: skip
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert "model.generation_defaults" in line and "LLAMACPP" in line


def test_use_applies_a_field_lmpress_has_no_name_for(tiny_llama, tmp_path):
    """A checkpoint whose suppress_tokens bans the first token of each greedy reply: with
    "use", NATIVE bans them as transformers' generate does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    firsts = set()
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, do_sample=False, max_new_tokens=1)
        firsts.add(int(out[0, -1]))
    path = tmp_path / "model"
    shutil.copytree(tiny_llama, path)
    config_file = path / "generation_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "suppress_tokens": sorted(firsts)}))
    replies = lmpress_replies(str(path), **{"model.generation_defaults": "use"})
    assert replies == reference(str(path)) != reference(tiny_llama)
