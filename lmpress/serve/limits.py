"""What one request may ask of `lmpress serve`, so that no client makes work without a bound
(issue 49: `n=400000` was served, and 200,000 prompts ran as one request).

Each cap is a `serve.*` setting, checked from the parsed body before any work (a prompt by its
UTF-8 bytes, before it is tokenized), and answered with a 400 that names the setting. A request
holds as many places in the server's queue (`serve.queue_limit`) as it has sequences to
generate (prompts x n) or texts to pool, so one request cannot take what many would.
"""

from __future__ import annotations

from collections.abc import Iterable

from lmpress.configs.schema import ServeParams
from lmpress.vocabulary.types import GenerationParams
from lmpress.wire.openai.errors import ApiError


def check_samples(
    settings: ServeParams, params: GenerationParams, source: dict[str, str], prompts: int = 1
) -> None:
    """Refuse more samples or tokens than the caps allow, or more sequences (prompts x n) than
    the queue holds. `source` names the argument each field came
    from (`Sampling.source`), so a message says `max_output_tokens` where the client did."""
    n, tokens = params.n, params.max_new_tokens
    n_name = source.get("n", "n")
    tokens_name = source.get("max_new_tokens", "max_tokens")
    if n > settings.max_n:
        raise _over(f"{n_name}={n}", "max_n", settings.max_n, "ask for fewer samples", n_name)
    wanted = prompts * n * tokens
    if wanted > settings.max_new_tokens_per_request:
        names, values = [n_name, tokens_name], [n, tokens]
        if prompts > 1:
            names, values = ["prompts", *names], [prompts, *values]
        shown = f"{' x '.join(names)} = {' x '.join(map(str, values))} = {wanted} tokens"
        raise _over(
            shown,
            "max_new_tokens_per_request",
            settings.max_new_tokens_per_request,
            f"ask for fewer samples or a smaller {tokens_name}",
            tokens_name,
        )
    check_places(settings, prompts * n, "sequences (prompts x n)")


def check_places(settings: ServeParams, places: int, what: str) -> None:
    """Refuse a request that would hold more places than the whole queue has."""
    if places > settings.queue_limit:
        raise _over(
            f"{places} {what}",
            "queue_limit",
            settings.queue_limit,
            "send them in smaller requests",
        )


def check_prompt_count(settings: ServeParams, count: int, param: str) -> None:
    """Refuse more prompts (or texts to embed or score) than one request may carry."""
    if count > settings.max_prompts_per_request:
        limit = settings.max_prompts_per_request
        raise _over(
            f"{count} items in '{param}'",
            "max_prompts_per_request",
            limit,
            "send them in smaller requests",
            param,
        )


def check_prompt_bytes(settings: ServeParams, prompts: Iterable[str], param: str) -> None:
    """Refuse a prompt longer than the cap in UTF-8 bytes, before anything tokenizes it."""
    limit = settings.max_prompt_bytes
    for prompt in prompts:
        if len(prompt) * 4 <= limit:  # no character is longer than 4 bytes
            continue
        size = len(prompt.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise _over(
                f"a prompt of {size} bytes", "max_prompt_bytes", limit, "send a shorter one", param
            )


def _over(what: str, setting: str, limit: int, advice: str, param: str | None = None) -> ApiError:
    return ApiError(
        400,
        f"{what} is over serve.{setting}={limit}; {advice}, or start the server with a "
        f"larger --serve.{setting}",
        param=param,
    )
