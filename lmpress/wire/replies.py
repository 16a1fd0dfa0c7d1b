"""What one successful attempt at a remote API produced, as every reply parser in wire/ returns
it (OpenAI's, Anthropic's, Gemini's), live or read from a provider batch's output, and
`MalformedResponse`, which they raise for a 2xx body that is not what the API promises (the
remote engines' retry rule retries it)."""

from __future__ import annotations

from dataclasses import dataclass

from lmpress.vocabulary.embeddings import Embedding
from lmpress.vocabulary.types import Sample, TokenLogprob, Usage


class MalformedResponse(Exception):
    """A 2xx response whose body is not what the API promises."""


@dataclass
class Reply:
    """What one successful attempt produced."""

    samples: list[Sample]
    usage: Usage
    model: str = ""
    # A scored prompt's tokens' logprobs and ids (Result.prompt_logprobs, Result.prompt_ids).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_ids: list[int] | None = None


@dataclass
class EmbedReply:
    """What one successful embeddings request produced."""

    embeddings: list[Embedding]
    usage: Usage
    model: str = ""


@dataclass
class ScoreReply:
    """What one successful scoring request produced."""

    scores: list[float]
    usage: Usage
    model: str = ""
