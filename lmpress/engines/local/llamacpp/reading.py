"""How LLAMACPP reads a prompt into its sequence: in chunks, many prompts' chunks in one
step's batch (as llama-server packs its slots' prompts), and which of a chunk's positions
return logits: the prompt's last (its first token is sampled there) and, for a request with
`prompt_logprobs`, each from the one before `Request.score_from` on, whose logits score the
prompt's own next token. The scheduler (scheduling.py) decides what a step holds; this is the
part of it that concerns a prompt being read."""

from __future__ import annotations

from lmpress.engines.local.llamacpp.batches import Batches
from lmpress.engines.local.llamacpp.rows import LlamaCppSubmission, PromptChunk
from lmpress.engines.local.llamacpp.sampling import Sampling

# The most tokens of one prompt read in one batch: a pass over the weights holds at most
# loading.MICRO_BATCH tokens, which keeps llama.cpp's CPU flash attention off its tiled kernel,
# so a prompt token's attention is computed alike however the prompt is cut and whatever is read
# beside it: packing prompts together (or reusing a cached prefix) leaves greedy replies as they
# are at batch size 1.
PROMPT_CHUNK = 63


def prompt_chunks(submissions: list[LlamaCppSubmission], room: int) -> list[PromptChunk]:
    """The next chunk of each prompt's text tokens (up to its next image, if any) that `room`
    tokens of this step's batch hold: one pass over the weights reads many prompts. Each
    chunk is at most PROMPT_CHUNK tokens, whatever the batch size, so a prompt is read the same
    way alone or beside others, and the prompts share the room equally."""
    share = min(PROMPT_CHUNK, max(1, room // max(1, len(submissions))))
    chunks = []
    for submission in submissions:
        images = [m.start for m in submission.media or () if m.start > submission.fed]
        end = min([submission.fed + min(share, room), len(submission.prompt_ids), *images])
        if end == submission.fed:
            break
        room -= end - submission.fed
        chunks.append(PromptChunk(submission, submission.rows[0].seq_id, end))
    return chunks


def put_chunk(batches: Batches, chunk: PromptChunk, n: int) -> int:
    """Write a chunk's tokens from batch row `n` on, the positions from the submission's
    `first_logits` on returning logits; the next free batch row."""
    submission = chunk.submission
    ids, first = submission.prompt_ids, submission.first_logits
    chunk.scored = max(submission.fed, first)
    chunk.scored_index = n + chunk.scored - submission.fed
    for pos in range(submission.fed, chunk.end):
        batches.put(n, ids[pos], pos, chunk.seq_id, pos >= first)
        n += 1
    chunk.batch_index = n - 1  # where its last logits are
    return n


def score_chunk(sampling: Sampling, chunk: PromptChunk) -> None:
    """Once the chunk is decoded: the logprob entries of the prompt tokens that its positions
    returning logits score (a request with `prompt_logprobs`), each from the one before."""
    submission = chunk.submission
    ids, entries = submission.prompt_ids, submission.prompt_logprobs
    end = min(chunk.end, len(ids) - 1)  # the last position's logits score no prompt token
    if entries is None or chunk.scored >= end:
        return
    params = submission.request.params
    targets = ids[chunk.scored + 1 : end + 1]
    entries[chunk.scored + 1 : end + 1] = sampling.prompt_entries(
        params, chunk.scored_index, targets
    )
