"""NATIVE on a CUDA GPU in one short run that fits a 15-minute device lease (issue 57), and the
same steps as a small smoke run on a CPU, so CI keeps the script working.

On a GPU it measures, with only what a lent machine has (PyTorch and transformers; no vLLM, no
network), in under 8 minutes:

- throughput: NATIVE against transformers' own continuous batching (`generate_batch`) and its
  static `generate` (left-padded batches), each side in a process of its own, the same rows
  in flight on every side, tokens/s of each and NATIVE's ratio to each. The model is Llama 3.2
  1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, tied
  embeddings) with a 49,152-token vocabulary, 1.07B parameters, built from its config with
  random weights as each side loads it (`model.load_pretrained_weights: false`: speed does not
  depend on the values), bfloat16. The tokenizer is `tiny:smollm2-135m-shape`'s: a BPE
  trained offline at SmolLM2's vocabulary size, not SmolLM2's own. 256 rows x 256 new tokens,
  EOS held off, so every row runs its full length. generate_batch is timed on its second call
  over the rows: the first one sizes its paged cache and captures its CUDA graphs (the first
  call's rate is shown beside it).
- the share of the memory-bandwidth roofline NATIVE's decode step reaches at 64 rows. The step
  is timed from the outside, with no hook into the scheduler: 64 rows of 16 new tokens, then
  64 of 80, batch size 64, each three times in turn, the fastest of each kept. The rows join
  in the first step or two (the first one steps alone while the rest arrive) and leave together
  in the last, alike in both runs, so the two wall times differ by 64 decode steps of all 64
  rows (scheduling.py `_step`: the forward pass, the pick, the cache's bookkeeping) and nothing
  else: the same prompts, prefilled alike (an untimed run first leaves the prefix store as
  each timed run finds it), timed with `torch.cuda.synchronize` on both sides. Bytes a step
  must read: every weight once (the tied embedding is read whole by the LM head) plus the 64
  rows' KV cache at their mean length over those steps (`loading.kv_bytes_per_token`), not the
  longer slots NATIVE reads. The card's bandwidth: memory clock x bus width x 2 from
  `torch.cuda.get_device_properties` (as torch's own `cuda._device_limits` computes it), else
  a datasheet figure by device name (H200: 4.8 TB/s); the table says which.
- greedy equality with transformers: NATIVE's tokens for 16 chat rows in one batch against
  `generate` on each prompt alone, token for token (32 new tokens, EOS held off, float32). On
  `tiny:smollm2-135m-shape`, SmolLM2-135M's shape with random weights: the packaged SmolLM2 is
  a 98 MB GGUF file (270 MB dequantized, and made by llama.cpp and gguf, which the machine
  lacks), more than the 64 MiB a device call can carry.

Each process runs under a deadline (180, 120 and 100 s), so the whole check ends inside 8
minutes even where a side is far slower than expected: a side that misses it is shown as a
bound (the tokens it was given over the time it ran). It prints one table and exits 0 whether
or not a GPU is present: without CUDA (or with `--smoke`) it runs the same steps on a tiny
model, a few rows of a few tokens (tests/test_gpu_check.py runs it so).

    PYTHONPATH=. .venv/bin/python benchmarks/gpu_check.py [--smoke] [--deadline SECONDS]

On a lent GPU (the device tool: /work/.library/device/README.md). Once, here, in the
repository root: wheels for the machine's Python 3.12 of lmpress's base needs that it lacks
(6.2 MB; lmpress itself travels as the working tree and runs from it):

    echo /.whl/ >> .git/info/exclude
    .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 -d .whl omegaconf==2.4.0 zstandard==0.25.0 \\
        jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \\
        rpds-py==2026.9.1 jsonlines==4.0.0 orjson==3.13.0

Then one `run` with carry [".whl"] and timeout_s 540 (the check's 8 minutes at most, and the
wheels' install), its command on one line:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;
    PYTHONUNBUFFERED=1 LMPRESS_CACHE=/tmp/lmpress-cache python3 benchmarks/gpu_check.py 2>&1
    | tee $OUT/gpu_check.log
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here is downloaded

from native_throughput import raw_generate
from rounds import chat_prompts, mixed_prompts

from lmpress.vocabulary.types import GenerationParams, Message, Request

# Datasheet memory bandwidth by a word of the device's name, bytes/s: where torch does not
# give the memory clock and bus width.
DATASHEET_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "A10G": 0.6e12,
}
COLUMNS = ("check", "value", "target", "how")


ROOFLINE_REPEATS = 3


@dataclass(frozen=True)
class Plan:
    """What one run measures on: the throughput model's shape, the rows and tokens, the
    equality check's model, and each process's deadline in seconds."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tiny: str  # the tiny model whose tokenizer the throughput model uses, and the equality's
    rows: int
    new_tokens: int
    batch: int  # rows in flight on every side, and the roofline's rows
    short: int  # the roofline's two runs: new tokens a row
    long: int
    equal_rows: int
    equal_tokens: int
    words: int = 120  # prompts of 4 to this many words (rounds.mixed_prompts)
    deadlines: dict[str, float] = field(default_factory=dict)


GPU = Plan("gpu", 2048, 16, 32, 8, 8192, "smollm2-135m-shape", rows=256, new_tokens=256,
           batch=64, short=16, long=80, equal_rows=16, equal_tokens=32,
           deadlines={"NATIVE": 180, "generate_batch": 120, "generate": 100})  # fmt: skip
SMOKE = Plan("smoke", 64, 2, 4, 2, 128, "llama", rows=8, new_tokens=8, batch=4, short=2, long=18,
             equal_rows=4, equal_tokens=8, words=12,
             deadlines={"NATIVE": 60, "generate_batch": 60, "generate": 60})  # fmt: skip


def write_model(plan: Plan, tokenizer_dir: str, out: str) -> int:
    """A model directory of the plan's Llama shape with the tiny model's tokenizer and no
    weights (the engine draws them at load); returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=plan.hidden, intermediate_size=plan.intermediate,
        num_hidden_layers=plan.layers, num_attention_heads=plan.heads,
        num_key_value_heads=plan.kv_heads, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(config).parameters())


def engine_for(model_dir: str, dtype: str, batch: int, random_weights: bool) -> Any:
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine

    overrides = {
        "engine": "NATIVE",
        "model.model_name": model_dir,
        "model.torch_dtype_str": dtype,
        "model.load_pretrained_weights": not random_weights,
        "generation.batch_size": batch,
    }
    return create_engine(load_config(overrides=overrides))


def close(engine: Any) -> None:
    import asyncio

    asyncio.run(engine.aclose())


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def native_rows(engine: Any, prompts: list[str], new_tokens: int, logprobs: bool = False):
    """Every prompt through NATIVE as a chat row of exactly `new_tokens` tokens (EOS held
    off); the results, checked."""
    params = GenerationParams(max_new_tokens=new_tokens, min_tokens=new_tokens, logprobs=logprobs)
    requests = [Request(str(i), [Message("user", p)], params) for i, p in enumerate(prompts)]
    results = engine.generate(requests)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} NATIVE rows failed: {failed[0]}")
    return results


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    synchronize()
    started = time.perf_counter()
    out = work()
    synchronize()
    return out, time.perf_counter() - started


# --- what each process runs: `report(key, value)` sends a figure to the parent as it is made


def native_job(report: Callable[[str, Any], None], plan: Plan, model_dir: str, tiny_dir: str):
    """NATIVE's process: greedy equality on the tiny model, then the roofline and the
    throughput on the plan's model. A stage that fails is reported as `<stage> error` and the
    next one runs."""
    import torch

    report("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    attempt(report, "equality", lambda: equality(report, plan, tiny_dir))
    engine = attempt(report, "NATIVE", lambda: warm_engine(plan, model_dir))
    if engine is not None:
        attempt(report, "roofline", lambda: roofline(report, plan, engine))
        attempt(report, "NATIVE", lambda: native_throughput(report, plan, engine))


def attempt(report: Callable[[str, Any], None], stage: str, work: Callable[[], Any]) -> Any:
    try:
        return work() or True
    except Exception as exc:
        report(f"{stage} error", failure(exc))
        return None


def warm_engine(plan: Plan, model_dir: str) -> Any:
    """NATIVE on the plan's model, warmed up on a batch of rows."""
    engine = engine_for(model_dir, "bfloat16", plan.batch, random_weights=True)
    native_rows(engine, mixed_prompts(plan.batch, plan.words), 2)
    return engine


def equality(report, plan: Plan, tiny_dir: str) -> None:
    """NATIVE's greedy tokens, all rows in one batch, against transformers' `generate` on
    each prompt alone (the same prompt ids), float32 on both."""
    import torch

    from lmpress.engines.local.native.row_attention import own_attention_back

    engine = engine_for(tiny_dir, "float32", plan.equal_rows, random_weights=False)
    try:
        prompts = chat_prompts(plan.equal_rows)
        results = native_rows(engine, prompts, plan.equal_tokens, logprobs=True)
        own_attention_back(engine.model)  # generate runs the model's own attention
        equal, first_apart = 0, []
        for result in results:
            ours = [entry.id for entry in result.samples[0].logprobs]
            ids = torch.tensor([result.prompt_ids], device=engine.device)
            with torch.inference_mode():
                out = engine.model.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False,
                    max_new_tokens=plan.equal_tokens, min_new_tokens=plan.equal_tokens,
                    pad_token_id=engine.hf_tokenizer.pad_token_id,
                )  # fmt: skip
            theirs = out[0, ids.shape[1] :].tolist()
            if ours == theirs:
                equal += 1
            else:
                apart = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b]
                first_apart.append(apart[0] if apart else min(len(ours), len(theirs)))
        report("equality", {"equal": equal, "rows": len(results), "first_apart": first_apart})
    finally:
        close(engine)


def roofline(report, plan: Plan, engine: Any) -> None:
    """NATIVE's decode step at `plan.batch` rows, timed from the outside (see the module
    docstring), and the bytes such a step must read."""
    import torch

    from lmpress.engines.local.native.loading import kv_bytes_per_token

    prompts = mixed_prompts(plan.batch, plan.words)
    native_rows(engine, prompts, plan.short)  # leaves the prefix store as the timed runs find it
    # Each run ROOFLINE_REPEATS times, alternating, and the fastest of each kept: other work on
    # the machine only ever adds time, and one slow short run made a loaded CPU's smoke step
    # negative.
    longs, shorts = [], []
    for _ in range(ROOFLINE_REPEATS):
        long_results, long_s = timed(lambda: native_rows(engine, prompts, plan.long))
        longs.append(long_s)
        shorts.append(timed(lambda: native_rows(engine, prompts, plan.short))[1])
    step_s = (min(longs) - min(shorts)) / (plan.long - plan.short)
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    mean_length = statistics.mean(r.usage.prompt_tokens for r in long_results)
    mean_length += (plan.short + plan.long - 1) / 2  # over the steps between the two runs
    kv = plan.batch * mean_length * kv_bytes_per_token(engine.model.config, engine.dtype)
    bandwidth, source = card_bandwidth(torch)
    report("roofline", {"step_s": step_s, "weights": weights, "kv": kv, "length": mean_length,
                        "bandwidth": bandwidth, "source": source})  # fmt: skip


def card_bandwidth(torch: Any) -> tuple[float | None, str]:
    """The GPU's memory bandwidth in bytes/s and where it came from; None on a CPU."""
    if not torch.cuda.is_available():
        return None, "no GPU"
    props = torch.cuda.get_device_properties(0)
    sheet = next((b for word, b in DATASHEET_BANDWIDTH.items() if word in props.name), None)
    on_sheet = f"datasheet {sheet / 1e12:.2f} TB/s" if sheet else "not in the datasheet table"
    # torch 2.10 and later; CUDA 13 dropped the clock from cudaDeviceProp, so a build may say 0.
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    derived = 2 * clock_khz * 1000 * bus_bits / 8
    if 1e11 < derived < 2e13:  # anything else is a field misread
        return derived, f"torch device properties: memory clock x bus width x 2; {on_sheet}"
    if sheet:
        return sheet, f"{props.name}'s datasheet figure (torch gives no memory clock)"
    return None, f"unknown for {props.name}"


def native_throughput(report, plan: Plan, engine: Any) -> None:
    prompts = mixed_prompts(plan.rows, plan.words)
    report("running", plan.rows * plan.new_tokens)
    results, seconds = timed(lambda: native_rows(engine, prompts, plan.new_tokens))
    report("NATIVE", (sum(r.usage.completion_tokens for r in results), seconds))


def transformers_engine(plan: Plan, model_dir: str) -> Any:
    """The plan's model loaded as NATIVE loads it (device, dtype, random weights), on the
    attention it was loaded with, for transformers' own generation."""
    from lmpress.engines.local.native.row_attention import own_attention_back

    engine = engine_for(model_dir, "bfloat16", plan.batch, random_weights=True)
    own_attention_back(engine.model)
    return engine


def generate_job(report, plan: Plan, model_dir: str, tiny_dir: str) -> None:
    """transformers' static `generate`: left-padded batches of `plan.batch` chat prompts,
    `min_new_tokens` holding EOS off (native_throughput.raw_generate)."""
    engine = transformers_engine(plan, model_dir)
    prompts = mixed_prompts(plan.rows, plan.words)
    raw_generate(engine, prompts[: plan.batch], plan.batch, 2)  # warm up
    report("running", plan.rows * plan.new_tokens)
    tokens, seconds = timed(lambda: raw_generate(engine, prompts, plan.batch, plan.new_tokens))
    report("generate", (tokens, seconds))


def generate_batch_job(report, plan: Plan, model_dir: str, tiny_dir: str) -> None:
    """transformers' continuous batching over every row at once, at most `plan.batch` in a
    batch, EOS off (-1), its manager kept from a first call over the same rows to the second,
    timed one."""
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    engine = transformers_engine(plan, model_dir)
    tokenizer, model = engine.hf_tokenizer, engine.model
    inputs = [
        list(tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                           add_generation_prompt=True, return_dict=True)["input_ids"])
        for p in mixed_prompts(plan.rows, plan.words)
    ]  # fmt: skip
    sizes: dict[str, Any] = {}
    if not torch.cuda.is_available():
        # On a CPU it sizes its cache and its batches by the machine's memory (14.7 GB for the
        # tiny model on a 24 GiB machine; transformers 5.17 given only the blocks was killed
        # for memory): give it the blocks its rows in flight need and the smallest batches.
        longest = max(len(ids) for ids in inputs) + plan.new_tokens
        sizes["num_blocks"] = plan.batch * (longest // 256 + 1) + 1
        sizes["max_batch_tokens"] = 256
    cb = ContinuousBatchingConfig(max_requests_per_batch=plan.batch, **sizes)
    greedy = GenerationConfig(max_new_tokens=plan.new_tokens, do_sample=False, eos_token_id=-1,
                              pad_token_id=tokenizer.pad_token_id)  # fmt: skip

    # It warns that a kept manager was sized for the rows it was first given: they are these.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)

    def work() -> int:
        out = model.generate_batch(inputs, generation_config=greedy,
                                   continuous_batching_config=cb, persistent_manager=True)  # fmt: skip
        return sum(len(o.generated_tokens) for o in out.values())

    report("running", plan.rows * plan.new_tokens)
    report("generate_batch first", timed(work))
    report("running", plan.rows * plan.new_tokens)
    report("generate_batch", timed(work))


# --- processes with deadlines


def failure(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1:]
    place = f" ({where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}{place}"


def _child(job: Callable, args: tuple, conn: Any) -> None:
    try:
        job(lambda key, value: conn.send((key, value)), *args)
    except BaseException as exc:  # shown by the parent
        conn.send(("error", failure(exc)))
    conn.send(("done", None))


def in_own_process(name: str, job: Callable, args: tuple, deadline_s: float) -> dict[str, Any]:
    """Run `job(report, *args)` in a fresh process (spawned: CUDA and OpenMP start clean, as
    rounds.SideProcess's sides do) and gather what it reports until it ends or its deadline
    passes; then it is killed, and `timed_out` holds the tokens it had planned and the seconds
    since it started on them."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(job, args, send), daemon=True)
    started = time.monotonic()
    process.start()
    send.close()
    figures: dict[str, Any] = {}
    running_since = started
    while True:
        left = started + deadline_s - time.monotonic()
        if left <= 0 or not receive.poll(left):
            figures["timed_out"] = (figures.get("running", 0), time.monotonic() - running_since)
            process.kill()
            break
        try:
            key, value = receive.recv()
        except EOFError:  # it died without a word
            process.join(10)
            figures["error"] = f"its process ended (exit code {process.exitcode})"
            break
        if key == "done":
            break
        if key == "running":
            running_since = time.monotonic()
        figures[key] = value
        print(f"{name}: {key} {value}", flush=True)
    process.join(10)
    print(f"{name}: {time.monotonic() - started:.1f} s in all", flush=True)
    return figures


# --- the table


@dataclass(frozen=True)
class Rate:
    """A side's tokens/s: measured, or at most `tokens_s` where its process missed its
    deadline (`bound`), or none; `how` says which."""

    tokens_s: float | None
    how: str
    bound: bool = False

    def text(self) -> str:
        return fmt(self.tokens_s, ",.0f") if not self.bound else f"< {self.tokens_s:,.0f}"

    def over(self, other: Rate) -> str:
        """This rate over `other`, as a ratio or a bound on one."""
        if self.tokens_s is None or other.tokens_s is None or (self.bound and other.bound):
            return "n/a"
        sign = "< " if self.bound else "> " if other.bound else ""
        return f"{sign}{self.tokens_s / other.tokens_s:.2f}x"


def rate(figures: dict[str, Any], key: str) -> Rate:
    """A side's rate on its `key` run (see Rate), from what its process reported."""
    if key in figures:
        tokens, seconds = figures[key]
        return Rate(tokens / seconds, f"{tokens:,} tokens in {seconds:.2f} s")
    planned, seconds = figures.get("timed_out", (0, 0.0))
    if planned:
        how = f"not done {seconds:.0f} s into {planned:,} tokens (deadline)"
        return Rate(planned / seconds, how, bound=True)
    return Rate(None, why(figures, key))


def why(figures: dict[str, Any], *stages: str) -> str:
    """Why a figure is missing: the first error of these stages, its process's, or its
    deadline."""
    errors = [figures[f"{stage} error"] for stage in stages if f"{stage} error" in figures]
    return (errors or [figures.get("error") or "not run (deadline)"])[0]


def table_rows(plan: Plan, native: dict, batched: dict, static: dict) -> list[tuple[str, ...]]:
    work = f"{plan.rows} rows x {plan.new_tokens} new tokens, {plan.batch} in flight"
    ours = rate(native, "NATIVE")
    rows = [("NATIVE tok/s", ours.text(), "", f"{work}; {ours.how}")]
    first, batched_rate = rate(batched, "generate_batch first"), rate(batched, "generate_batch")
    if first.bound or first.tokens_s is None:  # its first call did not end
        batched_rate, how = first, f"first call; {first.how}"
    else:
        how = f"second call; {batched_rate.how}; the first, with its set-up: {first.text()} tok/s"
    rows.append(("generate_batch tok/s", batched_rate.text(), "", how))
    static_rate = rate(static, "generate")
    how = f"static left-padded batches of {plan.batch}; {static_rate.how}"
    rows.append(("generate tok/s", static_rate.text(), "", how))
    rows.append(("NATIVE / generate_batch", ours.over(batched_rate), ">= 2", "tokens/s over tokens/s"))  # fmt: skip
    rows.append(("NATIVE / generate", ours.over(static_rate), "", "tokens/s over tokens/s"))
    rows += roofline_rows(plan, native)
    equal = native.get("equality")
    how = (
        f"tiny:{plan.tiny}, float32, {plan.equal_tokens} new tokens, NATIVE's rows in one batch "
        "against generate on each prompt alone"
    )
    if equal:
        value = f"{equal['equal']}/{equal['rows']} rows"
        if equal["first_apart"]:
            how += f"; the other rows first differ at tokens {equal['first_apart']}"
    else:
        value = "n/a"
        how += "; " + why(native, "equality")
    rows.append(("greedy equality", value, f"{plan.equal_rows}/{plan.equal_rows} rows", how))
    return rows


def roofline_rows(plan: Plan, native: dict) -> list[tuple[str, ...]]:
    found = native.get("roofline")
    if not found:
        missing = why(native, "roofline", "NATIVE")
        return [
            ("decode step", "n/a", "", missing),
            ("bytes a step", "n/a", "", missing),
            ("roofline share", "n/a", ">= 50%", missing),
        ]
    read, card = found["weights"] + found["kv"], found["bandwidth"]
    # A step of zero or less is no step time: the two runs could not tell it from noise.
    step = found["step_s"] if found["step_s"] > 0 else None
    speed = read / step if step else None
    share = speed / card if speed and card else None
    timing = (
        f"{plan.batch} rows: (time of {plan.long} new tokens a row - of {plan.short}) / "
        f"{plan.long - plan.short} steps"
    )
    if step is None:
        timing += (
            ": the longer runs were no slower than the shorter ones, which is noise (a busy "
            "machine); run it again"
        )
    parts = (
        f"weights {amount(found['weights'])} + KV {amount(found['kv'])} ({plan.batch} rows at "
        f"their mean length {found['length']:.0f})"
    )
    against = f"{fmt(speed and speed / 1e12, '.3f', ' TB/s')} of "
    against += f"{card / 1e12:.2f} TB/s" if card else "a bandwidth unknown"
    return [
        ("decode step", fmt(step and step * 1000, ".2f", " ms"), "", timing),
        ("bytes a step", amount(read), "", parts),
        ("roofline share", fmt(share and share * 100, ".1f", "%"), ">= 50%",
         f"{against} ({found['source']})"),
    ]  # fmt: skip


def fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def amount(size: float) -> str:
    return f"{size / 1e9:.3f} GB" if size >= 1e8 else f"{size / 1e6:.3f} MB"


def markdown(rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    import torch

    from lmpress.builtin_models.tiny import tiny_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the CPU smoke run, even on a GPU")
    parser.add_argument("--rows", type=int, help="rows on each side (256 on a GPU)")
    parser.add_argument("--new-tokens", type=int, help="new tokens a row (256 on a GPU)")
    parser.add_argument(
        "--deadline", type=float, metavar="SECONDS",
        help="each process's deadline, in place of the plan's (180, 120 and 100 s on a GPU)",
    )  # fmt: skip
    args = parser.parse_args()
    plan = SMOKE if args.smoke or not torch.cuda.is_available() else GPU
    plan = replace(plan, rows=args.rows or plan.rows, new_tokens=args.new_tokens or plan.new_tokens)
    if args.deadline is not None:
        plan = replace(plan, deadlines=dict.fromkeys(plan.deadlines, args.deadline))
    started = time.monotonic()
    tiny_dir = str(tiny_model(plan.tiny))  # built once and cached (LMPRESS_CACHE)
    model_dir = tempfile.mkdtemp(prefix="lmpress-gpu-check-")
    try:
        params = write_model(plan, tiny_dir, model_dir)
        print(f"{plan.name} run: tiny:{plan.tiny} and the model's config ready in "
              f"{time.monotonic() - started:.1f} s", flush=True)  # fmt: skip
        work = (plan, model_dir, tiny_dir)
        native = in_own_process("NATIVE", native_job, work, plan.deadlines["NATIVE"])
        batched = in_own_process("generate_batch", generate_batch_job, work, plan.deadlines["generate_batch"])  # fmt: skip
        static = in_own_process("generate", generate_job, work, plan.deadlines["generate"])
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    print(
        f"\nGPU check ({plan.name}) on {native.get('device', 'an unknown device')}: Llama "
        f"{plan.layers} layers x {plan.hidden}, {params / 1e6:,.1f}M parameters, random weights, "
        f"bfloat16, vocabulary of tiny:{plan.tiny}'s tokenizer; EOS held off; "
        f"{time.monotonic() - started:.0f} s in all\n"
    )
    print(markdown(table_rows(plan, native, batched, static)), flush=True)


if __name__ == "__main__":
    main()
