"""vLLM's own answers, for the real-vLLM tests to compare lmpress with.

    python raw_vllm.py CASES.json OUT.json

CASES.json: {"model": DIR, "engine_args": {...}, "chat": [{"messages": [...], "sampling":
{...}}], "generate": [{"prompt": "...", "sampling": {...}}]}. Each "sampling" is vLLM's
SamplingParams keyword arguments, written by hand in the test (never made by lmpress's own
translation), with `structured_outputs` as StructuredOutputsParams' keyword arguments.
`vllm.LLM(model=DIR, **engine_args)` answers the chat cases with `LLM.chat` and the prompts with
`LLM.generate`, each list in one call, "beam_search" (a prompt and BeamSearchParams' keyword
arguments a case) with `LLM.beam_search`, "embed" (a list of texts) with `LLM.embed`, whose vectors
come back as lists of floats, and "score", "pairwise_score" and "default_score" (a query
and documents, and PoolingParams' arguments) with `LLM.score`, and "prompt_logprobs" (cases
as "generate", a prompt being text or {"prompt_token_ids": [...]}) with `LLM.generate`,
answered with the prompt's token ids and vLLM's prompt logprobs beside the samples. With
"lora": ADAPTER_DIR (and enable_lora in engine_args) each list is asked once more with that
adapter's LoRARequest, as "lora_chat" and "lora_generate". With "adapters": {NAME: DIR}
(and enable_lora, max_loras in engine_args), the "adapter_chat" cases, each naming its
"adapter" (a name, or null for the base model), are asked in one `LLM.chat` call with a
LoRARequest a prompt ("adapter_chat", in the cases' order), and the base model's cases again
in one call of their own, with no adapter in the batch ("adapter_chat_base"). OUT.json: {"chat": [...],
"generate": [...], ...}, one entry a case: its samples' text, token ids, finish reason and
per-token logprobs (the chosen token's text and logprob, then the top ones).

A script of its own, in a process of its own: this keeps lmpress out of the process entirely.
The tests start it with VLLM_ENABLE_V1_MULTIPROCESSING=0 (conftest.py), so that vLLM runs its
engine core in this process rather than in two processes of its own; the `__main__` guard
keeps it working without that setting too (vLLM starts its processes by spawn).
"""

from __future__ import annotations

import json
import sys


def sampling(vllm, spec: dict):
    spec = dict(spec)
    if "structured_outputs" in spec:
        from vllm.sampling_params import StructuredOutputsParams

        spec["structured_outputs"] = StructuredOutputsParams(**spec["structured_outputs"])
    if "logit_bias" in spec:
        spec["logit_bias"] = {int(k): v for k, v in spec["logit_bias"].items()}
    return vllm.SamplingParams(**spec)


def described(output) -> list[dict]:
    samples = []
    for completion in output.outputs:
        logprobs = None
        if completion.logprobs is not None:
            logprobs = []
            for token_id, position in zip(completion.token_ids, completion.logprobs, strict=True):
                ranked = sorted(position.values(), key=lambda lp: -lp.logprob)
                chosen = position[token_id]
                top = [[lp.decoded_token, lp.logprob] for lp in ranked]
                logprobs.append([chosen.decoded_token, chosen.logprob, top])
        samples.append({
            "index": completion.index,
            "text": completion.text,
            "token_ids": list(completion.token_ids),
            "finish_reason": completion.finish_reason,
            "logprobs": logprobs,
        })  # fmt: skip
    return sorted(samples, key=lambda s: s["index"])


def with_prompt_logprobs(output) -> dict:
    """An output's prompt ids and, a position each, None or [token id, logprob, rank,
    decoded token] of every token vLLM listed there, as vLLM lists them."""
    positions = [
        None
        if position is None
        else [[i, lp.logprob, lp.rank, lp.decoded_token] for i, lp in position.items()]
        for position in output.prompt_logprobs
    ]
    return {
        "prompt_token_ids": list(output.prompt_token_ids),
        "prompt_logprobs": positions,
        "samples": described(output),
    }


def main(cases_file: str, out_file: str) -> None:
    import vllm

    with open(cases_file, encoding="utf-8") as f:
        cases = json.load(f)
    llm = vllm.LLM(model=cases["model"], **cases["engine_args"])
    try:
        out = answers(vllm, llm, cases)
    finally:
        # Stopped here, not left to the interpreter's exit: there, vLLM's monitor of its
        # engine-core process can see the process it is stopping exit, take it for a crash
        # and clean up while Python is finalizing, which aborts the process (SIGABRT, after
        # the answers were written) about one run in ten.
        llm.llm_engine.engine_core.shutdown()
    with open(out_file, "w", encoding="utf-8") as f:
        json.dump(out, f)


def answers(vllm, llm, cases: dict) -> dict:
    out: dict[str, list] = {}
    adapters = [("", None)]
    if cases.get("lora"):
        from vllm.lora.request import LoRARequest

        adapters.append(("lora_", LoRARequest("adapter", 1, cases["lora"])))
    for prefix, lora in adapters:
        out[prefix + "chat"], out[prefix + "generate"] = [], []
        if cases.get("chat"):
            outputs = llm.chat(
                [c["messages"] for c in cases["chat"]],
                [sampling(vllm, c["sampling"]) for c in cases["chat"]],
                use_tqdm=False,
                lora_request=lora,
            )
            out[prefix + "chat"] = [described(o) for o in outputs]
        if cases.get("generate"):
            outputs = llm.generate(
                [c["prompt"] for c in cases["generate"]],
                [sampling(vllm, c["sampling"]) for c in cases["generate"]],
                use_tqdm=False,
                lora_request=lora,
            )
            out[prefix + "generate"] = [described(o) for o in outputs]
    if cases.get("adapters"):
        out.update(adapter_answers(vllm, llm, cases))
    if cases.get("prompt_logprobs"):
        outputs = llm.generate(
            [c["prompt"] for c in cases["prompt_logprobs"]],
            [sampling(vllm, c["sampling"]) for c in cases["prompt_logprobs"]],
            use_tqdm=False,
        )
        out["prompt_logprobs"] = [with_prompt_logprobs(o) for o in outputs]
    if cases.get("embed"):  # with runner: pooling in engine_args
        # Cut at max_model_len by the tokenizer, as sentence-transformers cuts: vLLM refuses
        # a longer prompt otherwise.
        limit = llm.llm_engine.model_config.max_model_len
        tokenization = {"truncation": True, "max_length": limit}
        outputs = llm.embed(cases["embed"], use_tqdm=False, tokenization_kwargs=tokenization)
        out["embed"] = [list(o.outputs.embedding) for o in outputs]
        out["max_model_len"] = limit
    # {"prompt": ..., "params": BeamSearchParams' arguments}: LLM.beam_search, a case a call;
    # each beam's generated token ids and their text, best first (LLM.beam_search's own text
    # holds the prompt too).
    if cases.get("beam_search"):
        from vllm.sampling_params import BeamSearchParams

        tokenizer = llm.get_tokenizer()
        out["beam_search"] = []
        for case in cases["beam_search"]:
            [searched] = llm.beam_search([case["prompt"]], BeamSearchParams(**case["params"]))
            prompt_length = len(tokenizer.encode(case["prompt"]))
            generated = [beam.tokens[prompt_length:] for beam in searched.sequences]
            out["beam_search"].append([
                {"text": tokenizer.decode(ids, skip_special_tokens=True), "token_ids": ids}
                for ids in generated
            ])  # fmt: skip
    # {"query": ..., "documents": [...]}: LLM.score, one query to many, or with "query" a
    # list, pairwise; "pooling" is PoolingParams' keyword arguments, where the case gives it.
    for key in ("score", "pairwise_score", "default_score"):
        if cases.get(key):
            case = cases[key]
            pooling = vllm.PoolingParams(**case["pooling"]) if "pooling" in case else None
            outputs = llm.score(
                case["query"], case["documents"], use_tqdm=False, pooling_params=pooling
            )
            out[key] = [o.outputs.score for o in outputs]
    return out


def adapter_answers(vllm, llm, cases: dict) -> dict:
    from vllm.lora.request import LoRARequest

    adapters = cases["adapters"].items()
    loras = {name: LoRARequest(name, i, path) for i, (name, path) in enumerate(adapters, 1)}
    chats = cases["adapter_chat"]

    def ask(indices: list[int]) -> dict[int, list[dict]]:
        outputs = llm.chat(
            [chats[i]["messages"] for i in indices],
            [sampling(vllm, chats[i]["sampling"]) for i in indices],
            use_tqdm=False,
            lora_request=[loras.get(chats[i]["adapter"]) for i in indices],
        )
        return dict(zip(indices, map(described, outputs), strict=True))

    mixed = ask(list(range(len(chats))))
    base = ask([i for i, c in enumerate(chats) if c["adapter"] is None])
    return {
        "adapter_chat": [mixed[i] for i in range(len(chats))],
        "adapter_chat_base": list(base.values()),
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
