"""`--task classify` and `--task reward` on NATIVE, through the commands and the Python front:
a sequence classifier's labels' probabilities and a reward model's score, each equal to
transformers' own text-classification pipeline on the tiny models built offline (a BERT
classifier of three labels, a Llama reward model with a one-value head on its last token).

The pipeline's defaults are the reference: `top_k=None` gives every label's probability (a
softmax over the labels; a sigmoid for one label), `function_to_apply="none"` the raw value a
reward model scores with. Both sides run the same float32 model on the same token ids, so the
values agree to float32 rounding over a two-layer forward pass (about 1e-6); 1e-4 is the
issue's bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmpress import LLM
from lmpress.builtin_models.tiny import CLASSES, tiny_model
from lmpress.vocabulary.errors import ConfigError
from tests.conftest import run_lmpress
from tests.wire.openai.vllm_shapes import BatchOutputLine, ClassificationResponse, PoolingResponse

pytestmark = pytest.mark.timeout(180)

TEXTS = [
    "The sky is blue and the grass is green.",
    "Hi.",
    "A much longer sentence about cats and dogs that sleep through most of the day.",
]


def pipeline_of(name: str, raw: bool) -> list[dict[str, float]]:
    """Each text's label -> value, as transformers' pipeline gives them."""
    from transformers import pipeline

    classify = pipeline(
        "text-classification", model=str(tiny_model(name)), top_k=None,
        function_to_apply="none" if raw else None,
    )  # fmt: skip
    return [{d["label"]: d["score"] for d in answer} for answer in classify(TEXTS)]


@pytest.fixture(scope="module")
def expected() -> dict[str, list[dict[str, float]]]:
    return {"classify": pipeline_of("classifier", raw=False), "reward": pipeline_of("reward", True)}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_python_front_classifies_and_rewards_as_transformers_pipeline_does(expected):
    with LLM("tiny:classifier", engine="NATIVE", task="classify") as llm:
        classes = llm.classify(TEXTS)
        # Another task's method would read the probabilities as rewards or vectors.
        for method, task in ((llm.reward, "reward"), (llm.embed, "embed")):
            with pytest.raises(
                ConfigError, match=f'loaded for task classify; load it with task="{task}"'
            ):
                method(TEXTS)
    for got, want in zip(classes, expected["classify"], strict=True):
        assert list(got.probs) == list(CLASSES)  # the model's label order
        assert got.probs == pytest.approx(want, abs=1e-4)
        assert got.label == max(want, key=want.__getitem__)
    with LLM("tiny:reward", engine="NATIVE", task="reward") as llm:
        rewards = llm.reward(TEXTS)
    assert rewards == pytest.approx([want["LABEL_0"] for want in expected["reward"]], abs=1e-4)
    assert len(set(rewards)) == len(TEXTS)  # each text its own score, not a padded row's


def test_classify_rows_and_classify_lines_get_the_pipelines_probabilities(tmp_path, expected):
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "one", "input": TEXTS[0]},
        {"id": "many", "input": TEXTS[1:]},
        {"custom_id": "line", "method": "POST", "url": "/classify",
         "body": {"model": "tiny:classifier", "input": TEXTS}},
        {"id": "chat", "messages": [{"role": "user", "content": "hi"}]},
    ])  # fmt: skip
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), "--engine", "NATIVE", "--task", "classify",
        "--model.model_name", "tiny:classifier",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]  # the chat row failed, alone
    rows = {row.get("custom_id") or row["id"]: row for row in read_jsonl(out)}
    want = expected["classify"]
    assert rows["one"]["probs"] == pytest.approx(want[0], abs=1e-4)
    assert rows["one"]["label"] == max(want[0], key=want[0].__getitem__)
    assert rows["one"]["response"]["engine"] == "NATIVE"
    many = rows["many"]["classifications"]
    assert [c["probs"] for c in many] == [pytest.approx(w, abs=1e-4) for w in want[1:]]
    line = BatchOutputLine.model_validate(rows["line"])
    body = ClassificationResponse.model_validate(line.response.body)
    assert [d.probs for d in body.data] == [
        pytest.approx([w[label] for label in CLASSES], abs=1e-4) for w in want
    ]
    assert [d.label for d in body.data] == [max(w, key=w.__getitem__) for w in want]
    assert {d.num_classes for d in body.data} == {len(CLASSES)}
    assert body.usage.prompt_tokens > len(TEXTS)
    failed = read_jsonl(Path(f"{out}.errors.jsonl"))
    assert [f["id"] for f in failed] == ["chat"]
    assert "a chat row in a classify run; give 'input'" in failed[0]["error"]["message"]


def test_reward_rows_and_pooling_lines_get_the_models_raw_score(tmp_path, expected):
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "one", "input": TEXTS[0]},
        {"custom_id": "line", "method": "POST", "url": "/pooling",
         "body": {"model": "tiny:reward", "input": TEXTS}},
    ])  # fmt: skip
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "-i", str(src), "-o", str(out), "--engine", "NATIVE", "--task", "reward",
        "--model.model_name", "tiny:reward",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {row.get("custom_id") or row["id"]: row for row in read_jsonl(out)}
    scores = [want["LABEL_0"] for want in expected["reward"]]
    assert rows["one"]["reward"] == pytest.approx(scores[0], abs=1e-4)
    body = PoolingResponse.model_validate(
        BatchOutputLine.model_validate(rows["line"]).response.body
    )
    assert [d.data for d in body.data] == [pytest.approx([s], abs=1e-4) for s in scores]


def test_infer_prints_the_labels_likeliest_first_and_a_model_without_a_head_is_refused(expected):
    run = run_lmpress(
        "infer", "--engine", "NATIVE", "--task", "classify", "--model.model_name",
        "tiny:classifier", TEXTS[0],
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    want = expected["classify"][0]
    printed = [line.split() for line in run.stdout.splitlines()]
    assert [label for _, label in printed] == sorted(want, key=lambda k: -want[k])
    assert [float(p) for p, _ in printed] == pytest.approx(sorted(want.values())[::-1], abs=1e-4)
    refused = run_lmpress(
        "infer", "--engine", "NATIVE", "--task", "reward", "--model.model_name", "tiny:llama",
        "hello",
    )  # fmt: skip
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "lmpress: error: task: reward: model 'tiny:llama' has no classification head "
        "(LlamaForCausalLM); use a sequence-classification model (…ForSequenceClassification)"
    )
