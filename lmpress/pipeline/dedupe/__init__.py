"""A dedupe step's decision: keep a row, or drop it as a repeat of an earlier one.

The dedupe step is a barrier: it feeds every row in key order (input order), so "earlier" is the
same on every run and a rerun drops the same rows. The first row of a group is kept and
remembered; a later one is dropped with a reason naming the kept row's key.

A row is compared by its `columns` (every string column, by name, when unset); a string is
case-folded and its whitespace collapsed when `normalize` is on (the default but for embedding).

Three methods, chosen by `method` (`settings.py` holds the keys and defaults), and what each
remembers of a kept row:
- exact (`exact.py`): a 128-bit digest of the columns' names, types and values; only digests and
  keys are kept (`digest_index.py`): 29 bytes a kept row at 100,000 rows (tracemalloc).
- minhash (`minhash.py`): Jaccard similarity of the texts' shingles (word 3-grams by default),
  estimated by datasketch's MinHash and found by its LSH index (approximate: a pair just above
  the threshold can be missed): about 2.2 KB a kept row, most of it datasketch's band tables.
- embedding (`embedding.py`): cosine similarity of the vectors the step's `embed` function gives
  (the step's model): the unit vector, 4 bytes a dimension; each row is compared with every kept
  row (exact search: quadratic time, fine for tens of thousands of kept rows, not millions).

Each deduplicator also offers `decide_all(items)`, an async iterator of (key, reason or None)
over an async iterator of (key, row): the embedding method embeds `batch_size` texts a call
there, where `duplicate_of` embeds one; the others decide a row at a time either way."""

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
