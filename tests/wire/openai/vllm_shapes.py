"""vLLM's response shapes for its score, rerank, classify and pooling endpoints and for a
`run-batch` output line, as its pydantic response models declare them
(vllm/entrypoints/pooling/{score,classify,pooling}/protocol.py and run_batch.py), restated here since vLLM itself does not install on this machine. Each refuses a
field vLLM's model lacks and requires every field it requires, so a body that validates here
is one vLLM's own client code reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Exact(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RerankUsage(_Exact):
    prompt_tokens: int
    total_tokens: int


class RerankDocument(_Exact):
    text: str | None = None


class RerankResult(_Exact):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankResponse(_Exact):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ScoreUsage(_Exact):  # vLLM's UsageInfo
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int | None = 0


class ScoreData(_Exact):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(_Exact):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage


class ClassificationData(_Exact):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(_Exact):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ClassificationData]
    usage: ScoreUsage


class PoolingData(_Exact):
    index: int
    object: Literal["pooling"]
    data: list[float] | list[list[float]] | str


class PoolingResponse(_Exact):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[PoolingData]
    usage: ScoreUsage


class BatchResponse(_Exact):
    status_code: int
    request_id: str
    body: Any


class BatchOutputLine(_Exact):
    """One line of `vllm run-batch`'s output file: a response or an error, never neither."""

    id: str
    custom_id: str | None
    response: BatchResponse | None
    error: Any | None


# --- completions and chat with prompt logprobs (vllm/entrypoints/openai/completion/protocol.py,
# chat_completion/protocol.py and vllm/logprobs.py) ------------------------------------------


class VllmLogprob(_Exact):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, VllmLogprob] | None] | None


class VllmCompletionLogProbs(_Exact):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class VllmCompletionChoice(_Exact):
    index: int
    text: str
    logprobs: VllmCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs = None
    prompt_token_ids: list[int] | None = None


class VllmCompletionResponse(_Exact):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[VllmCompletionChoice]
    system_fingerprint: str | None = None
    usage: dict[str, Any]


class VllmChatResponse(_Exact):
    """A chat.completion: its prompt logprobs beside the choices, not in them."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[dict[str, Any]]
    system_fingerprint: str | None = None
    usage: dict[str, Any]
    prompt_logprobs: PromptLogprobs = None
    prompt_token_ids: list[int] | None = None
