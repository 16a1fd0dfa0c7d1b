"""The response cache's key: everything that decides a reply, and nothing else.

A key is the sha256 of two parts:
- the run's part, made once per run (`RunKey`): the engine, the task, the model by the content of
  its files (or a remote model by its endpoint and name), and every model setting but those that
  only train (`TRAINING_ONLY`) and the adapters a row may choose (`model.adapters`);
- the request's part: the conversation or prompt (images by the hash of their bytes), the tools,
  every generation setting but those that only schedule work (`SCHEDULING_FIELDS`:
  batch_size, use_cache, exclude_prompt_from_response), the seed included, and the adapter it
  chose by the content of its files (none for the base model).

So a row keys on its own adapter only: adding an adapter to a run keeps every cached reply,
and changing one adapter's weights misses on that adapter's rows alone.

So num_workers, timeouts, retries, the output path and the batch size change no key, and a
changed prompt, temperature, seed, max_new_tokens, chat template or model file changes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import orjson

from lmpress.cache.identity import FileDigests, content_identity
from lmpress.configs.schema import TRAINING_ONLY, RunConfig
from lmpress.vocabulary.embeddings import EmbedRequest, ScoreRequest
from lmpress.vocabulary.likelihood import ChoicesRequest, PerplexityRequest
from lmpress.vocabulary.types import (
    SCHEDULING_FIELDS,
    ContentPart,
    GenerationParams,
    Message,
    Request,
)

KEY_FORMAT = 1
AnyRequest = Request | EmbedRequest | ScoreRequest | ChoicesRequest | PerplexityRequest
_TRAINING_FIELDS = {name.split(".", 1)[1] for name in TRAINING_ONLY}

# Generation fields added after the cache's keys were first written: keyed only when set, so
# that a row that leaves them at their default keeps the key it had, and what earlier versions
# cached still answers it.
KEYED_WHEN_SET = frozenset({"ignore_eos", "bad_words", "length_penalty", "early_stopping"})
DEFAULTS = dataclasses.asdict(GenerationParams())


def _json(value: Any) -> bytes:
    """`value` as JSON, keys sorted: by orjson (a key is made for every row), else by json for
    what orjson refuses (text with a lone surrogate, a row's bad bytes: it keys like any other,
    and the engine refuses that row as it would without a cache). A value always takes the
    same one of the two, so its key never changes."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_identity(config: RunConfig, digests: FileDigests) -> dict[str, Any]:
    """The run's model and its settings, with every file named by its content."""
    model = {k: v for k, v in dataclasses.asdict(config.model).items() if k not in _TRAINING_FIELDS}
    del model["adapters"]  # a request keys on the one it chose (`RunKey.of`)
    if _remote(config):  # a remote model: its name at its endpoint
        return model
    revision = config.model.model_revision
    hub = _takes_hub_ids(config.engine)
    model["model_name"] = content_identity(config.model.model_name, digests, revision, hub)
    for key in ("adapter_model", "tokenizer_name"):
        if model.get(key):
            model[key] = content_identity(model[key], digests, hub=hub)
    template = model.get("chat_template")
    if template and "\n" not in template and Path(template).expanduser().is_file():
        model["chat_template"] = "sha256:" + digests.of_file(Path(template).expanduser())
    return model


def adapter_identities(config: RunConfig, digests: FileDigests | None = None) -> dict[str, str]:
    """Each of `model.adapters` by the content of its files (as given, where they are not on
    this machine), hashed once a run: the digests table keeps them across runs until a file
    changes."""
    adapters = config.model.adapters
    if not adapters or _remote(config):
        return dict(adapters)
    hub = _takes_hub_ids(config.engine)
    table = digests or FileDigests()
    try:
        return {name: content_identity(path, table, hub=hub) for name, path in adapters.items()}
    finally:
        if digests is None:
            table.close()


def _remote(config: RunConfig) -> bool:
    """Whether the run's model is served elsewhere (an endpoint, and not a local engine)."""
    from lmpress.engines.registry import LOCAL

    return endpoint_of(config) is not None and config.engine not in {s.name for s in LOCAL}


def _takes_hub_ids(engine: str) -> bool:
    """Whether the engine's model may be a Hugging Face id (whose files the hub's cache holds);
    a remote model's `org/name` is not looked for there."""
    from lmpress.engines.registry import load_engine_class
    from lmpress.vocabulary.errors import LmpressError

    try:
        return load_engine_class(engine).takes_hub_ids
    except LmpressError:  # an engine that cannot load here: its run fails on its own
        return False


def endpoint_of(config: RunConfig) -> str | None:
    """Where a remote engine sends its requests: the URL set, or its provider's."""
    if config.remote_params.api_url:
        return config.remote_params.api_url.rstrip("/")
    from lmpress.engines.remote.presets import BY_NAME

    preset = BY_NAME.get(config.engine)
    return preset.url.rstrip("/") if preset and preset.url else None


class RunKey:
    """Keys for one run's requests."""

    def __init__(self, config: RunConfig, digests: FileDigests | None = None):
        # A remote model has no files to hash: no table of digests is opened for it.
        own = digests is None and not _remote(config)
        table = FileDigests() if own else digests
        try:
            self.model = model_identity(config, table)  # type: ignore[arg-type]
            self.adapters = adapter_identities(config, table)
        finally:
            if own:
                table.close()  # type: ignore[union-attr]
        self.engine = config.engine
        self.label = config.model.model_name or ""
        run = {
            "format": KEY_FORMAT,
            "engine": config.engine,
            "task": config.task,
            "model": self.model,
            "endpoint": endpoint_of(config),
        }
        self._run = _json(run)
        self._params: dict[int, tuple[GenerationParams, bytes]] = {}
        self._images: dict[str, str] = {}

    def of(self, request: AnyRequest) -> bytes:
        """The key of `request` in this run."""
        whole = hashlib.sha256(self._run)
        whole.update(b"\0")
        whole.update(self._request(request))
        return whole.digest()

    def _request(self, request: AnyRequest) -> bytes:
        if isinstance(request, EmbedRequest):
            return _json(["embed", request.inputs, request.dimensions, request.normalize])
        if isinstance(request, ScoreRequest):
            return _json(["score", request.query, request.documents, request.top_n])
        if isinstance(request, ChoicesRequest):
            return _json(["loglikelihood", request.context, request.continuations])
        if isinstance(request, PerplexityRequest):
            return _json(["perplexity", request.text])
        messages = [self._message(m) for m in request.messages]
        parts = ["generate", messages, request.prompt, request.tools]
        if request.prompt_ids is not None:  # a token-id prompt, scored from score_from on
            parts += [request.prompt_ids, request.score_from]
        if request.adapter is not None:  # the base model's rows key as in a run without any
            parts.append({"adapter": self.adapters.get(request.adapter, request.adapter)})
        body = _json(parts)
        return body + b"\0" + self._params_of(request.params)

    def _params_of(self, params: GenerationParams) -> bytes:
        """Most rows share the run's params object: its part is made once."""
        known = self._params.get(id(params))
        if known is not None and known[0] is params:
            return known[1]
        fields = {
            k: v
            for k, v in dataclasses.asdict(params).items()
            if k not in SCHEDULING_FIELDS and not (k in KEYED_WHEN_SET and v == DEFAULTS[k])
        }
        made = _json(fields)
        if len(self._params) > 1024:  # rows with their own settings: each is new
            self._params.clear()
        self._params[id(params)] = (params, made)
        return made

    def _message(self, message: Message) -> list[Any]:
        content: Any = message.content
        if not isinstance(content, str):
            content = [self._part(part) for part in content]
        calls = [[c.id, c.name, c.arguments] for c in message.tool_calls or []]
        return [
            message.role, content, calls, message.tool_call_id, message.reasoning,
            message.reasoning_details,
        ]  # fmt: skip

    def _part(self, part: ContentPart) -> list[Any]:
        if part.type != "image_url" or not part.image_url:
            return [part.type, part.text]
        return [part.type, self._image(part.image_url)]

    def _image(self, url: str) -> str:
        """An image by the hash of its bytes (a data: URL's, or a local file's); a web URL as
        written, since lmpress does not fetch it to key it."""
        known = self._images.get(url)
        if known is not None:
            return known
        if url.startswith("data:"):
            made = "sha256:" + _digest(url.encode())
        else:
            path = Path(url.removeprefix("file://")).expanduser()
            if not url.startswith(("http://", "https://")) and path.is_file():
                made = "sha256:" + _digest(path.read_bytes())
            else:
                made = url
        if len(self._images) > 4096:
            self._images.clear()
        self._images[url] = made
        return made
