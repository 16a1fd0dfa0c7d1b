"""Which request in flight a LLAMACPP request that scores its prompt takes its first KV cells
from, and when. The choices of one question (engines/scoring.py submits them together) share
their context: the first reads it, the others start beside it, wait until its cells hold the
context, take them (`Sequences.fork`: shared in a unified cache, copied in a split one) and read
only the rest, so a four-way question costs little more than one. A request that only
generates keeps to the cells free sequences keep (`Sequences.choose`): its reply stays as it
was, whatever else is in flight."""

from __future__ import annotations

from lmpress.engines.local.llamacpp.rows import Fork, LlamaCppSubmission, SequenceRow
from lmpress.engines.local.llamacpp.sequences import KEPT_PREFIX, Sequences, common_prefix


def fork_source(
    submission: LlamaCppSubmission,
    prefilling: list[LlamaCppSubmission],
    generating: list[SequenceRow],
    sequences: Sequences,
) -> Fork | None:
    """The request in flight whose prompt begins as this one's for the most tokens, up to its
    `first_logits`: at least KEPT_PREFIX of them, and more than the request keeps from its
    own sequence already (`fed`) or a free one keeps. None for a request that only generates,
    one with images (their ids are placeholders), or none that fits."""
    if submission.prompt_logprobs is None or submission.media:
        return None
    live = {s.rows[0].seq_id: s for s in prefilling if not (s.media or s.awaiting)}
    live.update({row.seq_id: row.submission for row in generating})
    prompt, most = submission.prompt_ids, submission.first_logits
    best = None
    length = max(KEPT_PREFIX - 1, submission.fed, sequences.cached_prefix(prompt))
    for seq, source in live.items():
        common = min(common_prefix(source.prompt_ids, prompt), most)
        if common > length:
            best, length = seq, common
    return None if best is None else Fork(live[best], best, length)


def settle(submission: LlamaCppSubmission, sequences: Sequences) -> int:
    """Take the KV cells the request awaits if its source holds them now (the tokens taken),
    or read the prompt itself if the source failed or was cancelled (its cells are gone). The
    scheduler runs it when the request starts and after every step, so a source that ended
    is taken from before its free sequence can go to another request."""
    fork = submission.awaiting
    if fork is None:
        return 0
    if fork.source.rows[0].finish_reason in ("cancelled", "error"):
        submission.awaiting = None
        return 0
    if fork.source.fed < fork.length:
        return 0
    sequences.fork(fork.seq, submission.rows[0].seq_id, fork.length)
    taken = fork.length - submission.fed
    submission.fed, submission.awaiting = fork.length, None
    return taken
