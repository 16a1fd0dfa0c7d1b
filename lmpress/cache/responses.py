"""The response cache as a run uses it: which requests it answers, a hit rebuilt as the engine's
own reply, and a miss's reply kept for the next run.

By default (`on`) only requests whose reply is reproducible are cached: greedy ones, and sampled
ones with a seed. `all` caches unseeded sampling too (one sample per prompt, kept), `refresh`
generates every request again and replaces what was kept, and `off` leaves the cache alone.

The cache never fails a run: a file that cannot be opened, or a write that fails midway, is
said once, and the run goes on generating without it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path

from lmpress.cache import records
from lmpress.cache.keys import AnyRequest, RunKey
from lmpress.cache.store import CacheDamaged, Entry, ResponseStore
from lmpress.configs.schema import RunConfig
from lmpress.vocabulary.types import Request

ENV_DIR = "LMPRESS_RESPONSE_CACHE"  # where the cache lives, when --cache-dir is not given


class CacheMode(str, Enum):
    ON = "on"  # reproducible requests: greedy, or sampled with a seed
    ALL = "all"  # unseeded sampling too
    REFRESH = "refresh"  # generate again, and replace what is kept
    OFF = "off"

    def __str__(self) -> str:
        return self.value


CACHE_MODES = tuple(m.value for m in CacheMode)


def cache_mode(value: object) -> CacheMode:
    """A mode as a flag, a recipe or a Python caller (True or False too) gives it."""
    if isinstance(value, bool):
        return CacheMode.ON if value else CacheMode.OFF
    return CacheMode(value)


def cache_dir(explicit: str | None = None) -> Path:
    """The response cache's directory: --cache-dir, else $LMPRESS_RESPONSE_CACHE, else
    `responses` under lmpress's cache directory ($LMPRESS_CACHE, ~/.cache/lmpress)."""
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    from lmpress.builtin_models.tiny import cache_root

    return cache_root() / "responses"


def reproducible(request: AnyRequest) -> bool:
    """Whether the engine gives the same reply to the same request: pooling always; text when
    greedy or seeded."""
    if not isinstance(request, Request):
        return True
    params = request.params
    return params.sampling_temperature() == 0 or params.seed is not None


class ResponseCache:
    def __init__(self, store: ResponseStore, keys: RunKey, mode: CacheMode, say: Callable):
        self.store = store
        self.keys = keys
        self.mode = mode
        self.misses = 0  # cacheable requests generated (and kept, unless they failed)
        self._say = say
        self._broken = False

    @classmethod
    def open(
        cls,
        config: RunConfig,
        mode: CacheMode | str = CacheMode.ON,
        directory: str | None = None,
        say: Callable[[str], None] = lambda message: None,
        readonly: bool = False,
    ) -> ResponseCache | None:
        """The cache for a run of `config`; None when it is off or cannot be used (said)."""
        mode = cache_mode(mode)
        if mode is CacheMode.OFF:
            return None
        where = cache_dir(directory)
        try:
            store = ResponseStore(where, readonly=readonly)
        except (CacheDamaged, OSError) as exc:
            say(
                f"response cache: {exc}; running without it (`lmpress cache clear` starts a "
                f"new one, or pass --cache off)"
            )
            return None
        return cls(store, RunKey(config), mode, say)

    def key(self, request: AnyRequest) -> bytes | None:
        """The request's key, or None where this mode does not cache it."""
        if self._broken:
            return None
        if self.mode is not CacheMode.ALL and not reproducible(request):
            return None
        return self.keys.of(request)

    def hit(self, key: bytes, request_id: str) -> records.AnyResult | None:
        """The kept reply for `key`, as this request's; None: none kept (or `refresh`)."""
        if self.mode is CacheMode.REFRESH or self._broken:
            return None
        started = time.perf_counter()
        try:
            value = self.store.get(key)
        except Exception as exc:  # a cache that fails is left, never the run
            self._give_up(exc)
            return None
        if value is None:
            return None
        try:
            result = records.load(value, request_id)
        except ValueError:  # a record no reply can be made of: generated again
            self.store.damaged_reads += 1
            return None
        result.cached = True
        result.latency_s = time.perf_counter() - started
        return result

    def lookup(self, request: AnyRequest) -> tuple[bytes | None, records.AnyResult | None]:
        """The request's key (None: this mode does not cache it) and its kept reply (None:
        a miss, to generate and `keep` under that key)."""
        key = self.key(request)
        return key, None if key is None else self.hit(key, request.id)

    def would_hit(self, request: AnyRequest) -> bool:
        """Whether a run would answer `request` from the cache (the dry run's question)."""
        key = self.key(request)
        if key is None or self.mode is CacheMode.REFRESH:
            return False
        try:
            return self.store.contains(key)
        except sqlite3.Error:
            return False

    def keep(self, key: bytes, result: records.AnyResult) -> None:
        """Keep a generated reply (failed ones are not kept: the next run tries again)."""
        self.misses += 1
        if result.error is not None or self._broken:
            return
        try:
            entry = Entry(key, records.dump(result), self.keys.engine, self.keys.label)
            self.store.put(entry)
        except Exception as exc:  # a cache that fails is left, never the run
            self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        if not self._broken:
            self._say(f"response cache: {self.store.path}: {exc}; going on without it for this run")
        self._broken = True

    def flush(self) -> None:
        """Write the replies kept so far (a long-lived process between requests)."""
        try:
            self.store.flush()
        except Exception as exc:  # a cache that fails is left, never the run
            self._give_up(exc)

    @property
    def damaged_reads(self) -> int:
        return self.store.damaged_reads

    def close(self) -> None:
        try:
            self.store.close()
        except Exception as exc:  # a cache that fails is left, never the run
            self._give_up(exc)
