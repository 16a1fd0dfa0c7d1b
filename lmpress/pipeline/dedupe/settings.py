"""A dedupe step's settings, checked when the pipeline loads: each method's keys, its defaults,
and one line naming the file, the step and the key when something is wrong."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lmpress.configs.loading import suggest
from lmpress.vocabulary.errors import ConfigError

Method = Literal["exact", "minhash", "embedding"]

# The settings each method reads; any other one set on the step is refused, not ignored.
METHOD_KEYS: dict[str, frozenset[str]] = {
    "exact": frozenset({"columns", "normalize"}),
    "minhash": frozenset(
        {"columns", "normalize", "threshold", "num_perm", "shingle", "shingle_size", "seed"}
    ),
    "embedding": frozenset({"columns", "normalize", "threshold", "batch_size"}),
}


class DedupeSettings(BaseModel):
    """A dedupe step's settings, as written in the pipeline file."""

    model_config = ConfigDict(strict=True, extra="forbid")

    method: Method
    # The columns compared; without them, every column whose value is a string.
    columns: list[str] | None = Field(default=None, min_length=1)
    # Case-fold and collapse whitespace before comparing: on for exact and minhash (a repeat that
    # differs in case or spacing is still a repeat); off for embedding (the model reads the text).
    normalize: bool | None = None
    # minhash: estimated Jaccard similarity; embedding: cosine similarity. A row at or above it
    # is dropped. 0.9 for minhash is datasketch's own default; 0.95 cosine keeps paraphrases.
    threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    num_perm: int = Field(default=128, ge=8, le=4096)
    # Word n-grams by default: near-duplicate sentences share most of their words in order.
    # Character n-grams suit short texts and texts without spaces (Chinese, Japanese).
    shingle: Literal["words", "chars"] = "words"
    shingle_size: int | None = Field(default=None, ge=1, le=64)
    seed: int = 1
    # How many rows' texts go to the embedding model in one call.
    batch_size: int = Field(default=64, ge=1, le=65536)

    @model_validator(mode="after")
    def _fill_defaults(self) -> DedupeSettings:
        extra = sorted(self.model_fields_set - METHOD_KEYS[self.method] - {"method"})
        if extra:
            raise ValueError(f"'{extra[0]}' does not apply to method {self.method}")
        if self.normalize is None:
            self.normalize = self.method != "embedding"
        if self.threshold is None:
            self.threshold = {"minhash": 0.9, "embedding": 0.95}.get(self.method)
        for needed in ("numpy", "datasketch") if self.method == "minhash" else ("numpy",):
            if find_spec(needed) is None:
                raise ValueError(
                    f"method {self.method} needs {needed}: pip install 'lmpress[dedupe]'"
                )
        if self.shingle_size is None:
            self.shingle_size = 3 if self.shingle == "words" else 5
        if self.method == "minhash":
            self._check_bands()
        return self

    def _check_bands(self) -> None:
        """datasketch's LSH chooses its bands from the threshold and num_perm; a high threshold
        over few permutations leaves it one band, which it refuses (0.99 at 128, 0.9 at 16)."""
        from datasketch import MinHashLSH

        try:
            MinHashLSH(threshold=self.threshold, num_perm=self.num_perm)
        except ValueError:
            raise ValueError(
                f"'threshold' {self.threshold:g} is too high for 'num_perm' {self.num_perm}"
                " (MinHash LSH needs 2 bands or more): lower it, or raise num_perm"
            ) from None


def dedupe_settings(settings: dict[str, Any], where: str = "") -> DedupeSettings:
    """The settings checked, or a ConfigError in one line: `where` (the file and the step, when
    the caller does not add them itself), the key and what is wrong with it."""
    try:
        return DedupeSettings.model_validate(settings)
    except ValidationError as exc:
        raise ConfigError(
            f"{where}: {_first_problem(exc)}" if where else _first_problem(exc)
        ) from None


def _first_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        return f"unknown key '{key}'{suggest(key, list(DedupeSettings.model_fields))}"
    if first["type"] == "missing":
        return f"'{key}' is required (one of: exact, minhash, embedding)"
    if not key:  # the validator's own message names the key
        return str(first["msg"]).removeprefix("Value error, ")
    return f"'{key}': {first['msg']} (got {first['input']!r})"
