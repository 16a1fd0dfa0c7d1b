"""The model names lmpress knows without a download, and the one closest to a name that is none.

A newcomer types a recipe's name as a model (`--model.model_name smollm2`), or misspells a
packaged one (`smollm2:135m-instruc`); neither is a file here nor (offline) a hub model. The
error that refuses it says which bundled name was probably meant.
"""

from __future__ import annotations

import difflib

from lmpress.builtin_models.packaged import MINILM_NAMES, NAMES
from lmpress.builtin_models.tiny import SPECS as TINY_SPECS
from lmpress.builtin_models.tiny import TINY_PREFIX
from lmpress.builtin_models.tiny_gguf import PROJECTORS, TINY_GGUF_PREFIX
from lmpress.builtin_models.tiny_gguf import SPECS as GGUF_SPECS
from lmpress.builtin_models.tiny_gguf_bert import BERTS

# Close enough to be a slip of the keyboard (`smolm2`, `tiny:lama`), not a different model:
# a real hub id such as `gpt2` is 0.62 from `tiny:gpt2` and is left alone.
CLOSE_ENOUGH = 0.8
REAL_NAMES = (*NAMES, *MINILM_NAMES[:1])  # the real weights, not the tiny random ones


def known_names() -> list[str]:
    """Every name `model.model_name` takes without a path or a download."""
    return [
        *NAMES,
        *MINILM_NAMES,
        *(TINY_PREFIX + name for name in TINY_SPECS),
        *(TINY_GGUF_PREFIX + name for name in [*GGUF_SPECS, *PROJECTORS, *BERTS]),
    ]


def is_known_name(name: str) -> bool:
    """Whether `name` is one of lmpress's own model names, or claims to be one by its prefix
    (`tiny:...`: its own resolver lists the choices)."""
    return name in known_names() or name.startswith((TINY_PREFIX, TINY_GGUF_PREFIX))


def closest_known_name(name: str) -> str | None:
    """The bundled name `name` most likely stands for, or None when none is close. A packaged
    model's family (`smollm2`, the recipe's name) stands for its first name, and a hub id is
    also compared by its last part (`HuggingFaceTB/SmolLM2-135M-Instruct`)."""
    aliases: dict[str, str] = {}
    for known in known_names():
        aliases.setdefault(known.lower(), known)
        if not known.startswith((TINY_PREFIX, TINY_GGUF_PREFIX)):
            aliases.setdefault(known.split(":")[0].lower(), known)
    wanted = {name.lower(), name.rsplit("/", 1)[-1].lower()}
    score = {alias: max(_likeness(w, alias) for w in wanted) for alias in aliases}
    best = max(score, key=score.__getitem__)
    if score[best] < CLOSE_ENOUGH or aliases[best] == name:
        return None
    return aliases[best]


def _likeness(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def did_you_mean(name: str) -> str:
    """' (did you mean the bundled 'X'?)' for a name close to a bundled one, else ''."""
    close = closest_known_name(name)
    return f" (did you mean the bundled '{close}'?)" if close else ""
