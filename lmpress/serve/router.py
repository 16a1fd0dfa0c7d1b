"""Several models behind one `lmpress serve`: which model a name chooses, and which are loaded.

Each model is a `Server` over one engine, as a one-model server is; the router keeps one entry
per model (its config, its server once loaded, its requests in flight, when it was last used)
and every route asks it for the body's `model`. A name is a model's own or one of its LoRA
adapters' (the request then goes to the base's engine with `Request.adapter` set).

Local models load on first use, in a thread (the event loop goes on serving the others), one
at a time so that two loads never hold memory the limit was meant to keep free. Requests for a
model that is loading wait for it, each counted against `serve.queue_limit`, and stop waiting
when their client goes away. Past `serve.max_loaded_models`, the least recently used local
model with no request in flight is unloaded (its engine closed, its memory given back); when
every loaded model is busy, the request is refused with 503 and Retry-After rather than kept
waiting for an unknown time. Remote models hold no weights: they open at start, stay open and
do not count against the limit.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmpress.cache.answers import CachedAnswers
from lmpress.configs.schema import RunConfig, ServeParams
from lmpress.engines.base import Engine
from lmpress.wire.openai.errors import ApiError, model_not_found

log = logging.getLogger("lmpress.serve")


class Server(Protocol):
    """What the router uses of `serve.app.Server`, the unit it holds per model."""

    engine: Engine
    settings: ServeParams
    model_name: str
    answers: CachedAnswers

    def drop_engine(self) -> None: ...


@dataclass
class ModelEntry:
    """One model the router serves, loaded or not."""

    name: str
    config: RunConfig
    server: Server | None = None
    app: Any = None  # the ASGI app of the server's routes, where the front keeps one
    # The model's LoRA adapters, name -> path: the config's and those loaded at run time, so
    # that a model unloaded and loaded again holds the same ones.
    adapters: dict[str, str] = field(default_factory=dict)
    in_flight: int = 0  # requests holding the model (waiting for it to load, or running)
    waiting: int = 0  # of those, the ones waiting for it to load
    last_used: float = 0.0
    loading: asyncio.Task | None = None

    def __post_init__(self) -> None:
        self.adapters = {**self.config.model.adapters, **self.adapters}

    @property
    def local(self) -> bool:
        """Whether its engine holds weights here (any but a remote provider's)."""
        from lmpress.engines.registry import REMOTE

        return self.config.engine not in {spec.name for spec in REMOTE}

    def names(self) -> list[str]:
        return [self.name, *self.adapters]


class ModelRouter:
    """name -> entry, and the loading and unloading of the entries' engines.

    `open_server` makes an entry's `Server` (with its routes) from its newly created engine;
    `create_engine` makes the engine, in a thread (the registry's, unless a test gives one).
    """

    def __init__(
        self,
        entries: list[ModelEntry],
        settings: ServeParams,
        open_server: Callable[[ModelEntry, Engine], Server],
        create_engine: Callable[[RunConfig], Engine] | None = None,
    ):
        self.entries = {entry.name: entry for entry in entries}
        self.settings = settings
        self.open_server = open_server
        self.create_engine = create_engine
        self.created = int(time.time())
        self._one_load = asyncio.Lock()

    @classmethod
    def of_one(cls, server: Server) -> ModelRouter:
        """The router of a one-model server: its model, loaded for good."""
        entry = ModelEntry(server.model_name, server.engine.config, server)
        return cls([entry], server.settings, lambda entry, engine: server)

    # --- names ---------------------------------------------------------------------------

    def find(self, model: str) -> ModelEntry:
        """The entry `model` names (its own name or an adapter's), or 404 model_not_found."""
        entry = self.entries.get(model)
        if entry is not None:
            return entry
        for entry in self.entries.values():
            if model in entry.adapters:
                return entry
        raise model_not_found(model, [n for entry in self.entries.values() for n in entry.names()])

    def loaded(self) -> list[ModelEntry]:
        return [entry for entry in self.entries.values() if entry.server is not None]

    # --- holding a model -----------------------------------------------------------------

    def take(self, entry: ModelEntry) -> None:
        """Count a request as holding `entry` (not unloaded while held) until `release`."""
        entry.in_flight += 1

    def release(self, entry: ModelEntry) -> None:
        entry.in_flight -= 1
        entry.last_used = time.monotonic()

    async def hold(self, entry: ModelEntry) -> Server:
        """`entry`'s server, loaded first if it is not, for a request that has taken it."""
        if entry.server is not None:
            return entry.server
        if entry.waiting >= self.settings.queue_limit:
            raise ApiError(
                503,
                f"model '{entry.name}' is loading and {entry.waiting} requests already wait "
                f"for it (serve.queue_limit); retry later",
                type="server_error",
                code="queue_full",
                headers={"retry-after": "1"},
            )
        entry.waiting += 1
        try:
            if entry.loading is None or entry.loading.done():
                entry.loading = asyncio.create_task(self._load(entry))
            # shielded: a client that stops waiting does not stop the load others wait for
            await asyncio.shield(entry.loading)
        finally:
            entry.waiting -= 1
        assert entry.server is not None
        return entry.server

    async def start(self) -> None:
        """Open the remote models, which cost nothing to hold, so that they answer at once."""
        for entry in self.entries.values():
            if not entry.local and entry.server is None:
                await self._load(entry)

    # --- loading and unloading -----------------------------------------------------------

    async def _load(self, entry: ModelEntry) -> None:
        async with self._one_load:
            if entry.server is not None:
                return
            if entry.local:
                await self._make_room()
            config = dataclasses.replace(
                entry.config,
                model=dataclasses.replace(entry.config.model, adapters=dict(entry.adapters)),
            )
            started = time.perf_counter()
            try:
                engine = await asyncio.to_thread(self._create_engine, config)
            except Exception as exc:
                log.exception("model '%s' failed to load", entry.name)
                raise ApiError(
                    500,
                    f"model '{entry.name}' failed to load: {exc}",
                    type="server_error",
                    code="model_load_failed",
                ) from exc
            entry.server = self.open_server(entry, engine)
            log.info("model '%s' loaded in %.1fs", entry.name, time.perf_counter() - started)

    def _create_engine(self, config: RunConfig) -> Engine:
        if self.create_engine is not None:
            return self.create_engine(config)
        from lmpress.engines.registry import create_engine

        return create_engine(config)

    async def _make_room(self) -> None:
        """Unload least recently used idle local models until one more fits the limit."""
        limit = self.settings.max_loaded_models
        while limit is not None:
            local = [entry for entry in self.loaded() if entry.local]
            if len(local) < limit:
                return
            idle = [entry for entry in local if entry.in_flight == 0]
            if not idle:
                raise ApiError(
                    503,
                    f"this server holds {limit} models at once (serve.max_loaded_models) and "
                    f"each has requests in flight; retry later",
                    type="server_error",
                    code="model_capacity",
                    headers={"retry-after": "1"},
                )
            await self.unload(min(idle, key=lambda entry: entry.last_used))

    async def unload(self, entry: ModelEntry) -> None:
        """Close `entry`'s engine and give its memory back to the system."""
        server, entry.server, entry.app = entry.server, None, None
        if server is None:
            return
        server.answers.close()
        await server.engine.aclose()
        server.drop_engine()
        del server
        gc.collect()
        _trim_heap()
        log.info("model '%s' unloaded", entry.name)

    async def close(self) -> None:
        for entry in self.loaded():
            await self.unload(entry)


def _trim_heap() -> None:
    """Hand freed heap pages back to the system (glibc keeps them for reuse otherwise), so
    that unloading a model lowers the process's memory as well as freeing it."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator decides
        pass
