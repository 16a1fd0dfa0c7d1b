"""`from lmpress import LLM`: the Python front, on the tiny NATIVE model (real weights would prove
nothing more about the front)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from lmpress import LLM
from lmpress.vocabulary.errors import ConfigError
from tests.conftest import REPO


@pytest.fixture(scope="module")
def llm(tiny_llama):
    with LLM(tiny_llama, engine="NATIVE", max_new_tokens=12) as model:
        yield model


def test_generate_chat_and_stream_give_the_same_greedy_reply(llm):
    [first, second] = llm.generate(["tell me a story", "name a colour"])
    assert first.ok and second.ok and first.text and first.text != second.text
    assert first.usage.completion_tokens == 12 and first.finish_reason == "length"
    said = llm.chat([{"role": "user", "content": "tell me a story"}])
    assert said.text == first.text
    assert "".join(llm.stream("tell me a story")) == first.text
    both = llm.chat([[{"role": "user", "content": "name a colour"}]] * 2)
    assert [r.text for r in both] == [second.text] * 2


def test_settings_per_call_and_their_checks(llm):
    [short] = llm.generate("tell me a story", max_new_tokens=3)
    assert short.usage.completion_tokens == 3
    [three] = llm.generate("tell me a story", n=3, temperature=1.0, seed=5)
    assert len(three.samples) == 3
    with pytest.raises(ConfigError, match="temperature"):
        llm.generate("x", temperature=-1)
    with pytest.raises(ConfigError, match="unknown setting 'temprature'"):
        LLM("tiny:llama", engine="NATIVE", temprature=0.2)


def test_a_stream_left_early_leaves_the_engine_serving(llm):
    pieces = llm.stream("tell me a story", max_new_tokens=200, min_tokens=200)
    next(pieces)
    pieces.close()
    [after] = llm.generate("name a colour", max_new_tokens=2)
    assert after.ok and after.usage.completion_tokens == 2


def test_batch_runs_the_file_as_the_command_does(llm, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"q {i}"}) + "\n" for i in range(5))
    )
    summary = llm.batch(str(source), str(tmp_path / "out.jsonl"))
    assert (summary.rows_ok, summary.rows_failed) == (5, 0)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"r{i}" for i in range(5)]
    again = llm.batch(str(source), str(tmp_path / "out.jsonl"))
    assert (again.rows_ok, again.rows_skipped) == (0, 5)


def test_a_script_that_never_closes_its_model_exits_cleanly(tiny_llama, tmp_path):
    script = textwrap.dedent(f"""
        from lmpress import LLM
        llm = LLM({tiny_llama!r}, engine="NATIVE", max_new_tokens=4)
        print(len(llm.generate(["a", "b", "c"])))
    """)
    for _ in range(3):  # the abort it guards against came on some runs, not others
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert (run.returncode, run.stdout, run.stderr) == (0, "3\n", "")


def test_loglikelihood_and_perplexity_score_as_transformers_does(llm, tiny_llama):
    from tests.batch.test_loglikelihood_cli import Reference

    reference = Reference(tiny_llama)
    blue, green = llm.loglikelihood("The sky is", [" blue", " green"])
    for got, choice in ((blue, " blue"), (green, " green")):
        logprob, greedy, tokens = reference.choice("The sky is", choice)
        assert got.logprob == pytest.approx(logprob, abs=1e-4)
        assert (got.is_greedy, got.tokens) == (greedy, tokens)
    # Pairs, contexts mixed: each pair's score, in the order given (read in passes of other
    # shapes than above, so equal within float32's rounding, not to the last bit).
    pairs = llm.loglikelihood([("Hello", " world"), ("The sky is", " green")])
    assert pairs[1].logprob == pytest.approx(green.logprob, abs=1e-5)
    assert pairs[0].logprob == pytest.approx(reference.choice("Hello", " world")[0], abs=1e-4)
    [whole] = llm.score_text("The cat sat on the mat.")
    logprob, tokens = reference.text("The cat sat on the mat.")
    assert whole.logprob == pytest.approx(logprob, abs=1e-4) and whole.tokens == tokens
    assert llm.perplexity(["The cat sat on the mat."]) == [pytest.approx(whole.perplexity)]
    with pytest.raises(ValueError, match="give the continuations"):
        llm.loglikelihood("The sky is")
    with pytest.raises(RuntimeError, match="the text gives no tokens"):
        llm.perplexity([""])
