"""The router of a server of several models (serve/router.py) where timing matters, on the
ECHO engine (no weights, so loads are instant and a reply's speed is set): a model answering a
request is never unloaded for another; and the command line's own refusals.

test_many_models.py has the real models, their memory and their adapters."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import run_lmpress, with_plugin

WORDS = "word " * 40  # ECHO repeats the conversation: ~50 words at 50 ms each, ~2.5 s


@pytest.fixture(scope="module")
def echoes(serve_process, echo_plugin):
    """Two ECHO models, at most one loaded, each word of a reply 50 ms apart."""
    return serve_process(
        "--engine", "ECHO", "--model", "a=tiny-native", "--model", "b=tiny-native",
        "--max-loaded-models", "1", "--generation.max_new_tokens", "100000",
        env={**with_plugin(echo_plugin), "ECHO_DELAY_S": "0.05"},
    )  # fmt: skip


def test_a_model_with_a_request_in_flight_is_not_unloaded_for_another(echoes):
    client = echoes.client()
    stream = client.chat.completions.create(
        model="a", messages=[{"role": "user", "content": WORDS}], stream=True
    )
    chunks = iter(stream)
    next(chunks)  # "a" is generating
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="b", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "1"
    assert "serve.max_loaded_models" in caught.value.message
    rest = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert rest.count("word") == 40  # the stream ran to its end

    reply = client.chat.completions.create(model="b", messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "b"  # "a" idle now: unloaded for "b"
    models = httpx.get(f"{echoes.url}/health").json()["models"]
    assert {m["model"]: m["loaded"] for m in models} == {"a": False, "b": True}


def test_bad_model_flags_and_entries_are_one_line_each(tmp_path):
    bare = run_lmpress("serve", "--model", "tiny-native")
    assert bare.returncode != 0
    assert "--model tiny-native: give NAME=RECIPE" in bare.stderr
    assert "Traceback" not in bare.stderr

    recipe = tmp_path / "serve.yaml"
    recipe.write_text("serve:\n  models:\n    - {name: x, recipe: no-such-recipe}\n")
    unknown = run_lmpress("serve", "-c", str(recipe))
    assert unknown.returncode != 0
    assert "serve.models: 'x':" in unknown.stderr and "no-such-recipe" in unknown.stderr
    assert "Traceback" not in unknown.stderr
