"""The `response` record a generated row carries (in a JSONL row and a Parquet column alike),
and the assistant message its reply appends: one place, so both outputs say the same."""

from __future__ import annotations

import dataclasses
from typing import Any

from lmpress.vocabulary.types import Result, Sample, round_usd


def reply_message(sample: Sample) -> dict[str, Any]:
    """The assistant message a reply appends, as OpenAI and Oumi write it: one that only calls
    tools has `content: null` beside its `tool_calls`."""
    if not sample.tool_calls:
        return {"role": "assistant", "content": sample.text}
    calls = [call.to_openai() for call in sample.tool_calls]
    return {"role": "assistant", "content": sample.text or None, "tool_calls": calls}


def _sample_record(sample: Sample) -> dict[str, Any]:
    record: dict[str, Any] = {"text": sample.text}
    if sample.reasoning is not None:  # only a reasoning model's rows have it
        record["reasoning"] = sample.reasoning
    record["finish_reason"] = sample.finish_reason
    if sample.reasoning_details:
        record["reasoning_details"] = sample.reasoning_details
    if sample.tool_calls:
        record["tool_calls"] = [call.to_openai() for call in sample.tool_calls]
    return record


def usage_record(result: Result) -> dict[str, Any]:
    """A row's `usage`; `reasoning_tokens` (of the completion tokens) only where the model
    reasoned, and `cached_tokens` and `cache_creation_tokens` (of the prompt tokens: read from
    and written to the provider's prompt cache) only where there were some, so other rows stay
    as they were."""
    usage = result.usage
    record = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if result.reasoned:
        record["reasoning_tokens"] = usage.reasoning_tokens
    if usage.cached_tokens:
        record["cached_tokens"] = usage.cached_tokens
    if usage.cache_creation_tokens:
        record["cache_creation_tokens"] = usage.cache_creation_tokens
    return record


def response_record(result: Result) -> dict[str, Any]:
    first = result.samples[0] if result.samples else Sample("", "stop")
    record: dict[str, Any] = {
        **_sample_record(first),
        "finish_reason": result.finish_reason,
        "usage": usage_record(result),
        "model": result.model,
        "engine": result.engine,
        "latency_s": round(result.latency_s, 4),
    }
    if len(result.samples) > 1:
        record["samples"] = [_sample_record(s) for s in result.samples]
    if result.samples and result.samples[0].logprobs is not None:
        record["logprobs"] = [
            {
                "token": t.token,
                "logprob": t.logprob,
                "top_logprobs": [{"token": tok, "logprob": lp} for tok, lp in t.top],
            }
            for t in result.samples[0].logprobs
        ]
    if result.structured is not None:
        record["structured"] = result.structured
    if result.cost_usd is not None:
        record["cost_usd"] = round_usd(result.cost_usd)
    if result.cached:  # only on a reply from the response cache, so live rows stay as they were
        record["cached"] = True
    if result.error is not None:
        record["error"] = dataclasses.asdict(result.error)
    return record
