"""LLAMACPP's beam searches (engines/local/beams.py) over its sequences: a request with k beams
holds k `SequenceRow`s, each a sequence of the batched context. After each step a beam that
continues another takes that beam's sequence, and a beam continued twice is copied into the
sequence of one dropped (`Sequences.copy`: shared cells in a unified cache)."""

from __future__ import annotations

from collections.abc import Callable

from lmpress.engines.local.beams import BeamGroup, log_softmax
from lmpress.engines.local.llamacpp.loading import Vocab
from lmpress.engines.local.llamacpp.rows import LlamaCppSubmission, SequenceRow
from lmpress.engines.local.llamacpp.sampling import Sampling
from lmpress.engines.local.llamacpp.sequences import Sequences


class BeamSearches:
    """The context's beam searches, by request."""

    def __init__(self, sequences: Sequences, sampling: Sampling, vocab: Vocab) -> None:
        self.sequences, self.sampling, self.vocab = sequences, sampling, vocab
        self.groups: dict[LlamaCppSubmission, BeamGroup] = {}

    def __contains__(self, submission: LlamaCppSubmission) -> bool:
        return submission in self.groups

    def start(self, submission: LlamaCppSubmission, limit: int) -> None:
        ends = set(self.vocab.end_ids())
        self.groups[submission] = BeamGroup(submission.rows, limit, ends, submission.request.params)

    def drop(self, submission: LlamaCppSubmission) -> None:
        self.groups.pop(submission, None)

    def step(
        self,
        submission: LlamaCppSubmission,
        indices: list[int],
        finish: Callable[[SequenceRow], None],
    ) -> None:
        """A step over the rows' logits (batch rows `indices`): each row's sequence becomes
        the one of the beam it continues, and each row decodes its beam's new token next. A
        search that ends gives its rows their replies (`_end`) and `finish`es them all."""
        import numpy as np

        group = self.groups[submission]
        logits = np.stack([self.sampling.logits(i) for i in indices])
        continues, tokens = group.step(log_softmax(logits))
        rows = group.rows
        held = [row.seq_id for row in rows]
        taken: dict[int, int] = {}  # parent beam: the row that took its sequence
        for i, parent in enumerate(continues):
            taken.setdefault(parent, i)
        spare = [seq for beam, seq in enumerate(held) if beam not in taken]
        for i, (row, parent) in enumerate(zip(rows, continues, strict=True)):
            if taken[parent] == i:
                row.seq_id = held[parent]
            else:
                row.seq_id = spare.pop()
                self.sequences.clear(row.seq_id)
                self.sequences.copy(held[parent], row.seq_id)
        for row, token in zip(rows, tokens, strict=True):
            row.next_token, row.generated = token, group.generated
        if group.done:
            self._end(submission, group)
            for row in rows:
                finish(row)

    def _end(self, submission: LlamaCppSubmission, group: BeamGroup) -> None:
        """Give the best hypotheses to the first rows, as their samples; every row's sequence
        keeps only the prompt's cells, for a later request that starts the same way."""
        del self.groups[submission]
        replies = group.replies(submission.request.params.n)
        row: SequenceRow
        for i, row in enumerate(group.rows):
            tokens, reason, generated = replies[i] if i < len(replies) else ([], "length", 0)
            row.tokens, row.finish_reason, row.generated = tokens, reason, generated
            pieces = b"".join(self.vocab.piece(t, special=row.special_pieces) for t in tokens)
            row.text = row.decoder.decode(pieces)
            row.pos = len(submission.prompt_ids)
            self.sequences.trim(row.seq_id, row.pos)
