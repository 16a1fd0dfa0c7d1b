"""The engine contract: what the rest of lmpress asks of an engine, the engine class answers.

So a new engine is its own code plus one registry row, or, from another package, one
`lmpress.engines` entry point: the engines here are defined in this file and registered through
a real entry point, and the dry run counts with their counter, the hub check follows their
attribute and `lmpress engines` lists them, with no lmpress module knowing their names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmpress.configs import load_config
from lmpress.engines import registry
from lmpress.engines.base import Engine
from lmpress.engines.prompt_count import PromptCounter
from lmpress.vocabulary.types import Delta, Request, Result, Sample, Usage
from tests.conftest import REPO, run_lmpress
from tests.dryrun.test_dry_run_and_budget_cli import number, table

CONTEXT = 8  # WORDS' context, in words: small, so that one row of the test goes over it


class WordCount:
    """One token a whitespace-separated word: easy to count by hand in a test."""

    def count(self, request: Request) -> int:
        texts = [request.prompt] if request.prompt is not None else []
        return sum(len(text.split()) for text in texts + [m.text() for m in request.messages])


class WordsEngine(Engine):
    """A local engine as a third party would write one: its own prompt counter, no hub ids."""

    name = "WORDS"
    supported_params = frozenset({"max_new_tokens"})

    @classmethod
    def prompt_counter(cls, config) -> PromptCounter:
        return PromptCounter(WordCount(), True, CONTEXT, "whitespace words (as WORDS)")

    async def stream(self, request: Request):
        words = WordCount().count(request)
        sample = Sample(f"{words} words", "stop", completion_tokens=2)
        yield Delta(request.id, sample.text, 0)
        yield Result(request.id, [sample], Usage(words, 2), self.model_name, self.name)


class HubWordsEngine(WordsEngine):
    """WORDS, but its model may be a hub id: the hub check must follow this attribute."""

    name = "HUBWORDS"
    takes_hub_ids = True


def plugin_dir(root: Path) -> Path:
    """A dist-info that registers this file's engines the way an installed package does."""
    dist = root / "lmpress_words-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lmpress-words\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[lmpress.engines]\nWORDS = {__name__}:WordsEngine\nHUBWORDS = {__name__}:HubWordsEngine\n"
    )
    return root


@pytest.fixture
def words_plugin(tmp_path, monkeypatch):
    """This file's engines registered in this process, and the environment that registers
    them in a child lmpress."""
    root = plugin_dir(tmp_path / "plugin")
    monkeypatch.syspath_prepend(str(root))
    registry._specs.cache_clear()  # the entry points are read once per process
    yield {"PYTHONPATH": os.pathsep.join([str(REPO), str(root)]), "HF_HUB_OFFLINE": "1"}
    registry._specs.cache_clear()


def test_a_plugin_engine_is_listed_with_what_it_supports(words_plugin):
    listed = run_lmpress("engines", env=words_plugin)
    assert listed.returncode == 0, listed.stderr
    assert f"plugin from {__name__}:WordsEngine" in listed.stdout
    words = listed.stdout.split("WORDS ", 1)[1].split("\n\n", 1)[0]
    assert "usable" in words and "parameters: max_new_tokens" in words


def test_the_dry_run_counts_a_plugin_engines_prompts_with_its_own_counter(words_plugin, tmp_path):
    rows = tmp_path / "in.jsonl"
    prompts = ["one two three", "four five", "a row of more than eight words goes over it"]
    rows.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    run = run_lmpress(
        "batch", "-i", str(rows), "--engine", "words", "--model.model_name", "words",
        "--generation.max_new_tokens", "2", "--dry-run", env=words_plugin, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    shown = table(run.stderr)
    assert shown["tokenizer"] == "whitespace words (as WORDS)"
    assert shown["prompt tokens"] == "5"  # exact (no "~"): the row over the context is not in it
    assert (
        number(shown["over the context"]) == 1
        and f"context {CONTEXT} tokens" in shown["over the context"]
    )
    assert shown["longest prompt"] == "3"


def test_the_dry_run_in_process_asks_the_engine_class(words_plugin):
    from lmpress.dryrun.prompt_tokens import prompt_counter

    counter = prompt_counter(load_config(overrides={"engine": "words"}))
    assert (counter.exact, counter.context) == (True, CONTEXT)
    assert counter.tokenizer_label == "whitespace words (as WORDS)"


def test_the_hub_check_follows_the_engines_attribute(words_plugin):
    model = ["--model.model_name", "nobody/no-such-model-here", "hello there"]
    runs = run_lmpress("infer", "--engine", "words", *model, env=words_plugin)
    assert runs.returncode == 0, runs.stderr
    assert runs.stdout.strip() == "2 words"
    refused = run_lmpress("infer", "--engine", "hubwords", *model, env=words_plugin)
    assert refused.returncode != 0
    assert (
        "model.model_name: 'nobody/no-such-model-here' is not on this machine and the hub is "
        "switched off (HF_HUB_OFFLINE)" in refused.stderr
    )
    assert "Traceback" not in refused.stderr


CONTRACT_CHECK = """
import sys
from lmpress.engines.base import Engine
from lmpress.engines.registry import engine_class, engine_names

BACKENDS = ("torch", "transformers", "vllm", "llama_cpp")
for name in engine_names():
    cls = engine_class(name)
    assert issubclass(cls, Engine), name
    assert cls.name == name, (cls.name, name)
    assert isinstance(cls.supported_params, frozenset) and cls.supported_params, name
    assert isinstance(cls.takes_hub_ids, bool), name
    for method in ("prompt_counter", "dtype_in_use", "key_variable", "replica_config"):
        assert callable(getattr(cls, method)), (name, method)
print(sorted(m for m in BACKENDS if m in sys.modules))
"""


def test_every_registered_engine_answers_the_contract_without_importing_a_backend():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", CONTRACT_CHECK], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


NAMES = ("NATIVE", "LLAMACPP", "VLLM", "OPENAI")


def test_local_engines_say_their_own_answers_and_remote_ones_keep_the_default():
    hub = {name: registry.engine_class(name).takes_hub_ids for name in ("NATIVE", "VLLM")}
    assert hub == {"NATIVE": True, "VLLM": True}
    assert not registry.engine_class("LLAMACPP").takes_hub_ids
    assert not registry.engine_class("OPENAI").takes_hub_ids
    default = Engine.prompt_counter.__func__
    counters = {name: registry.engine_class(name).prompt_counter.__func__ for name in NAMES}
    assert [name for name, counter in counters.items() if counter is default] == ["OPENAI"]


def test_a_remote_engine_shares_its_limits_out_among_ray_replicas_and_a_local_one_does_not():
    overrides = {
        "remote_params.num_workers": 9,
        "remote_params.requests_per_minute": 100,
        "remote_params.api_key_env_varname": "MY_KEY",
    }
    config = load_config(overrides={"engine": "OPENAI", **overrides})
    split = registry.engine_class("OPENAI").replica_config(config, 2).remote_params
    assert (split.num_workers, split.requests_per_minute) == (5, 50)
    assert split.input_tokens_per_minute is None
    assert config.remote_params.num_workers == 9  # the run's own config is left as it was
    assert registry.engine_class("OPENAI").key_variable(config) == "MY_KEY"
    assert registry.engine_class("OPENAI").key_variable(load_config("openai")) == "OPENAI_API_KEY"
    native = load_config(overrides={"engine": "NATIVE", **overrides})
    assert registry.engine_class("NATIVE").replica_config(native, 2) is native
