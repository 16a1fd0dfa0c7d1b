"""Request bodies checked against the installed SDKs' own request types: a field the provider does
not declare, or one of the wrong type, is a 400 naming it, as the provider answers it, so a test
cannot pass against a fake that takes anything.

The types are the TypedDicts the SDKs annotate their `create` methods with:
`openai.types.chat.completion_create_params`, `openai.types.completion_create_params` and
`anthropic.types.message_create_params`, each in its streaming or non-streaming form (only those
declare `stream`), and `openai.types.embedding_create_params`. pydantic builds a validator from each, and two changes to its core schema make
it check what the providers' servers check: every TypedDict forbids keys it does not declare
(pydantic ignores them by default), and an `Iterable[...]` field is read as a list (pydantic
checks an Iterable lazily, as it is consumed, so a bad message would pass). Validation is strict,
"0.5" is no float: a JSON body carries its types.

A vLLM server takes more top-level fields than OpenAI declares, and lmpress sends some on purpose
through `extra_body` (top_k, min_p, structured_outputs...). The fake accepts such a field only
when a test says it plays such a server (`Faults.extensions`, `VLLM_EXTENSIONS`), so one sent to
OpenAI itself is caught. They are accepted by name, their values unchecked.

anthropic 2.12 declares no temperature, top_p or top_k anywhere (not in a base class, not in
the beta types): the Messages API it describes takes no sampling parameters, which is why
lmpress's AnthropicEngine sends none. Here they are unknown fields like any other.
"""

from __future__ import annotations

import typing
from functools import cache
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError
from pydantic_core import SchemaValidator

Endpoint = Literal["chat", "completions", "messages", "embeddings"]
# The fields that tell the members of the SDKs' unions apart (a message's role, a block's type).
TAGS = ("role", "type")

# The fields vLLM's OpenAI server adds to a chat or completions request that lmpress may send
# (vllm/entrypoints/openai/protocol.py, ChatCompletionRequest: its sampling parameters, and
# `structured_outputs`, which replaced the guided_* fields). vLLM itself ignores, with a warning,
# fields it does not know; this fake refuses them, so a misspelt one is caught.
VLLM_EXTENSIONS = frozenset({
    "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs",
    "allowed_token_ids", "bad_words", "structured_outputs",
})  # fmt: skip


def endpoint(path: str, anthropic: bool) -> Endpoint:
    """Which request type a body sent to `path` must fit."""
    if anthropic:
        return "messages"
    if path.rstrip("/").endswith("embeddings"):
        return "embeddings"
    return "chat" if path.rstrip("/").endswith("chat/completions") else "completions"


def body_problem(
    body: dict[str, Any], where: Endpoint, extensions: frozenset[str] = frozenset()
) -> str | None:
    """What in `body` its SDK request type does not allow, worded as the provider words it, or
    None when it fits. Fields named in `extensions` are let through unchecked."""
    declared, validator = _type(where, body.get("stream") is True)
    unknown = sorted(set(body) - declared - extensions)
    if unknown and where == "messages":
        return f"{unknown[0]}: Extra inputs are not permitted"
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        return f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}"
    checked = {key: value for key, value in body.items() if key not in extensions}
    try:
        validator.validate_python(checked, strict=True)
    except ValidationError as exc:
        return _describe(exc, checked)
    return None


def prepare() -> None:
    """Build every endpoint's validator now (the SDKs' types import in a second or two): a
    server that built them on its first request answered it late enough, on a busy machine,
    for a client with a short timeout to send it again."""
    for where in typing.get_args(Endpoint):
        for stream in (False, True):
            _type(where, stream)


@cache
def _type(where: Endpoint, stream: bool) -> tuple[frozenset[str], SchemaValidator]:
    """The top-level keys the SDK's request type declares, and a strict validator for it."""
    from anthropic.types import message_create_params as messages
    from openai.types import completion_create_params as completions
    from openai.types import embedding_create_params as embeddings
    from openai.types.chat import completion_create_params as chat

    if where == "embeddings":  # one type: it does not stream
        typed_dict: Any = embeddings.EmbeddingCreateParams
        declared = frozenset(typing.get_type_hints(typed_dict))
        return declared, SchemaValidator(_strict(TypeAdapter(typed_dict).core_schema))
    module = {"chat": chat, "completions": completions, "messages": messages}[where]
    name = "MessageCreateParams" if where == "messages" else "CompletionCreateParams"
    typed_dict = getattr(module, name + ("Streaming" if stream else "NonStreaming"))
    declared = frozenset(typing.get_type_hints(typed_dict))  # the base class's keys included
    return declared, SchemaValidator(_strict(TypeAdapter(typed_dict).core_schema))


def _strict(schema: Any) -> Any:
    """A pydantic core schema whose TypedDicts forbid unknown keys and whose Iterables are lists.
    The models too: anthropic's content may be a response's own blocks (pydantic models that
    allow extra keys), whose wire form is their declared fields."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _strict(value) for key, value in schema.items()}
    if schema.get("type") in ("typed-dict", "model-fields"):
        schema["extra_behavior"] = "forbid"
    elif schema.get("type") == "generator":
        kept = ("items_schema", "min_length", "max_length", "ref", "metadata")
        schema = {"type": "list", **{key: schema[key] for key in kept if key in schema}}
    return schema


def _describe(exc: ValidationError, body: dict[str, Any]) -> str:
    """One problem, named by its place in the body ("messages.0.content: ..."). A value that fits
    no member of a union (a message is one of six TypedDicts, none tagged for pydantic) fails
    once per member. A member whose tag (its `role` or `type` literal) does not match is not the
    one the sender meant: its failures say nothing but that, the values the tag may take. Of
    what is left, the failure deepest in the body says the most."""
    errors = [(*_place(error["loc"], body), error) for error in exc.errors()]
    wrong_tags = {
        members[-1] for path, members, error in errors if _wrong_tag(path, members, error)
    }
    found: dict[tuple[Any, ...], str] = {}  # path -> what is wrong there
    tags: dict[tuple[Any, ...], list[str]] = {}  # path -> the values a tag there may take
    for path, members, error in errors:
        if _wrong_tag(path, members, error):
            if not wrong_tags.intersection(members[:-1]):
                tags.setdefault(path, []).append(error["ctx"]["expected"])
        elif not wrong_tags.intersection(members):
            found.setdefault(path, error["msg"])
    for path, expected in tags.items():
        found.setdefault(path, f"Input should be {' or '.join(dict.fromkeys(expected))}")
    path = max(found, key=len)  # the first of the deepest
    return f"{_dotted(path)}: {found[path]}"


def _wrong_tag(path: tuple[Any, ...], members: list[tuple[Any, ...]], error: Any) -> bool:
    """Whether an error is a union member's tag not matching: the member is not the one meant."""
    tag = error["type"] == "literal_error" and bool(path) and path[-1] in TAGS
    return tag and bool(members) and members[-1][0] == path[:-1]


def _place(loc: tuple[Any, ...], body: Any) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """A pydantic error location split into the path in the body and the union members named
    on the way, each as (its path, its name): pydantic puts a member's name in the location."""
    path: list[Any] = []
    members = []
    here = body
    for i, part in enumerate(loc):
        if isinstance(here, dict) and part in here or isinstance(here, list) and type(part) is int:
            path.append(part)
            here = here[part]
        elif isinstance(here, dict) and i == len(loc) - 1:
            path.append(part)  # a missing key
        else:
            members.append((tuple(path), part))
    return tuple(path), members


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in path)
