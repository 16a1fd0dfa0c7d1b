"""One engine replica: a Ray Data actor that parses the lines it is sent and runs them through
its engine, by the run's task (`batch.pooling.run_request`: generate, embed or score).

The engine runs on an event loop of its own, on a thread of the actor, created with the engine
and kept for its life; each call's rows go to it at once, so the engine batches them with the
rows of the replica's other calls in flight. A row's outcome goes back pickled: its parsed
row and result, or why it could not run. An exception from the engine fails that row alone.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
import time
from dataclasses import dataclass

import pyarrow as pa

from lmpress.batch.events import RowFailure
from lmpress.batch.pooling import AnyResult, finished, run_request
from lmpress.batch.rows import RowParser
from lmpress.cache.responses import ResponseCache
from lmpress.configs.schema import RunConfig
from lmpress.data.jsonl import Line
from lmpress.data.row_shapes import ParsedRow
from lmpress.engines.base import error_result, failure_info
from lmpress.engines.registry import create_engine
from lmpress.vocabulary.errors import LmpressError


@dataclass
class Outcome:
    """What became of one row sent to a replica (or, with no row, a count of skipped rows)."""

    seq: int  # -1: no row
    skipped: int  # rows done by earlier runs, skipped just before this one
    row: ParsedRow | None = None
    result: AnyResult | None = None
    failure: RowFailure | None = None  # the row could not run
    kept: bool = False  # generated, and kept in the response cache


class Replica:
    def __init__(
        self,
        config: RunConfig,
        parser: RowParser,
        cache: str = "off",
        cache_dir: str | None = None,
    ):
        self.parser = parser
        self.broken: LmpressError | None = None
        try:
            # Each replica reads and adds to the cache in `cache_dir` on its own machine: one
            # cache for all where that is a shared filesystem, else one each.
            self.cache = ResponseCache.open(config, cache, cache_dir, _warn)
            self.engine = create_engine(config)
        except LmpressError as exc:
            # Raised from the first call instead: an actor that dies in its constructor is
            # restarted over and over, and what reaches the driver is Ray's text, not this.
            self.broken = exc
            return
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="lmpress-replica", daemon=True).start()

    async def __call__(self, batch: pa.Table) -> dict[str, list[bytes]]:
        if self.broken is not None:
            raise self.broken
        seqs = batch.column("seq").to_pylist()
        skips = batch.column("skipped").to_pylist()
        lines = batch.column("line").to_pylist()
        calls = [
            asyncio.run_coroutine_threadsafe(self._outcome(seq, skipped, line), self.loop)
            for seq, skipped, line in zip(seqs, skips, lines, strict=True)
        ]
        outcomes = await asyncio.gather(*(asyncio.wrap_future(call) for call in calls))
        if self.cache is not None:  # an actor is never closed: what it kept is written now
            self.cache.flush()
        return {"outcome": [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in outcomes]}

    async def _outcome(self, seq: int, skipped: int, pickled: bytes | None) -> Outcome:
        if pickled is None:
            return Outcome(seq, skipped)
        line: Line = pickle.loads(pickled)
        _, read = self.parser.read(line)
        if isinstance(read, RowFailure):
            return Outcome(seq, skipped, failure=read)
        row, request = read
        key, hit = self.cache.lookup(request) if self.cache is not None else (None, None)
        if hit is not None:
            return Outcome(seq, skipped, row, finished(request, hit))
        started = time.perf_counter()
        try:
            result = await run_request(self.engine, request, self.cache, key)
        except Exception as exc:  # one row's failure must not fail the call's other rows
            result = error_result(request, self.engine, failure_info(exc), started)
        return Outcome(seq, skipped, row, result, kept=key is not None)


def _warn(message: str) -> None:
    logging.getLogger("lmpress").warning(message)
