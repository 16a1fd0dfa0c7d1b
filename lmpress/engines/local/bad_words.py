"""`generation.bad_words` on the local engines, as vLLM defines them: words a reply may never
write. Each word becomes the token sequences that write it, at the start of a reply and after
a space (tokenizers that mark a word's leading space write it with other tokens); a reply whose
tokens so far end with all but the last token of a sequence may not take that last one next. A
word of one token is never written at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lmpress.vocabulary.errors import ErrorKind, RequestError


def word_sequences(words: Sequence[str], encode: Callable[[str], list[int]]) -> list[list[int]]:
    """The token sequences of `words` under `encode` (text to ids, no special tokens). The
    form after a space is kept where it is a word of its own: it starts with another token and
    takes as many as the bare form (vLLM's rule, so both engines ban what vLLM bans)."""
    sequences: list[list[int]] = []
    for word in words:
        bare = encode(word.lstrip())
        if not bare:
            raise RequestError(
                f"generation.bad_words: {word!r} writes no token; give words with text",
                kind=ErrorKind.INVALID_REQUEST,
            )
        sequences.append(bare)
        spaced = encode(" " + word.lstrip())
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return sequences


def banned_next(sequences: list[list[int]], tokens: list[int]) -> list[int]:
    """The tokens a reply that has written `tokens` may not write next."""
    banned = []
    for sequence in sequences:
        before = len(sequence) - 1
        if before > len(tokens):
            continue
        if before == 0 or tokens[-before:] == sequence[:-1]:
            banned.append(sequence[-1])
    return banned
