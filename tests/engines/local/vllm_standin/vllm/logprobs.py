"""Stand-in for vllm/logprobs.py."""

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# {token_id -> logprob} for each generated position.
SampleLogprobs = list[dict[int, Logprob]]
