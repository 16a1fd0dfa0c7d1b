"""What every engine that embeds does to its vectors after the model: the request's
`normalize` (vocabulary/embeddings.py), applied the same way whatever pooled them."""

from __future__ import annotations

from lmpress.vocabulary.embeddings import EmbedRequest, EmbedResult


def finish_embeddings(result: EmbedResult, request: EmbedRequest) -> EmbedResult:
    """The request's `normalize` (an L2 normalisation) applied to the vectors as the model
    pooled them; a zero vector stays as it is."""
    if result.error is None and request.normalize:
        import numpy as np

        for embedding in result.embeddings:
            vector = np.asarray(embedding.vector, dtype=np.float32)
            norm = float(np.linalg.norm(vector))
            embedding.vector = vector / norm if norm > 0 else vector
    return result
