"""NATIVE's beam searches (engines/local/beams.py) over its batch's rows: a request with k beams
holds k `BatchRow`s, each step hands its group those rows' logits, and each row's KV slot then
takes the slot of the beam it continues (`BatchCache.reorder`, which the scheduler runs once the
step's own column is kept)."""

from __future__ import annotations

from typing import Any

from lmpress.engines.local.beams import BeamGroup
from lmpress.engines.local.worker import Submission


def beam_log_probs(logits: Any) -> Any:
    """A beam search's log-probabilities as transformers' takes them: torch's log_softmax of
    the float32 logits (a float32 array, beams.py's)."""
    import torch

    return torch.log_softmax(logits.float(), dim=-1).cpu().numpy()


class BeamSearches:
    """The batch's beam searches, by request."""

    def __init__(self) -> None:
        self.groups: dict[Submission, BeamGroup] = {}

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __contains__(self, submission: Submission) -> bool:
        return submission in self.groups

    def start(self, submission: Submission, rows: list, limit: int, eos_ids: set[int]) -> None:
        self.groups[submission] = BeamGroup(rows, limit, eos_ids, submission.request.params)

    def first(self, submission: Submission, rows: list, logits: Any) -> None:
        """The first step, from the prompt's last logits: every beam continues the prompt,
        whose cache each row starts from."""
        group = self.groups[submission]
        _, tokens = group.step(beam_log_probs(logits.repeat(len(rows), 1)))
        for row, token in zip(rows, tokens, strict=True):
            row.last, row.generated = token, group.generated
        self._end_if_done(submission, group)

    def step(self, rows: list, logits: Any, joined: dict) -> list[tuple[int, int]]:
        """A step of every search among `rows` (the batch's, whose logits these are);
        returns the (slot, slot it now continues) of each beam whose row took another's
        place. `joined`: the requests in the batch (a search whose prefill failed is not)."""
        slot = {id(row): b for b, row in enumerate(rows)}
        moves = []
        for submission, group in list(self.groups.items()):
            if submission not in joined:
                del self.groups[submission]
                continue
            if submission.cancelled:
                for row in group.rows:
                    row.finish_reason = "cancelled"
                del self.groups[submission]
                continue
            slots = [slot[id(row)] for row in group.rows]
            continues, tokens = group.step(beam_log_probs(logits[slots]))
            for row, token in zip(group.rows, tokens, strict=True):
                row.last, row.generated = token, group.generated
            moves += [(slots[i], slots[c]) for i, c in enumerate(continues) if c != i]
            self._end_if_done(submission, group)
        return moves

    def _end_if_done(self, submission: Submission, group: BeamGroup) -> None:
        """Give a finished search's best hypotheses to its first rows, as their samples."""
        if not group.done:
            return
        del self.groups[submission]
        replies = group.replies(submission.request.params.n)
        for row, (tokens, reason, generated) in zip(group.rows, replies, strict=False):
            row.tokens, row.finish_reason, row.generated = tokens, reason, generated
        for row in group.rows[len(replies) :]:
            row.finish_reason = "length"  # a beam beyond n: it only leaves the batch
