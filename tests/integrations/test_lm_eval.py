"""lm-evaluation-harness both ways on real weights (SmolLM2-135M, float32, on NATIVE): lm-eval's
`local-completions` and `local-chat-completions` against `lmpress serve`, and `lmpress eval`
in-process, each matched sample by sample against lm-eval's own `hf` backend on the same
weights, on the local tasks in tests/eval_tasks/.

Rolling perplexity runs in windows of 32 tokens on every side, so each text takes two.
One server, one `hf` run and one `lmpress eval` run are shared by the file's tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmpress.builtin_models.packaged import SMOLLM2, resolve_packaged_name
from lmpress.engines.common.dequantized import dequantized_copy
from tests.conftest import REPO, run_lmpress
from tests.serve.conftest import Served, serving

TASKS = REPO / "tests" / "eval_tasks"
SCORED = ["lmpress_mc", "lmpress_ppl"]
IN_PROCESS = [*SCORED, "lmpress_capitals"]  # and a generation task, greedy raw text
LIMIT = 16  # questions of the multiple-choice task (64 choices); the 6 texts all run
WINDOW = 32  # tokens a window reads: each text (38 to 59 tokens) takes two; a question fits
NATIVE_F32 = ["--engine", "NATIVE", "--model.model_name", SMOLLM2, "--model.torch_dtype_str",
              "float32"]  # fmt: skip


def evaluate(model: str, model_args: dict, tasks: list[str], **settings) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        limit=LIMIT,
        log_samples=True,
        # The tests' tasks only: indexing lm-eval's own 15,000 takes 6-10 s a call.
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        **settings,
    )
    assert results is not None
    return results


def responses(samples: list[dict]) -> dict[int, list]:
    """Each sample's answers by doc_id: a choice's [logprob, is_greedy], a text's logprob, a
    reply's text (tuples in memory, lists in lm-eval's sample files)."""
    first = lambda r: list(r[0]) if isinstance(r[0], list | tuple) else r[0]  # noqa: E731
    return {s["doc_id"]: [first(r) for r in s["resps"]] for s in samples}


@pytest.fixture(scope="module")
def hf_dir() -> str:
    """SmolLM2 as a Hugging Face directory: the GGUF file dequantized, as NATIVE loads it."""
    return str(dequantized_copy(Path(resolve_packaged_name(SMOLLM2))))


@pytest.fixture(scope="module")
def hf(hf_dir) -> dict:
    args = {"pretrained": hf_dir, "dtype": "float32", "device": "cpu", "max_length": WINDOW}
    return evaluate("hf", args, IN_PROCESS, batch_size=8)


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    with serving(*NATIVE_F32, "--serve.served_model_name", "smollm2") as served:
        yield served


@pytest.fixture(scope="module")
def served(server, hf_dir) -> dict:
    args = {
        "model": "smollm2",
        "base_url": f"{server.url}/v1/completions",
        "tokenizer": hf_dir,
        "tokenizer_backend": "huggingface",
        # lm-eval's API backends keep one token of max_length for a reply and window a text
        # in max_length - 2 tokens (hf: max_length); this gives them hf's windows.
        "max_length": WINDOW + 2,
        "num_concurrent": 8,
    }
    return evaluate("local-completions", args, SCORED)


@pytest.fixture(scope="module")
def lmpress_eval(tmp_path_factory) -> dict:
    """`lmpress eval`'s results JSON, with its samples read back from its sample files."""
    out = tmp_path_factory.mktemp("eval")
    tasks = ",".join(IN_PROCESS)
    run = run_lmpress("eval", *NATIVE_F32, "--tasks", tasks, "--include-path", str(TASKS),
                      "--limit", str(LIMIT), "--max-length", str(WINDOW), "-o", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    (results_file,) = out.glob("*/results_*.json")
    results = json.loads(results_file.read_text())
    results["samples"] = {
        task: [json.loads(line) for f in out.glob(f"*/samples_{task}_*.jsonl") for line in f.open()]
        for task in IN_PROCESS
    }
    results["stdout"] = run.stdout
    results["summary"] = (out / "summary.md").read_text()
    return results


def assert_same_choices(ours: dict, theirs: dict) -> None:
    got, want = responses(ours["samples"]["lmpress_mc"]), responses(theirs["samples"]["lmpress_mc"])
    assert sorted(got) == sorted(want) == list(range(LIMIT))
    for doc, choices in want.items():
        assert len(got[doc]) == len(choices) == 4
        for (logprob, greedy), (their_logprob, their_greedy) in zip(got[doc], choices, strict=True):
            # lm-eval's sample files write the numbers as text
            assert float(logprob) == pytest.approx(float(their_logprob), abs=1e-4), doc
            assert str(greedy) == str(their_greedy), doc
    metric = ours["results"]["lmpress_mc"]
    assert metric["acc,none"] == theirs["results"]["lmpress_mc"]["acc,none"]
    assert metric["acc_norm,none"] == theirs["results"]["lmpress_mc"]["acc_norm,none"]


# A text's log-likelihood against lm-eval's hf backend. That backend sums each window's token
# logprobs in float32 (`logits.sum()` in lm_eval/models/huggingface.py): with each window under
# 256 nats, every one of its at most WINDOW additions rounds by up to half a float32 ulp there
# (2**-17), so a text of two windows carries up to 2 * WINDOW * 2**-17 = 4.9e-4 of the
# reference's own rounding. The 1e-4 the choices are held to (sums of a few tokens) is added
# for the two forward passes' own roundings. On an AVX2-only AMD EPYC one text was 1.04e-4 off.
TEXT_ABS = 1e-4 + 2 * WINDOW * 2**-17
TEXT_WORDS = sum(
    len(json.loads(line)["text"].split())
    for line in (TASKS / "texts.jsonl").read_text().splitlines()
)


def assert_same_texts(ours: dict, theirs: dict) -> None:
    got, want = (
        responses(ours["samples"]["lmpress_ppl"]),
        responses(theirs["samples"]["lmpress_ppl"]),
    )
    assert sorted(got) == sorted(want) == list(range(6))
    for doc, (logprob,) in want.items():
        assert float(got[doc][0]) == pytest.approx(float(logprob), abs=TEXT_ABS), doc
        # a whole paragraph, scored in more than one window, each under 256 nats (TEXT_ABS)
        assert -256 < float(logprob) < -50
    # word perplexity is exp(-sum / words): the 6 texts' allowance over their 261 words moves
    # it by up to 6 * 5.9e-4 / 261 = 1.4e-5; byte perplexity (1,371 bytes) and bits per byte
    # (over the whole sum) move less
    rel = len(want) * TEXT_ABS / TEXT_WORDS
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        ppl = ours["results"]["lmpress_ppl"][metric]
        assert ppl == pytest.approx(theirs["results"]["lmpress_ppl"][metric], rel=rel)


def test_local_completions_against_serve_scores_choices_as_hf_does(served, hf):
    assert_same_choices(served, hf)


def test_local_completions_against_serve_scores_texts_in_windows_as_hf_does(served, hf):
    assert_same_texts(served, hf)


def test_lmpress_eval_scores_as_hf_and_prints_the_summary_it_writes(lmpress_eval, hf):
    assert_same_choices(lmpress_eval, hf)
    assert_same_texts(lmpress_eval, hf)
    acc = hf["results"]["lmpress_mc"]["acc,none"]
    assert f"| lmpress_mc | 1.0 | none | 0 | acc | {acc:.4f} |" in lmpress_eval["summary"]
    assert lmpress_eval["summary"].strip() in lmpress_eval["stdout"]


def test_lmpress_eval_generates_what_hf_generates(lmpress_eval, hf):
    replies = responses(lmpress_eval["samples"]["lmpress_capitals"])
    assert replies == responses(hf["samples"]["lmpress_capitals"])
    assert any(reply[0].strip() for reply in replies.values())
    metric = "exact_match,strip"
    assert (
        lmpress_eval["results"]["lmpress_capitals"][metric]
        == (hf["results"]["lmpress_capitals"][metric])
    )


def test_lmpress_eval_refuses_an_unknown_task_in_one_line_before_loading_a_model(tmp_path):
    run = run_lmpress("eval", "-c", "tiny-native", "--tasks", "lmpress_mc,no_such_task",
                      "--include-path", str(TASKS), "-o", str(tmp_path))  # fmt: skip
    assert run.returncode == 2
    assert run.stderr == (f"lmpress: error: --tasks: no task named no_such_task under {TASKS}\n")
    assert list(tmp_path.iterdir()) == []


def test_lmpress_eval_without_tasks_says_how_to_name_them(tmp_path):
    run = run_lmpress("eval", "-c", "tiny-native", "-o", str(tmp_path))
    assert run.returncode == 2
    assert run.stderr == (
        "lmpress: error: --tasks: name at least one lm-eval task, e.g. --tasks hellaswag\n"
    )


def test_lmpress_eval_gives_the_served_paths_metrics(lmpress_eval, served):
    assert_same_choices(lmpress_eval, served)
    assert_same_texts(lmpress_eval, served)


def test_local_chat_completions_against_serve_replies_as_hf_with_its_chat_template(server, hf_dir):
    chat = evaluate(
        "local-chat-completions",
        {"model": "smollm2", "base_url": f"{server.url}/v1/chat/completions", "num_concurrent": 4},
        ["lmpress_capitals"],
        apply_chat_template=True,
    )
    reference = evaluate(
        "hf",
        {"pretrained": hf_dir, "dtype": "float32", "device": "cpu"},
        ["lmpress_capitals"],
        apply_chat_template=True,
        batch_size=8,
    )
    replies = responses(chat["samples"]["lmpress_capitals"])
    assert replies == responses(reference["samples"]["lmpress_capitals"])
    assert any(reply[0].strip() for reply in replies.values())
    em = chat["results"]["lmpress_capitals"]["exact_match,strip"]
    assert em == reference["results"]["lmpress_capitals"]["exact_match,strip"]


def test_lmpress_eval_resumes_from_the_answers_an_earlier_run_into_its_output_got(tmp_path):
    """On the tiny model: the first run answers two questions, the second, asked for four,
    takes those two's answers from the first run's database and asks the engine the rest."""
    args = ("eval", "-c", "tiny-native", "--tasks", "lmpress_mc", "--include-path", str(TASKS),
            "-o", str(tmp_path))  # fmt: skip
    first = run_lmpress(*args, "--limit", "2")
    assert first.returncode == 0, first.stderr
    second = run_lmpress(*args, "--limit", "4")
    assert second.returncode == 0, second.stderr
    note = f"lmpress: 8 of 16 requests answered by an earlier run into {tmp_path} (--no-resume asks them again)"  # fmt: skip
    assert note in second.stderr.splitlines()
    assert note not in first.stderr
    runs = sorted(tmp_path.glob("*/samples_lmpress_mc_*.jsonl"))
    assert len(runs) == 2
    before, after = ([json.loads(line) for line in path.open()] for path in runs)
    assert responses(after) == {**responses(after), **responses(before)}
    assert len(after) == 4


def test_lm_eval_finds_the_model_class_by_name_and_builds_it_from_a_model_args_string():
    from lm_eval.api.registry import get_model

    import lmpress.integrations.lm_eval  # noqa: F401  (registers the class with lm-eval)

    # lm-eval adds its own batch_size and device to every model it builds; the engine's
    # batch decides how much runs at once.
    model = get_model("lmpress").create_from_arg_string(
        "recipe=tiny-native,engine=NATIVE,generation.batch_size=4", {"batch_size": 1}
    )
    try:
        assert (model.engine.name, model.engine.config.generation.batch_size) == ("NATIVE", 4)
        assert model.get_model_info() == {"model": "tiny:llama", "engine": "NATIVE"}
    finally:
        model.close()


def test_lm_eval_keeps_its_own_models_once_lmpress_registers_its_class():
    """lm-eval fills its model registry only when it is empty: lmpress's class, registered
    first in a fresh process, must not hide `hf` and the others (a random test order found it)."""
    import subprocess
    import sys

    script = (
        "import lmpress.integrations.lm_eval\n"
        "from lm_eval.api.registry import get_model\n"
        "print(get_model('hf').__name__, get_model('local-completions').__name__)"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["HFLM", "LocalCompletionsAPI"]


def test_local_completions_against_serve_on_llamacpp_scores_as_the_engine_does():
    """lm-eval's local-completions, unchanged, on a LLAMACPP server (the F16 GGUF file),
    tokenizing through the server's own tokenizer routes (lm-eval's `remote` backend): each
    choice's log-likelihood is the engine's own for the same tokens, scored in-process."""
    import asyncio

    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine
    from lmpress.vocabulary.likelihood import LoglikelihoodRequest, encode_pair

    engine_args = ["--engine", "LLAMACPP", "--model.model_name", SMOLLM2]
    with serving(*engine_args, "--serve.served_model_name", "smollm2-gguf") as server:
        args = {
            "model": "smollm2-gguf",
            "base_url": f"{server.url}/v1/completions",
            "tokenizer_backend": "remote",
            "num_concurrent": 8,
        }
        served = evaluate("local-completions", args, ["lmpress_mc"])
    got = responses(served["samples"]["lmpress_mc"])
    assert sorted(got) == list(range(LIMIT))
    questions = [json.loads(line) for line in (TASKS / "multiple_choice.jsonl").open()][:LIMIT]
    engine = create_engine(
        load_config(overrides={"engine": "LLAMACPP", "model.model_name": SMOLLM2})
    )
    try:
        tokenizer = engine.tokenizer()

        async def score(question: dict):
            text = f"Question: {question['question']}\nAnswer:"
            pairs = [encode_pair(tokenizer.encode, text, f" {c}", 0) for c in question["choices"]]
            request = LoglikelihoodRequest("q", pairs[0][0], [choice for _, choice in pairs])
            return await engine.loglikelihood(request)

        async def all_questions():
            return await asyncio.gather(*(score(q) for q in questions))

        own = asyncio.run(all_questions())
    finally:
        asyncio.run(engine.aclose())
    for doc, result in enumerate(own):
        assert result.error is None
        # scored in other batches beside other requests: llama.cpp's rounding alone differs
        served_logprobs = [float(logprob) for logprob, _ in got[doc]]
        assert served_logprobs == pytest.approx([s.logprob for s in result.scores], abs=0.02)
    assert 0 <= served["results"]["lmpress_mc"]["acc,none"] <= 1
