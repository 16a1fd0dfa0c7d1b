"""The Python front with LoRA adapters (issue 54): `LLM(..., adapters={...})` and `adapter=` on
generate, chat and stream, for all prompts or one a prompt, on SmolLM2 and the two adapters
made offline for it (each changes the reply). A name the model does not have is refused
before any work."""

from __future__ import annotations

import pytest

from lmpress import LLM
from lmpress.builtin_models.lora import smollm2_adapters

pytestmark = pytest.mark.timeout(300)

QUESTION = "Name three colours."


@pytest.fixture(scope="module")
def llm():
    adapters = {name: str(path) for name, path in smollm2_adapters().items()}
    with LLM("smollm2", engine="NATIVE", adapters=adapters, max_new_tokens=12) as model:
        yield model


def test_each_prompt_runs_on_its_adapter_in_every_call(llm):
    mixed = llm.generate([QUESTION] * 3, adapter=["lora-a", "lora-b", None])
    assert all(result.error is None for result in mixed)
    a, b, base = (result.text for result in mixed)
    assert len({a, b, base}) == 3  # each adapter changes the greedy reply
    assert [result.model for result in mixed[:2]] == ["lora-a", "lora-b"]
    assert mixed[2].model not in {"lora-a", "lora-b"}
    assert [r.text for r in llm.generate([QUESTION, QUESTION], adapter="lora-a")] == [a, a]
    assert llm.generate(QUESTION)[0].text == base
    conversation = [{"role": "user", "content": QUESTION}]
    assert llm.chat(conversation, adapter="lora-b").text == b
    assert [r.text for r in llm.chat([conversation] * 2, adapter=[None, "lora-a"])] == [base, a]
    assert "".join(llm.stream(QUESTION, adapter="lora-a")) == a


def test_an_adapter_the_model_lacks_is_refused_before_any_work(llm):
    with pytest.raises(ValueError, match="'lora-c' does not exist"):
        llm.generate([QUESTION, QUESTION], adapter=["lora-a", "lora-c"])
    with pytest.raises(ValueError, match="2 adapters for 3 prompts"):
        llm.generate([QUESTION] * 3, adapter=["lora-a", "lora-b"])
    with pytest.raises(ValueError, match="'lora-c' does not exist"):
        next(llm.stream(QUESTION, adapter="lora-c"))
