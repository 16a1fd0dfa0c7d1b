"""Run lmpress's VLLM engine for real and compare its throughput with raw vLLM.

    python benchmarks/vllm_check.py MODEL_DIR [--rows 512] [--max-new-tokens 128]
        [--engine-args '{"tensor_parallel_size": 2, "max_model_len": 4096}'] [--images]

Needs a Linux machine with a GPU and `pip install 'lmpress[vllm]'`, or vLLM's CPU build
(`make install-vllm`, then `.venv-vllm/bin/python benchmarks/vllm_check.py smollm2:135m-instruct
--rows 64 --max-new-tokens 256 --engine-args '{"enforce_eager": true}'`); anywhere else it stops
at once and says why. MODEL_DIR may also be one of lmpress's model names (a packaged or tiny
model), resolved to the directory the VLLM engine loads. Both sides get the same engine
arguments, `dtype` included: where --engine-args sets none, lmpress's rule for `auto` (float32 on
a CPU, bfloat16 on a GPU) is written into them, since raw vLLM's own `auto` is bfloat16 on a CPU. It builds the same chat prompts for both sides, then runs, each in a fresh
process so each gets the whole GPU:

- raw vLLM: `vllm.LLM(MODEL_DIR, **engine_args).chat(conversations, SamplingParams(...))`, the
  offline API a user would otherwise write;
- lmpress: `run_batch` over a JSONL of the same conversations on the VLLM engine (AsyncLLM),
  exactly what `lmpress batch --engine VLLM` does.

Both decode greedily with the same max tokens, and only generation is timed (not model
loading). It prints rows/s and output tokens/s for each, lmpress's throughput as a ratio of raw
vLLM's, and how many replies are identical (greedy decoding on the same prompts should give the
same text; a difference points at the chat template or sampling translation). Exit code 0 when
both sides ran, 1 when lmpress failed rows, 2 when this machine cannot run vLLM.

--images (for a vision-language model) makes every other row ask about a picture, sent as an
OpenAI image_url part with a data: URL: raw vLLM reads it in `LLM.chat`, lmpress turns it into
`multi_modal_data`; identical greedy replies show that both put the image in the same place.

data_parallel_size in --engine-args reaches lmpress's AsyncLLM, which runs that many copies of
the model itself (vLLM's own data parallelism). vLLM's offline LLM class runs one copy only, so
the raw side drops it: with it set, the ratio compares N copies with one. Compare throughput
with it unset; set it to check that data parallel runs and gives the same greedy replies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOPICS = (
    "why the sky is blue", "how a bicycle stays upright", "what a hash table is",
    "the causes of the French revolution", "how vaccines train the immune system",
    "what makes bread rise", "how GPS finds your position", "why cats purr",
    "how a transistor works", "what inflation is", "how tides happen", "what DNA does",
)  # fmt: skip
STYLES = ("in one paragraph", "to a ten-year-old", "in three bullet points", "in detail")


def conversations(rows: int, images: bool = False) -> list[list[dict]]:
    """Deterministic chat prompts of varied length; with `images`, every other row asks about
    one picture (a data: URL), so that image rows batch with text rows."""
    out = []
    for i in range(rows):
        topic, style = TOPICS[i % len(TOPICS)], STYLES[(i // len(TOPICS)) % len(STYLES)]
        content: str | list[dict] = f"Explain {topic} {style}. (#{i})"
        if images and i % 2:
            content = [
                {"type": "image_url", "image_url": {"url": picture_url(i)}},
                {"type": "text", "text": f"Describe the colours of this picture. (#{i})"},
            ]
        messages = [{"role": "user", "content": content}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "You are a patient teacher."})
        out.append(messages)
    return out


def picture_url(seed: int) -> str:
    """A 64x64 picture of two colours, different for each seed, as a PNG data: URL."""
    import base64
    import io

    from PIL import Image

    image = Image.new("RGB", (64, 64), ((seed * 37) % 256, (seed * 91) % 256, 128))
    image.paste(((seed * 53) % 256, 40, (seed * 17) % 256), (0, 0, 32, 64))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def why_not_here(model_dir: str) -> str | None:
    if find_spec("vllm") is None:
        return (
            "vllm is not installed here: pip install 'lmpress[vllm]' (vLLM needs Linux and a GPU)"
        )
    from lmpress.engines.local.vllm.engine import VllmEngine

    reason = VllmEngine.unavailable_reason()
    if reason:
        return reason
    if not Path(model_dir).is_dir() and ":" not in model_dir:  # a tiny: or packaged name
        return f"{model_dir}: not a model directory"
    return None


# --- the two sides, each run in its own process ------------------------------------------------


def run_raw(
    model_dir: str,
    rows: int,
    max_new_tokens: int,
    engine_args: dict,
    images: bool,
    prompts: list[list[dict]] | None = None,
) -> dict:
    """Raw vLLM's `LLM.chat` over `prompts`, else over `conversations(rows, images)`."""
    from vllm import LLM, SamplingParams

    # vLLM's LLM class does not run data parallel in one process.
    engine_args = {k: v for k, v in engine_args.items() if k != "data_parallel_size"}
    llm = LLM(model=model_dir, **engine_args)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    prompts = prompts if prompts is not None else conversations(rows, images)
    started = time.perf_counter()
    try:
        outputs = llm.chat(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - started
    finally:
        # Stopped here: left to the interpreter's exit, vLLM's teardown can take its own
        # engine core's exit for a crash and abort the process (see raw_vllm.py in the tests).
        llm.llm_engine.engine_core.shutdown()
    return {
        "rows": len(outputs),
        "failed": 0,
        "completion_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "wall_s": wall,
        "replies": [o.outputs[0].text for o in outputs],
    }


def run_lmpress(
    model_dir: str, rows: int, max_new_tokens: int, engine_args: dict, images: bool
) -> dict:
    from lmpress.batch import BatchOptions, run_batch
    from lmpress.cli.report import BatchReport
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine

    config = load_config(
        None,
        {
            "model.model_name": model_dir,
            "model.model_kwargs": engine_args,
            "generation.max_new_tokens": max_new_tokens,
            "generation.temperature": 0.0,
        },
        engine="VLLM",
    )
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        with source.open("w") as f:
            for i, messages in enumerate(conversations(rows, images)):
                f.write(json.dumps({"id": str(i), "messages": messages}) + "\n")
        engine = create_engine(config)

        async def go():
            try:
                # Every run generates: the response cache (on by default in a batch) would answer a
                # rerun of the same rows without the engine.
                options = BatchOptions(str(source), str(target), cache="off")
                report = BatchReport(bar=False)  # notices and failed rows, no bar
                return await run_batch(config, options, engine=engine, events=report)
            finally:
                await engine.aclose()

        summary = asyncio.run(go())
        replies = {}
        for line in target.read_text().splitlines():
            row = json.loads(line)
            replies[int(row["id"])] = row["response"]["text"]
    return {
        "rows": summary.rows_ok,
        "failed": summary.rows_failed,
        "completion_tokens": summary.completion_tokens,
        "wall_s": summary.wall_s,
        "replies": [replies.get(i) for i in range(rows)],
    }


SIDES = {"raw": run_raw, "lmpress": run_lmpress}


def run_side(side: str, args: argparse.Namespace) -> dict:
    """One side in a fresh Python process; its result comes back as the last stdout line."""
    command = [
        sys.executable, __file__, args.model_dir, "--only", side, "--rows", str(args.rows),
        "--max-new-tokens", str(args.max_new_tokens), "--engine-args", args.engine_args,
        *(["--images"] if args.images else []),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    proc = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"vllm_check: the {side} run failed (exit code {proc.returncode})")
    return json.loads(lines[-1])


def report(raw: dict, ours: dict) -> str:
    def rate(side: dict) -> tuple[float, float]:
        return side["rows"] / side["wall_s"], side["completion_tokens"] / side["wall_s"]

    raw_rows, raw_tokens = rate(raw)
    our_rows, our_tokens = rate(ours)
    same = sum(a == b for a, b in zip(raw["replies"], ours["replies"], strict=True))
    lines = [
        f"{'':10}{'rows':>8}{'tokens':>10}{'wall s':>10}{'rows/s':>10}{'tok/s':>12}",
        f"{'raw vLLM':10}{raw['rows']:>8}{raw['completion_tokens']:>10}{raw['wall_s']:>10.2f}"
        f"{raw_rows:>10.2f}{raw_tokens:>12.1f}",
        f"{'lmpress':10}{ours['rows']:>8}{ours['completion_tokens']:>10}{ours['wall_s']:>10.2f}"
        f"{our_rows:>10.2f}{our_tokens:>12.1f}",
        f"lmpress / raw vLLM, output tokens per second: {our_tokens / raw_tokens:.3f}",
        f"identical replies (greedy): {same} of {len(raw['replies'])}",
    ]
    if ours["failed"]:
        lines.append(f"lmpress failed rows: {ours['failed']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="a local model directory vLLM can load")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--engine-args", default="{}", help="JSON: vLLM engine arguments")
    parser.add_argument(
        "--images", action="store_true", help="every other row asks about a picture (a VLM)"
    )
    parser.add_argument("--only", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    engine_args = json.loads(args.engine_args)
    if args.only:
        result = SIDES[args.only](
            args.model_dir, args.rows, args.max_new_tokens, engine_args, args.images
        )
        print(json.dumps(result))
        return 0
    reason = why_not_here(args.model_dir)
    if reason:
        print(f"vllm_check: cannot run here: {reason}", file=sys.stderr)
        return 2
    from lmpress.engines.local.vllm.api import VllmApi
    from lmpress.engines.local.vllm.translate import model_directory

    args.model_dir = model_directory(args.model_dir, "MODEL_DIR")
    engine_args.setdefault("dtype", VllmApi.auto_dtype())
    args.engine_args = json.dumps(engine_args)
    raw = run_side("raw", args)
    ours = run_side("lmpress", args)
    print(report(raw, ours))
    return 1 if ours["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
