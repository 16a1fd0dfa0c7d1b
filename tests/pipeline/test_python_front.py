"""The Python front (`lmpress.Pipeline`): the same steps as a pipeline file, with functions
where the file names `module:function` or an expression, make the same dataset through the
same journal; editing one function re-runs from its step; bad steps are one line. On real
weights, beside the pipeline file's run it compares with: tests/pipeline/test_smollm2.py."""

from __future__ import annotations

import importlib
import sys

import pytest

from lmpress import Pipeline, dedupe, filter, generate, map
from lmpress.vocabulary.errors import ConfigError
from tests.pipeline.helpers import DATA, read_jsonl, remote_model, run, write
from tests.servers.llm_server import LLMServer, reply_text

TOPICS = [{"topic": t} for t in ("cats", "dogs", "owls", "cats")]

FUNCTIONS = """
def first_words(row):
    row["words"] = row["answer"].split()[2:4]
    return row
"""


def yaml_steps(server) -> str:
    return f"""models:
  m: {remote_model(server)}
steps:
  - {{name: answer, kind: generate, model: m, prompt: "Tell me about {{topic}}"}}
  - {{name: words, kind: map, function: "fns:first_words", makes: [words], explode: words}}
  - {{name: keep, kind: filter, expr: "words != 'me'"}}
  - {{name: unique, kind: dedupe, method: exact, columns: [topic, words]}}
"""


def python_steps(server, first_words) -> Pipeline:
    model = {"engine": "OPENAI", "model": "test-model", "api_url": server.openai_url}
    return Pipeline(
        models={"m": model},
        steps=[
            generate("answer", model="m", prompt=lambda row: f"Tell me about {row['topic']}"),
            map("words", first_words, makes=["words"], explode="words"),
            filter("keep", lambda row: row["words"] != "me"),
            dedupe("unique", method="exact", columns=["topic", "words"]),
        ],
    )


@pytest.fixture
def fns(tmp_path, monkeypatch):
    """The user's module of functions, importable, rewritten by `edit` as a user would."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    # No cached bytecode: an edit of the same size within the same second as the first write
    # would otherwise be reloaded from the old .pyc (Python checks the source's size and mtime
    # to the second), and the old function would run under the new source's fingerprint.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    sys.modules.pop("fns", None)
    module = importlib.import_module("fns")
    yield module
    sys.modules.pop("fns", None)


def test_the_same_dataset_as_the_pipeline_file(tmp_path, fns):
    with LLMServer() as server:
        write(tmp_path, yaml_steps(server), TOPICS)
        from_file = run(tmp_path, "yaml")
        facts = python_steps(server, fns.first_words).run(input=TOPICS, output=tmp_path / "py")
    assert from_file.returncode == 0, from_file.stderr
    rows = read_jsonl(tmp_path / "py" / DATA)
    assert rows == read_jsonl(tmp_path / "yaml" / DATA)
    assert rows[0] == {"topic": "cats", "answer": reply_text("Tell me about cats"), "words": "Tell"}
    assert len(rows) == facts.rows == 3  # the second "cats" is a duplicate
    assert len(read_jsonl(tmp_path / "py" / "rejects.jsonl")) == 5  # four "me", one duplicate
    card = (tmp_path / "py" / "README.md").read_text()
    assert "function: fns:first_words" in card  # the card names the functions


def test_editing_a_function_reruns_from_its_step_only(tmp_path, fns, capsys):
    out = tmp_path / "out"
    with LLMServer() as server:
        python_steps(server, fns.first_words).run(input=TOPICS, output=out)
        first = read_jsonl(out / DATA)
        capsys.readouterr()
        python_steps(server, fns.first_words).run(input=TOPICS, output=out)
        assert "re-running" not in capsys.readouterr().err  # nothing changed, nothing re-runs
        (tmp_path / "fns.py").write_text(FUNCTIONS.replace("[2:4]", "[3:5]"))
        edited = importlib.reload(fns)
        python_steps(server, edited.first_words).run(input=TOPICS, output=out)
    assert "lmpress: re-running steps words, keep, unique\n" in capsys.readouterr().err
    rows = read_jsonl(out / DATA)
    assert rows != first
    assert rows[0]["words"] == "about"  # "me about", "me" filtered out


def test_prompt_and_parse_functions_fan_out_and_fail_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")

    def parse(reply: str, row: dict) -> list[dict]:
        if row["topic"] == "owls":
            raise KeyError("no owls")
        return [{"word": word} for word in reply.split()[2:4]]

    with LLMServer() as server:
        pipeline = Pipeline(
            models={"m": {"engine": "OPENAI", "model": "test-model", "api_url": server.openai_url}},
            steps=[
                generate(
                    "ask",
                    model="m",
                    prompt=lambda row: f"Name {row['topic']}",
                    parse=parse,
                    makes=["word"],
                ),  # fmt: skip
                filter("kept", "word != 'Name'"),  # an expression, checked against `makes`
            ],
        )
        pipeline.run(input=TOPICS[:3], output=tmp_path / "out")
    assert list(pipeline.rows(tmp_path / "out")) == [
        {"topic": "cats", "word": "cats"},
        {"topic": "dogs", "word": "dogs"},
    ]
    failed = read_jsonl(tmp_path / "out" / "rejects.jsonl")[0]
    assert failed == {"key": "000000002", "step": "ask", "failed": "parse raised KeyError: 'no owls'",
                      "row": {"topic": "owls"}}  # fmt: skip


def test_bad_steps_are_refused_in_one_line_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=r"step 'ask': temprature: unknown key"):
        generate("ask", model="m", prompt="About {topic}", temprature=0)
    no_model = Pipeline(steps=[generate("ask", model="m", prompt="About {topic}")])
    with pytest.raises(ConfigError, match=r"step 'ask': model 'm' is not defined"):
        no_model.run(input=TOPICS, output=tmp_path / "a")
    missing = Pipeline(
        models={"m": {"engine": "OPENAI", "model": "x", "api_url": "http://127.0.0.1:9/v1"}},
        steps=[
            map("up", lambda row: row, makes=["upper"]),
            filter("long", "uppers != ''"),
        ],
    )
    with pytest.raises(ConfigError, match=r"step 'long': column 'uppers' is made by no earlier"):
        missing.run(input=TOPICS, output=tmp_path / "b")
    assert not (tmp_path / "b" / DATA).exists()
