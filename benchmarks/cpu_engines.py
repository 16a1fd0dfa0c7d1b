"""Which engine to pick on a CPU: raw vLLM (CPU build), lmpress VLLM, NATIVE and LLAMACPP on
one chat workload, each side in a process of its own.

The workload is vllm_check.py's: `--rows` mixed chat conversations, greedy, at most
`--max-new-tokens` new tokens a row, EOS honoured, `--in-flight` rows decoded together
(vLLM's `max_num_seqs` on the vLLM sides, `generation.batch_size` on NATIVE and LLAMACPP).
The sides:

- vllm: raw `vllm.LLM(...).chat(all rows)` (vllm_check.run_raw), in the vLLM venv;
- VLLM: `run_batch` on lmpress's VLLM engine (AsyncLLM), in the vLLM venv;
- NATIVE: `run_batch` on NATIVE, the same dequantized SmolLM2 (transformers), in the main venv;
- LLAMACPP F16 and Q4_1: `run_batch` on LLAMACPP over the F16 GGUF (`smollm2:135m-instruct`)
  and the shipped Q4_1 file (`smollm2:135m-instruct-q4_1`), lmpress's defaults otherwise.

A side named with `+ngram` (`vllm+ngram`, `VLLM+ngram`, `NATIVE+ngram`, `LLAMACPP-F16+ngram`)
decodes speculatively by prompt lookup: `model.speculative_method: ngram` on lmpress's sides,
the same settings as vLLM's `speculative_config` on raw vLLM. One with `+draft`
(`NATIVE+draft`, `LLAMACPP-F16+draft`) drafts with `--draft-model` (`model.draft_model`). `--workload copy` swaps the chat
rows for rows whose replies copy their prompts (rounds.copy_prompts: fix the typos in a
paragraph, or pull fields out of it).

A `LLAMACPP-F16+shared` side shares one KV cache among its sequences (`model_kwargs.kv_unified`,
as the bundled smollm2 recipe does). `--against CHECKOUT` adds, after each of lmpress's sides, the same side run with another
checkout's lmpress (named `SIDE@before`), and the table gives each side's median ratio to it,
round by round: a change measured against the code before it, in the same run.

Both vLLM sides get the same engine arguments: `--dtype` (float32 by default, lmpress's `auto`
on a CPU; NATIVE gets it too), eager unless `--vllm-mode compiled` (vLLM's own default),
`max_num_seqs`; `VLLM_CPU_KVCACHE_SPACE` defaults to 2 (GiB). Only generation is timed, not
loading. A side counts the tokens each row generated, EOS included. Each round runs the sides
in turn, the next round in reverse order, so drift in the machine's load spreads over them;
the table gives each side's median tok/s and the median of its per-round ratios to raw vLLM.
Peak RSS is the most the side's process tree (vLLM's engine core included) held at once,
sampled every 0.2 s over the whole run, loading included.

    python benchmarks/cpu_engines.py [--rows 64] [--max-new-tokens 256] [--in-flight 16]
        [--rounds 2] [--vllm-python .venv-vllm/bin/python] [--sides vllm,VLLM,NATIVE,...]
        [--workload chat|copy] [--dtype float32|bfloat16] [--vllm-mode eager|compiled]
        [--native-compile] [--draft-model PATH] [--against CHECKOUT]

Run it with the main venv's Python; the vLLM sides run with `--vllm-python`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from vllm_check import conversations, run_raw

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2:135m-instruct"
SIDES = {  # side: (engine, model, runs in the vLLM venv)
    "vllm": ("raw vLLM", MODEL, True),
    "VLLM": ("VLLM", MODEL, True),
    "NATIVE": ("NATIVE", MODEL, False),
    "LLAMACPP-F16": ("LLAMACPP", MODEL, False),
    "LLAMACPP-Q4_1": ("LLAMACPP", "smollm2:135m-instruct-q4_1", False),
}


SPECULATION = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
               "prompt_lookup_max": 4}  # fmt: skip
WORKLOADS = ("chat", "copy")
BEFORE = "@before"  # a side run with `--against`'s checkout


def lmpress_side(side: str) -> bool:
    return side_parts(side)[0] != "vllm"


def side_parts(side: str) -> tuple[str, bool]:
    """A side's base name, and whether it decodes speculatively by prompt lookup (`+ngram`);
    `+draft` is its draft model's (`draft_side`)."""
    base, _, spec = side.partition("+")
    return base, spec == "ngram"


def draft_side(side: str) -> bool:
    """Whether a side drafts with `--draft-model` (`+draft`, lmpress's sides only)."""
    return side.partition("+")[2] == "draft"


def vllm_args(args: argparse.Namespace, speculative: bool = False) -> dict:
    engine_args = {"dtype": args.dtype, "max_num_seqs": args.in_flight}
    if args.vllm_mode == "eager":
        engine_args["enforce_eager"] = True
    if speculative:
        engine_args["speculative_config"] = dict(SPECULATION)
    return engine_args


def rows_of(workload: str, rows: int) -> list[list[dict]]:
    """The conversations a workload sends: vllm_check's chat rows, or rows whose replies copy
    their prompts."""
    if workload == "chat":
        return conversations(rows)
    from rounds import copy_prompts

    return [[{"role": "user", "content": text}] for text in copy_prompts(rows, seed=0)]


def run_lmpress(side: str, args: argparse.Namespace) -> dict:
    """`lmpress batch` in process: run_batch over a JSONL of the conversations."""
    from lmpress.batch import BatchOptions, run_batch
    from lmpress.cli.report import BatchReport
    from lmpress.configs import load_config
    from lmpress.engines.registry import create_engine

    base, speculative = side_parts(side)
    engine_name, model, _ = SIDES[base]
    overrides = {
        "model.model_name": model,
        "generation.max_new_tokens": args.max_new_tokens,
        "generation.temperature": 0.0,
        "generation.batch_size": args.in_flight,
    }
    if speculative:
        overrides["model.speculative_method"] = "ngram"
    if side.partition("+")[2] == "shared":  # LLAMACPP's KV cache shared by its sequences
        overrides["model.model_kwargs"] = {"kv_unified": True}
    if draft_side(side):
        if not args.draft_model:
            raise SystemExit(f"--sides {side}: give --draft-model")
        overrides["model.draft_model"] = args.draft_model
    if engine_name == "VLLM":
        from lmpress.engines.local.vllm.translate import model_directory

        overrides["model.model_name"] = model_directory(model, "model")
        overrides["model.model_kwargs"] = vllm_args(args)
        overrides["model.torch_dtype_str"] = args.dtype
    if engine_name == "NATIVE":
        overrides["model.torch_dtype_str"] = args.dtype
        overrides["model.compile"] = args.native_compile
    config = load_config(None, overrides, engine=engine_name)
    engine = create_engine(config)
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        with source.open("w") as f:
            for i, messages in enumerate(rows_of(args.workload, args.rows)):
                f.write(json.dumps({"id": str(i), "messages": messages}) + "\n")

        async def go():
            try:
                # Every run generates: the response cache (on by default in a batch) would answer a
                # rerun of the same rows without the engine.
                options = BatchOptions(str(source), str(target), cache="off")
                return await run_batch(
                    config, options, engine=engine, events=BatchReport(bar=False)
                )
            finally:
                await engine.aclose()

        summary = asyncio.run(go())
    return {"tokens": summary.completion_tokens, "wall_s": summary.wall_s,
            "failed": summary.rows_failed}  # fmt: skip


def run_here(side: str, args: argparse.Namespace) -> dict:
    base, speculative = side_parts(side)
    if base == "vllm":
        from lmpress.engines.local.vllm.translate import model_directory

        out = run_raw(model_directory(SIDES[base][1], "model"), args.rows, args.max_new_tokens,
                      vllm_args(args, speculative), False,
                      rows_of(args.workload, args.rows))  # fmt: skip
        return {"tokens": out["completion_tokens"], "wall_s": out["wall_s"], "failed": 0}
    return run_lmpress(side, args)


def peak_rss(pid: int, done: threading.Event, peak: list[int]) -> None:
    """The largest total RSS of process `pid` and its descendants, sampled until `done`."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not done.wait(0.2):
        total = 0
        try:
            for proc in [root, *root.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            return
        peak[0] = max(peak[0], total)


def run_side(side: str, args: argparse.Namespace) -> dict:
    side, before = side.removesuffix(BEFORE), side.endswith(BEFORE)
    python = args.vllm_python if SIDES[side_parts(side)[0]][2] else sys.executable
    command = [python, __file__, "--only", side, "--rows", str(args.rows),
               "--max-new-tokens", str(args.max_new_tokens), "--in-flight", str(args.in_flight),
               "--workload", args.workload, "--dtype", args.dtype, "--vllm-mode", args.vllm_mode]  # fmt: skip
    if args.native_compile:
        command.append("--native-compile")
    if args.draft_model:
        command += ["--draft-model", args.draft_model]
    checkout = args.against if before else REPO
    env = {**os.environ, "VLLM_LOGGING_STREAM": "ext://sys.stderr",
           "PYTHONPATH": f"{checkout}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    load = os.getloadavg()[0]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)  # fmt: skip
    done, peak = threading.Event(), [0]
    watcher = threading.Thread(target=peak_rss, args=(proc.pid, done, peak), daemon=True)
    watcher.start()
    stdout, _ = proc.communicate()
    done.set()
    watcher.join()
    lines = stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        sys.exit(f"cpu_engines: the {side} run failed (exit code {proc.returncode})")
    result = json.loads(lines[-1])
    result.update(peak_mib=peak[0] / 2**20, load=(load + os.getloadavg()[0]) / 2)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--workload", choices=WORKLOADS, default="chat")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--vllm-mode", choices=("eager", "compiled"), default="eager")
    parser.add_argument("--native-compile", action="store_true")
    parser.add_argument("--draft-model", help="the draft model of the +draft sides")
    parser.add_argument("--against", help="another checkout whose lmpress sides run beside these")
    parser.add_argument("--only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_here(args.only, args)))
        return 0
    sides = args.sides.split(",")
    if unknown := [s for s in sides if side_parts(s)[0] not in SIDES]:
        parser.error(f"--sides: unknown {unknown}; choose from {', '.join(SIDES)}, each "
                     f"with +ngram, +draft or neither")  # fmt: skip
    if args.against:
        sides = [s for side in sides for s in (side, side + BEFORE)[: 1 + lmpress_side(side)]]
    print(f"{args.rows} {args.workload} rows, at most {args.max_new_tokens} new tokens, greedy, "
          f"EOS honoured, {args.in_flight} in flight; {args.dtype}, vLLM sides {args.vllm_mode}, "
          f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE', '2')}", flush=True)  # fmt: skip
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for round_ in range(1, args.rounds + 1):
        for side in sides if round_ % 2 else sides[::-1]:
            r = run_side(side, args)
            runs[side].append(r)
            print(f"round {round_} {side:14} {r['tokens']:>6} tokens {r['wall_s']:7.1f} s "
                  f"{r['tokens'] / r['wall_s']:7.1f} tok/s  peak RSS {r['peak_mib']:6.0f} MiB  "
                  f"load {r['load']:.1f}" + (f"  FAILED ROWS {r['failed']}" if r["failed"] else ""),
                  flush=True)  # fmt: skip
    print(
        f"\n| side | tok/s (median of {args.rounds}) | rounds | / raw vLLM | / before | peak RSS |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for side in sides:
        rates = [r["tokens"] / r["wall_s"] for r in runs[side]]
        ratio = "n/a"
        if "vllm" in runs:
            per_round = [
                a / (b["tokens"] / b["wall_s"]) for a, b in zip(rates, runs["vllm"], strict=True)
            ]
            ratio = f"{statistics.median(per_round):.2f}"
        against = "n/a"
        if side + BEFORE in runs:
            olds = [r["tokens"] / r["wall_s"] for r in runs[side + BEFORE]]
            against = f"{statistics.median(a / b for a, b in zip(rates, olds, strict=True)):.3f}"
        peak = max(r["peak_mib"] for r in runs[side])
        print(f"| {side} | {statistics.median(rates):.1f} | "
              f"{', '.join(f'{x:.1f}' for x in rates)} | {ratio} | {against} | {peak:.0f} MiB |")  # fmt: skip
    loads = [r["load"] for side in sides for r in runs[side]]
    print(f"load average {min(loads):.1f} to {max(loads):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
