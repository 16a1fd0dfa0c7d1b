"""What one NATIVE decoding step costs by its shape: 16 rows after the workload's first 16
prompts, each step carrying a given number of tokens a row (plain, padded-like, ragged), timed
around the scheduler's own forward pass in this process. The figures behind
native/speculation.STEP_COST and WIDEN; the median of `--repeats` after one warm-up round.

    .venv/bin/python benchmarks/step_shapes.py [--workload chat|copy] [--repeats 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

from rounds import chat_prompts, copy_prompts

from lmpress.configs import load_config
from lmpress.engines.local.native.batch_cache import BatchCache
from lmpress.engines.registry import create_engine

SHAPES = {
    "1 a row": [1] * 16,
    "2 in one row": [2] + [1] * 15,
    "5 in one row": [5] + [1] * 15,
    "2 a row": [2] * 16,
    "5 in 4 rows": [5] * 4 + [1] * 12,
    "3 in 8 rows": [3] * 8 + [1] * 8,
    "3 a row": [3] * 16,
    "5 a row": [5] * 16,
}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["copy", "chat"], default="chat")
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()

    config = load_config(
        overrides={"model.model_name": "smollm2:135m-instruct", "generation.batch_size": 16}
    )
    engine = create_engine(config)
    scheduler, tokenizer = engine.scheduler, engine.hf_tokenizer
    prompts = (copy_prompts if args.workload == "copy" else chat_prompts)(16)
    timings: dict[str, list[float]] = {name: [] for name in SHAPES}
    with torch.inference_mode():
        caches = []
        for prompt in prompts:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True
            )
            ids = ids if isinstance(ids, list) else ids["input_ids"]
            caches.append(scheduler._prefill(list(ids))[0])
        scheduler._batch = BatchCache()
        scheduler._batch.join(caches, [1024] * len(caches))
        for repeat in range(args.repeats + 1):
            for name, widths in SHAPES.items():
                start = time.perf_counter()
                scheduler._forward([[100] * n for n in widths])  # rows keep none of them
                if repeat:
                    timings[name].append(1000 * (time.perf_counter() - start))
    lengths = scheduler._batch.lengths
    print(f"16 rows after {args.workload} prompts of {min(lengths)} to {max(lengths)} tokens")
    for name, widths in SHAPES.items():
        median = statistics.median(timings[name])
        print(f"{name:14s} {sum(widths):3d} tokens  {median:6.1f} ms")


if __name__ == "__main__":
    main()
