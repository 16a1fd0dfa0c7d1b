"""Images on LLAMACPP: llama.cpp's multimodal library (libmtmd, `llama_cpp.mtmd_cpp`) with the
projector GGUF that `model.model_kwargs.mmproj` names.

`Projector.tokenize` splits a rendered prompt at its image markers into text tokens and image
segments (mtmd_tokenize, which also resizes and normalises each image for its encoder). The
prompt's ids hold, at each image token's place, a negative id derived from the image's
pixels: the scheduler's prefix reuse then shares a prefix only across the same image, and the
samplers never see them. The worker encodes a segment when its prefill reaches it
(`Projector.encode`) and decodes the embeddings into the row's sequence itself, so image rows
batch with the others (scheduling.py).

Projectors whose image tokens take 2-D positions (M-RoPE: Qwen2-VL and its kind) are refused:
the scheduler gives each token one position.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
import zlib
from dataclasses import dataclass, field
from typing import Any

from lmpress.vocabulary.errors import ErrorKind, ModelLoadError, RequestError


@dataclass(eq=False)
class ImageSegment:
    """One image of a prompt: where its tokens start and how many, the mtmd chunk that holds
    its preprocessed pixels, and its embeddings once encoded ([n_tokens, n_embd] float32)."""

    start: int
    n_tokens: int
    chunk: Any
    non_causal: bool = False  # its tokens attend to each other both ways (Gemma 3's kind)
    embeddings: Any = None
    _free: Any = field(default=None, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    def release(self) -> None:
        """Free the chunk (its pixels); the embeddings stay."""
        if self._free is not None:
            self._free()
            self._free = None


class Projector:
    """A loaded projector over the engine's text model (see the module docstring)."""

    def __init__(self, path: str, llama_model: Any, n_threads: int):
        from llama_cpp import _logger, mtmd_cpp

        self._m = mtmd_cpp
        # libmtmd logs through llama-cpp-python's logger, which keeps quiet unless verbose.
        mtmd_cpp.mtmd_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = False  # lmpress's LLAMACPP runs on the CPU
        params.n_threads = n_threads
        params.print_timings = False
        self.ctx = mtmd_cpp.mtmd_init_from_file(path.encode(), llama_model, params)
        if not self.ctx:
            raise ModelLoadError(
                f"model.model_kwargs.mmproj: llama.cpp cannot load '{path}' as a projector for "
                f"this model (is it the model's own mmproj GGUF? its projection size must be "
                f"the model's embedding size)"
            )
        if not mtmd_cpp.mtmd_support_vision(self.ctx):
            self.close()
            raise ModelLoadError(f"model.model_kwargs.mmproj: '{path}' has no vision encoder")
        if mtmd_cpp.mtmd_decode_use_mrope(self.ctx):
            self.close()
            raise ModelLoadError(
                f"model.model_kwargs.mmproj: '{path}' places image tokens with 2-D positions "
                f"(M-RoPE), which lmpress's LLAMACPP engine does not support; use NATIVE or VLLM"
            )
        self.marker = mtmd_cpp.mtmd_default_marker().decode()
        # mtmd_tokenize runs on the caller's thread, mtmd_encode on the worker's: one at a time.
        self._lock = threading.Lock()

    def tokenize(self, text: str, images: list[Any]) -> tuple[list[int], list[ImageSegment]]:
        """The prompt's ids (image tokens as negative ids) and its image segments. `text` holds
        one marker per image; `images` are RGB Pillow images in the same order."""
        m = self._m
        bitmaps = [self._bitmap(image) for image in images]
        chunks = m.mtmd_input_chunks_init()
        try:
            raw = text.encode("utf-8")
            # The chat template writes BOS itself, as for text rows.
            given = m.mtmd_input_text(raw, len(raw), False, True)
            array = (m.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            with self._lock:
                code = m.mtmd_tokenize(self.ctx, chunks, ctypes.byref(given), array, len(bitmaps))
            if code != 0:
                why = "markers and images do not match" if code == 1 else "preprocessing failed"
                raise RequestError(
                    f"llama.cpp could not read this row's {len(images)} image(s): {why}",
                    kind=ErrorKind.INVALID_REQUEST,
                )
            return self._segments(chunks, images)
        finally:
            m.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                m.mtmd_bitmap_free(bitmap)

    def _bitmap(self, image: Any) -> Any:
        data = image.tobytes()
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return self._m.mtmd_bitmap_init(image.width, image.height, buffer)

    def _segments(self, chunks: Any, images: list[Any]) -> tuple[list[int], list[ImageSegment]]:
        m = self._m
        ids: list[int] = []
        segments: list[ImageSegment] = []
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t(0)
                tokens = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                ids += tokens[: count.value]
                continue
            n_tokens = m.mtmd_input_chunk_get_n_tokens(chunk)
            image = images[len(segments)]
            # The same pixels give the same id, so only the same image shares a prefix.
            marker_id = -1 - (zlib.crc32(image.tobytes()) & 0x7FFFFFFF)
            owned = m.mtmd_input_chunk_copy(chunk)
            non_causal = bool(m.mtmd_decode_use_non_causal(self.ctx, chunk))
            segment = ImageSegment(len(ids), n_tokens, owned, non_causal)
            segment._free = weakref.finalize(segment, m.mtmd_input_chunk_free, owned)
            segments.append(segment)
            ids += [marker_id] * n_tokens
        return ids, segments

    def encode(self, segment: ImageSegment, n_embd: int) -> Any:
        """The segment's embeddings, [n_tokens, n_embd] float32, computed by the encoder."""
        import numpy as np

        m = self._m
        with self._lock:
            code = m.mtmd_encode_chunk(self.ctx, segment.chunk)
            if code != 0:
                raise RuntimeError(f"mtmd_encode_chunk returned {code}")
            out = m.mtmd_get_output_embd(self.ctx)
            size = segment.n_tokens * n_embd
            embeddings = np.ctypeslib.as_array(out, shape=(size,)).copy()
        segment.release()
        return embeddings.reshape(segment.n_tokens, n_embd)

    def close(self) -> None:
        if self.ctx:
            self._m.mtmd_free(self.ctx)
            self.ctx = None


def load_projector(name: Any, llama: Any) -> Projector | None:
    """The projector `model.model_kwargs.mmproj` names (a path, or a tiny-gguf: name), over
    the loaded `Llama`'s model; None when none is named."""
    if name is None:
        return None
    from lmpress.engines.local.llamacpp.loading import gguf_path

    if not isinstance(name, str):
        raise ModelLoadError(f"model.model_kwargs.mmproj: '{name}' is not a path to a GGUF file")
    path = gguf_path(name, "model.model_kwargs.mmproj")
    return Projector(path, llama._model.model, llama.context_params.n_threads)


def text_ids(ids: list[int]) -> list[int]:
    """A prompt's text tokens: its image tokens (negative ids) left out."""
    return [token for token in ids if token >= 0]
