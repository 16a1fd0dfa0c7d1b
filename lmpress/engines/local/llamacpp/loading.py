"""Loading for LLAMACPP: the GGUF file a recipe names (a path, a packaged or tiny model, or
Oumi's repo-and-filename form), llama-cpp-python's `Llama` built from `model.model_kwargs`
(each a setting of options.py or one of its parameters), the batched context the engine decodes
in, the chat template, and the GGUF's tokenizer token by token (`Vocab`).
"""

from __future__ import annotations

import ctypes
import inspect
import threading
from pathlib import Path
from typing import Any

from lmpress.builtin_models.names import did_you_mean
from lmpress.builtin_models.packaged import resolve_packaged_name
from lmpress.builtin_models.tiny_gguf import resolve_gguf_name
from lmpress.configs.schema import ModelParams, RunConfig
from lmpress.engines.common.prompts import resolve_chat_template
from lmpress.engines.local.llamacpp.options import LlamaCppOptions
from lmpress.engines.options import check_passed_through
from lmpress.vocabulary.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"


def gguf_path(name: str, key: str = "model.model_name") -> str:
    """The local GGUF file `model.model_name` (or the config `key`) names, checked to exist
    and to be GGUF."""
    if not name:
        raise ModelLoadError(f"{key} is empty; give the path of a .gguf file")
    path = Path(resolve_gguf_name(resolve_packaged_name(name))).expanduser()
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f" (it holds {', '.join(ggufs[:3])})" if ggufs else ""
        raise ModelLoadError(f"{key}: '{name}' is a directory; give the path of a .gguf file{hint}")
    if not path.is_file():
        raise ModelLoadError(
            f"{key}: '{name}' does not exist{did_you_mean(name)}; the LLAMACPP engine loads "
            f"a local .gguf file (it downloads nothing)"
        )
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"{key}: '{name}' is not a GGUF file; convert the model with llama.cpp's "
            f"convert_hf_to_gguf.py, or use an engine that reads this format"
        )
    return str(path)


def oumi_gguf_file(model: ModelParams) -> str | None:
    """Oumi's form: `model_name` a hub repo or a directory, `model_kwargs.filename` the GGUF
    file in it. A directory is joined with the file name; a repo is looked up in the Hugging
    Face cache, since LLAMACPP downloads nothing. None when no filename is given."""
    filename = model.model_kwargs.get("filename")
    if filename is None:
        return None
    if not isinstance(filename, str) or not filename:
        raise ModelLoadError("model.model_kwargs.filename: give the GGUF file's name")
    directory = Path(model.model_name).expanduser()
    if directory.is_dir():
        return str(directory / filename)
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model.model_name, filename, revision=model.model_revision)
    except Exception:  # not a repo id either (a path that does not exist)
        cached = None
    if isinstance(cached, str):
        return cached
    raise ModelLoadError(
        f"model.model_kwargs.filename: '{filename}' of '{model.model_name}' is neither in a "
        f"local directory nor in the Hugging Face cache; the LLAMACPP engine downloads nothing: "
        f"run `hf download {model.model_name} {filename}` first"
    )


def extra_bufts_are_safe(system_info: str) -> bool:
    """Whether llama.cpp's extra weight buffer types may be used, given its system info line.

    A build with Intel AMX kernels (`AMX_INT8 = 1`: built with native flags on a CPU that has
    AMX) stores quantized weights in an AMX buffer, and decoding a multi-token batch through it
    crashes the process (SIGSEGV in ggml_backend_amx_mul_mat; ggml-org/llama.cpp#20824). Such a
    build loads weights without the extra buffer types. Everywhere else the CPU repack layouts
    (Q4_0, Q4_K, IQ4_NL and Q8_0 weights on AVX2) stay on, as llama.cpp's default.
    """
    return "AMX_INT8 = 1" not in system_info


_LOAD_LOCK = threading.Lock()


def load_llama(path: str, kwargs: dict[str, Any], *, extra_bufts: bool | None = None) -> Any:
    """llama-cpp-python's `Llama` for `path`, its weights in the extra buffer types or not
    (None: as `extra_bufts_are_safe` says for this llama.cpp build).

    `Llama` has no keyword for `llama_model_params.use_extra_bufts`: it starts from
    `llama_model_default_params()` and loads the weights within its constructor. For the
    length of that call its defaults come with the extra buffer types off; the lock keeps two
    loads from overlapping.
    """
    from llama_cpp import Llama, llama_print_system_info
    from llama_cpp import llama as llama_module

    if extra_bufts is None:
        extra_bufts = extra_bufts_are_safe(llama_print_system_info().decode())
    if extra_bufts:
        return Llama(model_path=path, **kwargs)
    low = llama_module.llama_cpp  # the ctypes bindings `Llama` reads its defaults from
    defaults = low.llama_model_default_params

    def without_extra_bufts() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    with _LOAD_LOCK:
        low.llama_model_default_params = without_extra_bufts
        try:
            return Llama(model_path=path, **kwargs)
        finally:
            low.llama_model_default_params = defaults


def llama_kwargs(kwargs: dict[str, Any], llama_class: type) -> dict[str, Any]:
    """The recipe's model_kwargs for `Llama`, checked: as settings (options.py, as when the
    config loaded), and each other key against `Llama`'s constructor, which would ignore it."""
    LlamaCppOptions.of(kwargs)
    accepted = [
        name
        for name, p in inspect.signature(llama_class.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    check_passed_through(LlamaCppOptions, kwargs, accepted)
    return dict(kwargs)


# llama.cpp rounds the context it is asked for up to a multiple of this many tokens.
CONTEXT_PAD = 256
# The most tokens in one pass over the weights (llama.cpp's n_ubatch), unless the recipe sets
# it. Over a shared KV cache a pass holds the tokens of every sequence in it, and llama.cpp's
# CPU flash attention takes a tiled kernel, which rounds differently, for 64 (GGML_FA_TILE_Q)
# or more: below that, a sequence's attention is computed alike whatever else the pass holds,
# so greedy replies do not depend on which rows are in flight beside them (and a pass of 63
# tokens already keeps a CPU's matrix units busy).
MICRO_BATCH = 63


def parallel_sequences(batch_size: int) -> int:
    """How many sequences the engine decodes together: generation.batch_size, up to
    llama.cpp's limit."""
    import llama_cpp

    return min(batch_size, llama_cpp.llama_max_parallel_sequences())


def sequence_context(n_ctx: int, batch_size: int) -> int:
    """Each sequence's part of a KV cache of `n_ctx` tokens (as llama.cpp made it) split among
    `batch_size` sequences. llama.cpp wants equal parts, each a multiple of 256; the engine
    asks for that rather than let it round (and warn)."""
    if batch_size <= 1:
        return n_ctx
    return max(CONTEXT_PAD, n_ctx // batch_size // CONTEXT_PAD * CONTEXT_PAD)


def planned_context(n_ctx: int, n_ctx_train: int | None, split: int = 1) -> int | None:
    """The context a sequence may use, known before loading the model: `model_kwargs.n_ctx`
    (0: the model's own, `n_ctx_train`), rounded up by llama.cpp, and over a split cache
    (drafting, see batched_context) its part of `split`. None: the size is not known."""
    wanted = n_ctx or n_ctx_train
    if not wanted:
        return None
    return sequence_context(-(-wanted // CONTEXT_PAD) * CONTEXT_PAD, split)


def batched_context(
    llama: Any,
    path: str,
    kwargs: dict[str, Any],
    batch_size: int,
    images: bool = False,
    split: bool = True,
) -> Any:
    """A context like the one `Llama` made from the recipe's kwargs, but holding
    `batch_size` sequences. `split` (the default): each gets an equal part of the KV cache (a
    multiple of 256, as llama-server's `-np` without `--kv-unified`), so a step costs the same
    whatever the others hold. Otherwise (`model_kwargs.kv_unified: true`) they share one cache
    (llama.cpp's unified cache, as llama-server's `--kv-unified`): any one of them may use the
    whole context and the scheduler admits rows while their cells fit, but on a CPU every
    token's attention then walks every sequence's cells, and a shared cache keeps a sequence's
    cells in position order only while none are freed behind it (drafting frees the drafts
    rows did not keep each step), so greedy replies may move at a near-tie with what else is
    in flight: drafting engines keep the split cache. `images`: it decodes images too, whose
    tokens may need a pass of their own (a non-causal projector's), so passes stay as large
    as `Llama` made them. `Llama`'s own single-sequence context is freed first so that the KV
    memory is not held twice."""
    import llama_cpp as lc
    from llama_cpp import _internals

    params = lc.llama_context_params.from_buffer_copy(llama.context_params)
    params.n_ctx = (
        sequence_context(llama.n_ctx(), batch_size) * batch_size if split else llama.n_ctx()
    )
    params.n_seq_max = batch_size
    params.kv_unified = not split
    # Every sequence in flight contributes a token to each step's batch.
    params.n_batch = max(params.n_batch, batch_size)
    if split or images:
        params.n_ubatch = max(params.n_ubatch, batch_size)
    elif "n_ubatch" not in kwargs:
        params.n_ubatch = MICRO_BATCH
    if "flash_attn" not in kwargs:
        # llama.cpp's own default (llama-cpp-python turns it off): faster on CPU too, and over
        # a shared cache it skips the cells of other sequences instead of multiplying by them.
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_AUTO
    llama._ctx.close()
    try:
        return _internals.LlamaContext(
            model=llama._model, params=params, verbose=bool(kwargs["verbose"])
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot create a llama.cpp context for '{path}': {exc}") from exc


def load_vocab(path: str) -> Any:
    """The GGUF file's tokenizer and metadata without its weights (llama.cpp's `vocab_only`):
    llama-cpp-python's `LlamaModel`, as `Llama._model` is, in a fraction of a second."""
    import llama_cpp
    from llama_cpp import _internals

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    try:
        return _internals.LlamaModel(path_model=path, params=params, verbose=False)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the vocabulary of '{path}': {exc}") from exc


def trained_context(metadata: dict[str, str]) -> int | None:
    """The context the model was trained with, from its GGUF metadata (a vocabulary-only load
    reports none itself)."""
    value = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    return int(value) if value and value.isdigit() else None


def chat_template(config: RunConfig, metadata: dict[str, str]) -> str | None:
    """The recipe's model.chat_template, else the one in the GGUF metadata (None: neither)."""
    if config.model.chat_template:
        return resolve_chat_template(config.model.chat_template)
    return metadata.get("tokenizer.chat_template")


class Vocab:
    """The GGUF file's tokenizer, one token at a time: its text, and the bytes it decodes to."""

    def __init__(self, llama: Any):
        import llama_cpp

        self._lc = llama_cpp
        self.vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self.size = llama.n_vocab()
        self._piece = ctypes.create_string_buffer(256)
        self._end_ids: list[int] | None = None  # filled on first use (min_tokens)

    def text(self, token: int) -> str:
        """A token as the vocabulary spells it ('' for none: a negative id)."""
        if token < 0:
            return ""
        return self._lc.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def piece(self, token: int, special: bool) -> bytes:
        """The bytes a token adds to the reply; special tokens give none unless `special`.
        For the worker thread, whose buffer it reuses."""
        data, self._piece = self._read_piece(token, special, self._piece)
        return data

    def decode(self, tokens: list[int], special: bool) -> str:
        """Tokens as text, from any thread (a buffer of its own)."""
        buffer, pieces = ctypes.create_string_buffer(256), []
        for token in tokens:
            data, buffer = self._read_piece(token, special, buffer)
            pieces.append(data)
        return b"".join(pieces).decode("utf-8", errors="replace")

    def _read_piece(self, token: int, special: bool, buffer: Any) -> tuple[bytes, Any]:
        """A token's bytes, read into `buffer` (grown when too short: the buffer used)."""
        n = self._lc.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, special)
        if n < 0:  # longer than the buffer: grow it and ask again
            buffer = ctypes.create_string_buffer(-n)
            n = self._lc.llama_token_to_piece(self.vocab, token, buffer, -n, 0, special)
        return buffer.raw[:n], buffer

    def string(self, token: int) -> str:
        """A token as a row reports it in its logprobs: special tokens written out, so an end
        token reads as itself (as NATIVE and vLLM write them), whatever the reply's text
        keeps."""
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    def is_end(self, token: int) -> bool:
        """Whether a token ends generation (EOS, EOT and the like)."""
        return self._lc.llama_vocab_is_eog(self.vocab, token)

    def end_ids(self) -> list[int]:
        if self._end_ids is None:
            self._end_ids = [t for t in range(self.size) if self.is_end(t)]
        return self._end_ids
