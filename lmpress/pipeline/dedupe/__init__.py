"""A dedupe step's decision: keep a row, or drop it as a repeat of an earlier one.

The core's barrier feeds every row of the step in key order (input order), so "earlier" is the
same on every run and a rerun drops the same rows. The first row of a group is kept and
remembered; a later one is dropped with a reason naming the kept row's key.

Three methods, chosen by `method` (`settings.py` holds the keys and defaults):
- exact (`exact.py`): a 128-bit digest of the chosen columns' names and normalised values; only
  digests and keys are kept (`digest_index.py`, about 30 bytes a kept row).
- minhash (`minhash.py`): Jaccard similarity of the texts' shingles, estimated by datasketch's
  MinHash and found by its LSH index (approximate: a pair just above the threshold can be
  missed).
- embedding (`embedding.py`): cosine similarity of the vectors the core's `embed` function gives
  (the step's model), `batch_size` texts a call through `decide_all`.

Each deduplicator also offers `decide_all(items)`, an async iterator of (key, reason or None)
over an async iterator of (key, row): the core prefers it, so the embedding method can batch."""

from __future__ import annotations

from typing import Any, Protocol

from lmpress.pipeline.dedupe.base import Embed, RowDeduplicator
from lmpress.pipeline.dedupe.exact import ExactDeduplicator
from lmpress.pipeline.dedupe.settings import DedupeSettings, dedupe_settings
from lmpress.vocabulary.errors import ConfigError

__all__ = ["DedupeSettings", "Deduplicator", "build_deduplicator", "dedupe_settings"]


class Deduplicator(Protocol):
    async def duplicate_of(self, key: str, row: dict) -> str | None:
        """None: keep the row (and remember it); else why it is dropped, naming the kept key."""
        ...


def build_deduplicator(
    settings: dict[str, Any] | DedupeSettings, embed: Embed | None = None, *, where: str = ""
) -> RowDeduplicator:
    """The deduplicator a dedupe step's settings describe. `embed` is required for method
    embedding and refused for the others. `where` (the file and the step) starts each error's
    line; without it the line starts at the key, for a caller that adds them itself."""
    if not isinstance(settings, DedupeSettings):
        settings = dedupe_settings(settings, where)
    if (settings.method == "embedding") != (embed is not None):
        need = "needs an" if embed is None else "takes no"
        problem = f"method {settings.method} {need} embedding model"
        raise ConfigError(f"{where}: {problem}" if where else problem)
    if settings.method == "exact":
        return ExactDeduplicator(settings)
    if settings.method == "minhash":
        from lmpress.pipeline.dedupe.minhash import MinHashDeduplicator

        return MinHashDeduplicator(settings)
    from lmpress.pipeline.dedupe.embedding import EmbeddingDeduplicator

    assert embed is not None
    return EmbeddingDeduplicator(settings, embed)
