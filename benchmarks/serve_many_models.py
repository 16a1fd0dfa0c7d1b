"""What switching between models costs `lmpress serve`, and what loading one costs.

One server (its own process) holds three copies of SmolLM2-135M (the `smollm2` recipe,
LLAMACPP, or NATIVE with --engine NATIVE) as "a", "b" and "c", at most two loaded
(`--max-loaded-models 2`). A client sends one request at a time (greedy, the same prompts
and max_tokens; the copies are one model, so both orders generate the same replies):

1. switching: the same requests all to "a", then alternating "a", "b", "a", "b"...; the two
   orders alternate over rounds and the median ratio (alternating / one model) is reported.
   Both models are loaded (and warmed) first, so a switch is only a change of name.
2. loading: the first request to "c", which loads it (unloading the least recently used),
   against a request to a loaded model; and the load time the server logs.

    python benchmarks/serve_many_models.py
    python benchmarks/serve_many_models.py --requests 32 --max-new-tokens 32 --rounds 4
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

from serve_throughput import prompts, start_server

LOADED = re.compile(r"model '(\w+)' loaded in ([\d.]+)s")


def timed(client, model: str, text: str, max_tokens: int) -> float:
    started = time.perf_counter()
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        temperature=0,
    )  # fmt: skip
    return time.perf_counter() - started


def run(client, order: list[str], texts: list[str], max_tokens: int) -> float:
    return sum(
        timed(client, model, text, max_tokens) for model, text in zip(order, texts, strict=True)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="LLAMACPP", choices=("LLAMACPP", "NATIVE"))
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    from openai import OpenAI

    # smollm2 is LLAMACPP's recipe; NATIVE's is tiny-native's with SmolLM2 named
    recipe = "smollm2" if args.engine == "LLAMACPP" else "tiny-native"
    models = [arg for name in "abc" for arg in ("--model", f"{name}={recipe}")]
    settings = [*models, "--max-loaded-models", "2", "--engine", args.engine,
                "--model.model_name", "smollm2:135m-instruct"]  # fmt: skip
    proc, url, log = start_server(settings)
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        texts = prompts(args.requests)
        for model in ("a", "b"):  # loaded and warmed
            run(client, [model] * 2, texts[:2], args.max_new_tokens)
        one, alternating = ["a"] * len(texts), ["ab"[i % 2] for i in range(len(texts))]
        ratios = []
        for round_ in range(1, args.rounds + 1):
            orders = [("one", one), ("alternating", alternating)]
            seconds = {}
            for what, order in orders if round_ % 2 else orders[::-1]:
                seconds[what] = run(client, order, texts, args.max_new_tokens)
            ratios.append(seconds["alternating"] / seconds["one"])
            print(f"round {round_}: one model {seconds['one']:.3f} s, alternating "
                  f"{seconds['alternating']:.3f} s, ratio {ratios[-1]:.3f}", flush=True)  # fmt: skip
        print(f"switching: alternating / one model = {statistics.median(ratios):.3f} "
              f"(median of {len(ratios)} rounds of {len(texts)} requests; 1.0 costs nothing)")  # fmt: skip

        warm = statistics.median(timed(client, "b", t, args.max_new_tokens) for t in texts[:5])
        first = timed(client, "c", texts[0], args.max_new_tokens)
        time.sleep(0.5)  # the log line's reader
        loads = {m.group(1): float(m.group(2)) for line in log if (m := LOADED.search(line))}
        unloaded = [line.split("model ")[1].strip() for line in log if "unloaded" in line]
        print(f"loading a third: first request to 'c' {first:.2f} s against {warm:.3f} s to a "
              f"loaded model; the server logs 'c' loaded in {loads.get('c', float('nan')):.2f} s "
              f"({', '.join(unloaded)})")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
