"""LLAMACPP engine throughput against llama-cpp-python's `create_chat_completion`, in one run.

Both sides load the same random-weight GGUF of ~100M parameters (built locally by
lmpress.builtin_models.tiny_gguf), with the same context size and thread counts, and answer the same chat
prompts greedily with the same number of new tokens each, EOS held off on both sides (lmpress:
generation.min_tokens; llama-cpp-python: a -inf logit bias on EOS). `--eos` honours EOS on
both sides instead, so rows finish at different lengths; each side counts the tokens it
actually generated (usage.completion_tokens). The baseline is what a tool
built on llama-cpp-python does for a batch job: one `create_chat_completion` call per prompt.
Each side runs in a process of its own, loaded once, as users run them (two llama.cpp OpenMP
thread teams in one process slow each other down on a machine with few cores; see
rounds.SideProcess). Rounds alternate between the two so machine noise hits both alike (see
benchmarks/rounds.py for the two ratios printed).

    .venv/bin/python benchmarks/llamacpp_throughput.py [--prompts 32] [--new-tokens 64]
        [--batch-size 32] [--rounds 3] [--threads N] [--flash-attn on|off] [--raw] [--eos]
        [--model tiny-gguf:bench-100m | tiny-gguf:bench-100m-q8 | tiny-gguf:bench-100m-f32
                 | smollm2:135m-instruct | PATH]

Both sides get the same `Llama` settings: llama-cpp-python's defaults plus n_ctx, threads and
flash attention (on by default, as llama.cpp and lmpress have it; llama-cpp-python's own default
is off). Besides tokens/s, tokens per CPU-second of each side's process are printed.

`--raw` adds a third side, a bare llama.cpp loop over the same context and prompts: what
batched decoding itself reaches on this machine, so that lmpress's overhead over it and the
ceiling on the ratio are measured too. On a CPU, decoding many sequences at once is
compute-bound: the ratio is capped by how much faster the machine multiplies a batch of rows
than one row, whatever the engine.
"""

from __future__ import annotations

import argparse
import os

from rounds import Rounds, SideProcess, lmpress_generate, mixed_prompts

from lmpress.configs import load_config
from lmpress.engines.local.llamacpp.loading import gguf_path, load_llama
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.types import GenerationParams, Message, Request


def baseline(llm, prompts: list[str], new_tokens: int, eos: bool = False) -> int:
    """One create_chat_completion call per prompt, as row-by-row batch jobs do."""
    no_eos = None if eos else {llm.token_eos(): float("-inf")}
    produced = 0
    for prompt in prompts:
        reply = llm.create_chat_completion(
            [{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=new_tokens,
            logit_bias=no_eos,
        )
        # Its count leaves out the EOS it sampled; lmpress's and transformers' count it.
        produced += reply["usage"]["completion_tokens"]
        produced += reply["choices"][0]["finish_reason"] == "stop"
    return produced


def lmpress_config(path: str, kwargs: dict, batch_size: int):
    return load_config(
        overrides={
            "engine": "LLAMACPP",
            "model.model_name": path,
            "model.model_kwargs": kwargs,
            "generation.batch_size": batch_size,
        }
    )


def describe(path: str) -> str:
    """Parameter count and weight types of a GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)
    count = sum(int(t.n_elements) for t in reader.tensors)
    types = sorted({t.tensor_type.name for t in reader.tensors if len(t.shape) > 1})
    return f"{count / 1e6:.0f}M parameters, {'/'.join(types)} weights"


def build_baseline(path: str, kwargs: dict, prompts: list[str], new_tokens: int, eos: bool):
    """llama-cpp-python's side, in its own process: load, warm up, return the timed work.
    It loads as lmpress does on this CPU (a build with AMX kernels crashes on quantized weights
    otherwise; see lmpress.engines.local.llamacpp.loading.extra_bufts_are_safe)."""
    llm = load_llama(path, {"verbose": False, **kwargs})
    baseline(llm, prompts[:1], 2)  # first-call allocations, page faults on the weights
    return lambda: baseline(llm, prompts, new_tokens, eos)


def build_lmpress(config, prompts: list[str], new_tokens: int, eos: bool):
    """lmpress's side, in its own process: load, warm up, return the timed work."""
    engine = create_engine(config)
    warm_up = engine.generate(prompts, GenerationParams(max_new_tokens=1))
    print(f"{sum(r.usage.prompt_tokens for r in warm_up)} prompt tokens", flush=True)
    return lambda: lmpress_generate(engine, prompts, new_tokens, eos)


def build_raw(config, prompts: list[str], new_tokens: int):
    """The ceiling: the same prompts through a bare llama.cpp loop on the engine's own context
    (each prompt read in a batch of its own, then every sequence one token a step in one
    batch, greedy by argmax), with none of lmpress's scheduling, sampling chains or text."""
    import llama_cpp as lc
    import numpy as np

    # The engine only tokenizes and lends its context: its worker thread never decodes here,
    # or its OpenMP threads would compete with this thread's (see rounds.SideProcess).
    engine = create_engine(config)
    ids = [engine.encode(Request(str(i), [Message("user", p)])) for i, p in enumerate(prompts)]
    ctx, n_vocab = engine.scheduler._ctx.ctx, engine.n_vocab
    memory = lc.llama_get_memory(ctx)
    batch = lc.llama_batch_init(max(len(ids), max(map(len, ids))), 0, 1)

    def decode(tokens: list[tuple[int, int, int, bool]]) -> None:
        for i, (token, pos, seq, logits) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens = len(tokens)
        assert lc.llama_decode(ctx, batch) == 0

    def argmax(index: int) -> int:
        logits = lc.llama_get_logits_ith(ctx, index)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(n_vocab,))))

    def work(new_tokens: int = new_tokens) -> int:
        assert len(ids) <= engine.batch_size, "the raw loop runs every prompt at once"
        next_tokens, positions = [], []
        for seq, prompt in enumerate(ids):
            decode([(t, j, seq, j == len(prompt) - 1) for j, t in enumerate(prompt)])
            next_tokens.append(argmax(-1))
            positions.append(len(prompt))
        for _ in range(new_tokens - 1):
            decode([(t, positions[seq], seq, True) for seq, t in enumerate(next_tokens)])
            next_tokens = [argmax(seq) for seq in range(len(ids))]
            positions = [p + 1 for p in positions]
        for seq in range(len(ids)):
            lc.llama_memory_seq_rm(memory, seq, -1, -1)
        return len(ids) * new_tokens

    work(2)  # warm up
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-gguf:bench-100m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--flash-attn", choices=["on", "off"], default="on")
    parser.add_argument(
        "--raw", action="store_true", help="also time a bare llama.cpp loop: the ceiling"
    )
    parser.add_argument(
        "--eos", action="store_true", help="honour EOS: rows stop at different lengths"
    )
    parser.add_argument(
        "--no-extra-bufts",
        action="store_true",
        help="also time lmpress with llama.cpp's extra weight buffers (CPU repack) off: what "
        "the AMX crash avoidance would cost if it were applied on every CPU",
    )
    args = parser.parse_args()
    if args.eos and args.raw:
        parser.error("--raw runs every row to --new-tokens; it does not take --eos")

    path = gguf_path(args.model)  # a tiny-gguf: name is built here, before anything is timed
    kwargs = {
        "n_ctx": args.n_ctx,
        "n_threads": args.threads,
        "n_threads_batch": args.threads,
        "flash_attn": args.flash_attn == "on",
    }
    config = lmpress_config(path, kwargs, args.batch_size)
    prompts = mixed_prompts(args.prompts, max_words=40)
    # Each side in a process of its own, as users run them (see rounds.SideProcess).
    sides = [
        SideProcess(
            "llama-cpp-python", build_baseline, path, kwargs, prompts, args.new_tokens, args.eos
        ),
        SideProcess("lmpress", build_lmpress, config, prompts, args.new_tokens, args.eos),
    ]
    if args.raw:
        sides.append(SideProcess("raw llama.cpp", build_raw, config, prompts, args.new_tokens))
    if args.no_extra_bufts:
        plain = lmpress_config(path, {**kwargs, "use_extra_bufts": False}, args.batch_size)
        sides.append(
            SideProcess("no extra bufts", build_lmpress, plain, prompts, args.new_tokens, args.eos)
        )
    rounds = Rounds()
    for round_no in range(1, args.rounds + 1):
        for side in sides:
            rounds.run_side(round_no, side)
    for side in sides:
        side.close()
    print(
        f"\nmodel {args.model} ({describe(path)}), {args.prompts} prompts, "
        f"{'at most ' if args.eos else ''}{args.new_tokens} new tokens each "
        f"(EOS {'honoured' if args.eos else 'held off'}), batch {args.batch_size}, {args.threads} threads, n_ctx {args.n_ctx}, flash_attn "
        f"{args.flash_attn}"
    )
    print(f"llama-cpp-python create_chat_completion: {rounds.best('llama-cpp-python'):.1f} tok/s")
    print(f"lmpress LLAMACPP:                        {rounds.best('lmpress'):.1f} tok/s")
    rounds.report("lmpress", "llama-cpp-python")
    if args.raw:
        print(f"raw llama.cpp batched loop:              {rounds.best('raw llama.cpp'):.1f} tok/s")
        rounds.report("lmpress", "raw llama.cpp")
        rounds.report("raw llama.cpp", "llama-cpp-python")
    if args.no_extra_bufts:
        print(f"lmpress, extra buffers off:              {rounds.best('no extra bufts'):.1f} tok/s")
        rounds.report("lmpress", "no extra bufts")


if __name__ == "__main__":
    main()
