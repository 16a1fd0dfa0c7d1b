"""The response cache's keys: every setting that can change a reply changes the key, and none
of those that only schedule work does."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from lmpress.cache.identity import FileDigests
from lmpress.cache.keys import RunKey
from lmpress.configs.schema import RunConfig
from lmpress.vocabulary.embeddings import EmbedRequest
from lmpress.vocabulary.types import ContentPart, GenerationParams, Message, Request

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


def remote() -> RunConfig:
    config = RunConfig(engine="REMOTE")
    config.model.model_name = "test-model"
    config.remote_params.api_url = "http://127.0.0.1:9/v1"
    return config


def changed(changes: dict) -> RunConfig:
    """remote() with `changes`: `section__field` for a section's field, else a top-level one."""
    config = remote()
    for dotted, value in changes.items():
        section, _, name = dotted.rpartition("__")
        setattr(getattr(config, section) if section else config, name, value)
    return config


def ask(text: str = "Why is the sky blue?", **params) -> Request:
    return Request("row-1", [Message("user", text)], GenerationParams(**params))


def key(config: RunConfig, request: Request, digests: FileDigests) -> bytes:
    return RunKey(config, digests).of(request)


@pytest.fixture
def digests(tmp_path: Path) -> FileDigests:
    return FileDigests(tmp_path / "digests")


@pytest.mark.parametrize(
    "changes",
    [
        {"remote_params__num_workers": 3},
        {"remote_params__connection_timeout": 5.0},
        {"remote_params__max_retries": 0},
        {"remote_params__requests_per_minute": 60},
        {"output_path": "elsewhere.jsonl"},
        {"input_path": "other.jsonl"},
        {"generation__batch_size": 64},
        {"generation__use_cache": False},
        {"ray__replicas": 4},
        {"serve__port": 9999},
    ],
    ids=lambda c: next(iter(c)),
)
def test_what_only_schedules_work_keeps_the_key(changes, digests):
    assert key(changed(changes), ask(), digests) == key(remote(), ask(), digests)


@pytest.mark.parametrize(
    "changes",
    [
        {"model__model_name": "other-model"},
        {"remote_params__api_url": "http://127.0.0.1:10/v1"},
        {"engine": "OPENAI"},
        {"task": "embed"},
        {"model__chat_template_kwargs": {"enable_thinking": False}},
    ],
    ids=lambda c: next(iter(c)),
)
def test_what_decides_the_reply_changes_the_key(changes, digests):
    assert key(changed(changes), ask(), digests) != key(remote(), ask(), digests)


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.7},
        {"seed": 1},
        {"max_new_tokens": 17},
        {"top_p": 0.5},
        {"stop_strings": ["."]},
        {"n": 2},
        {"logprobs": True},
        {"guided_decoding": {"json": {"type": "object"}}},
        {"reasoning_effort": "low"},
        {"ignore_eos": True},
        {"bad_words": ["Paris"]},
        {"num_beams": 2},
        {"length_penalty": 0.5},
        {"early_stopping": "never"},
    ],
    ids=lambda p: next(iter(p)),
)
def test_each_generation_setting_is_in_the_key(params, digests):
    run = RunKey(remote(), digests)
    assert run.of(ask(**params)) != run.of(ask())
    assert run.of(ask(**params)) == run.of(ask(**params))  # and the same one each time


def test_a_setting_added_later_keeps_the_keys_of_rows_that_leave_it_unset(digests):
    """A row at the defaults keys as it did before ignore_eos, bad_words and the beam search's
    settings existed: the fields are not in its key at all, so what an earlier version cached
    still answers it."""
    run = RunKey(remote(), digests)
    hashed = run._request(ask())  # what the key hashes after the run's part
    for added in (b"ignore_eos", b"bad_words", b"length_penalty", b"early_stopping"):
        assert added not in hashed
    assert b"min_tokens" in hashed  # a field the key has always held, default or not
    assert b"ignore_eos" in run._request(ask(ignore_eos=True))


def test_the_conversation_tools_and_prompt_are_in_the_key(digests):
    run = RunKey(remote(), digests)
    base = run.of(ask())
    assert run.of(ask("Why is the sea blue?")) != base
    assert run.of(Request("row-9", [Message("user", "Why is the sky blue?")])) == base  # the id
    with_system = Request("row-1", [Message("system", "Be brief."), Message("user", "Why?")])
    assert run.of(with_system) != run.of(ask("Why?"))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert run.of(dataclasses.replace(ask(), tools=[tool])) != base
    assert run.of(dataclasses.replace(ask(), prompt="Why is the sky blue?")) != base


def test_an_image_is_keyed_by_its_bytes_not_its_name(tmp_path, digests):
    run = RunKey(remote(), digests)
    first, renamed = tmp_path / "a.png", tmp_path / "b.png"
    first.write_bytes(PNG)
    renamed.write_bytes(PNG)

    def with_image(path: Path) -> Request:
        parts = [ContentPart("image_url", image_url=str(path)), ContentPart("text", "What?")]
        return Request("r", [Message("user", parts)])

    assert run.of(with_image(first)) == run.of(with_image(renamed))
    changed = tmp_path / "c.png"
    changed.write_bytes(PNG[:-1] + b"\x83")
    assert run.of(with_image(changed)) != run.of(with_image(first))


def test_local_weights_are_keyed_by_their_content(tmp_path, tiny_llama, digests):
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    config = RunConfig(engine="NATIVE")
    config.model.model_name = str(model)
    before = key(config, ask(), digests)
    moved = tmp_path / "moved"
    shutil.copytree(model, moved)
    config.model.model_name = str(moved)
    assert key(config, ask(), digests) == before  # the same weights elsewhere
    weights = next(moved.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    assert key(config, ask(), digests) != before


def test_pooling_requests_are_keyed_by_their_inputs(digests):
    config = remote()
    config.task = "embed"
    run = RunKey(config, digests)
    assert run.of(EmbedRequest("a", ["hello"])) == run.of(EmbedRequest("b", ["hello"]))
    assert run.of(EmbedRequest("a", ["hello"])) != run.of(EmbedRequest("a", ["hello!"]))
    assert run.of(EmbedRequest("a", ["hello"], dimensions=8)) != run.of(
        EmbedRequest("a", ["hello"])
    )


def test_a_request_keys_on_its_own_adapter_by_content(tmp_path, tiny_llama, digests):
    """Adding an adapter keeps every kept reply; moving one keeps its own; changing one's
    weights changes its rows' keys alone (issue 54)."""
    from lmpress.builtin_models.lora import smollm2_adapters

    made = smollm2_adapters()
    paths = {name: shutil.copytree(path, tmp_path / name) for name, path in made.items()}
    config = RunConfig(engine="NATIVE")
    config.model.model_name = tiny_llama
    config.model.adapters = {name: str(path) for name, path in paths.items()}

    def keys(config: RunConfig) -> dict:
        run = RunKey(config, digests)
        return {name: run.of(dataclasses.replace(ask(), adapter=name)) for name in made} | {
            None: run.of(ask())
        }

    before = keys(config)
    assert len(set(before.values())) == 3  # the base and each adapter: three replies
    bare = RunConfig(engine="NATIVE")
    bare.model.model_name = tiny_llama
    assert RunKey(bare, digests).of(ask()) == before[None]  # the base as in a run without any
    config.model.adapters["lora-c"] = str(shutil.copytree(paths["lora-a"], tmp_path / "moved"))
    assert keys(config) == before  # a third adapter changes none
    config.model.adapters["lora-a"] = config.model.adapters.pop("lora-c")
    assert keys(config) == before  # lora-a's same files elsewhere
    weights = tmp_path / "moved" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    after = keys(config)
    assert after["lora-a"] != before["lora-a"]
    assert {k: v for k, v in after.items() if k != "lora-a"} == {
        k: v for k, v in before.items() if k != "lora-a"
    }
