"""What every engine that embeds does to its vectors after the model: the request's
`normalize` (vocabulary/embeddings.py), applied the same way whatever pooled them, and an
embedding model's scores, the cosine of each pair's vectors."""

from __future__ import annotations

from typing import Any

from lmpress.vocabulary.embeddings import EmbedRequest, EmbedResult, ScoreRequest


def finish_embeddings(
    result: EmbedResult, request: EmbedRequest, model_normalizes: bool = False
) -> EmbedResult:
    """The request's `normalize` (an L2 normalisation) applied to the vectors as the model
    pooled them, or the model's own where the backend left it to the caller
    (`model_normalizes`: a GGUF's Normalize, which llama.cpp does not apply); a zero vector
    stays as it is."""
    if result.error is None and (request.normalize or model_normalizes):
        import numpy as np

        for embedding in result.embeddings:
            vector = np.asarray(embedding.vector, dtype=np.float32)
            norm = float(np.linalg.norm(vector))
            embedding.vector = vector / norm if norm > 0 else vector
    return result


def cosine_scores(request: ScoreRequest, vectors: Any) -> list[float]:
    """Each pair's score as vLLM's `LLM.score` gives it for an embedding model: the cosine of
    the query's vector and the document's. `vectors`: one a text of `request.texts()`."""
    import numpy as np

    array = np.asarray(vectors, dtype=np.float64)
    array /= np.maximum(np.linalg.norm(array, axis=1, keepdims=True), 1e-12)
    documents = array[len(array) - len(request.documents) :]
    firsts = array[: len(array) - len(request.documents)]
    return [float(score) for score in (firsts * documents).sum(axis=1)]
