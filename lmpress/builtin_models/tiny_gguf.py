"""Tiny real GGUF models written offline with the `gguf` package, for tests and benchmarks.

Nothing is downloaded: the vocabulary is built here from a word list and the weights are random
with a fixed seed. Two tokenizer families are covered, as llama.cpp names them in
`tokenizer.ggml.model`: "llama" (SentencePiece-style pieces with scores and byte fallback) and
"gpt2" (byte-level BPE with merges). Most use llama.cpp's "llama" architecture; `qwen2-q4k` is
a Qwen2 (attention biases, an untied output matrix) quantized to Q4_K_M by llama.cpp's own
quantize tool, and `gpt2-q8` stores Q8_0 weights: the quantized kernels real GGUFs take. `bert`
and `bert-rerank` are encoders for embeddings and reranking (tiny_gguf_bert.py).

    python -m lmpress.builtin_models.tiny_gguf llama        # prints the cached file's path
    python -m lmpress.builtin_models.tiny_gguf bench-100m   # ~100M parameters, for benchmarks/

The LLAMACPP engine resolves `model.model_name: tiny-gguf:NAME` to one of these files.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.builtin_models.tiny import (
    INST_TEMPLATE,
    THINK_TEMPLATE,
    THINK_TOKENS,
    WORDS,
    builder_main,
    cache_root,
)
from lmpress.builtin_models.tiny_gguf_bert import BERTS, BertSpec, write_bert
from lmpress.vocabulary.chat_templates import CHATML_TEMPLATE

# Bump when a builder changes, so cached files are rebuilt.
BUILDER_VERSION = 3

TINY_GGUF_PREFIX = "tiny-gguf:"

# gguf.TokenType values (kept here so the module imports without gguf installed).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


@dataclass(frozen=True)
class GgufSpec:
    name: str
    tokenizer: str  # "llama" (SentencePiece-style) | "gpt2" (byte-level BPE)
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    context: int
    # Wide enough that a random model's greedy reply depends on its prompt.
    init_std: float = 0.25
    dtype: str = "f32"  # of the matrices: f32, f16, q8_0 or q4_k_m; norms are always f32
    arch: str = "llama"  # or "qwen2"
    chat_template: bool = True  # False: a base model, for raw text only
    # A reasoning model (byte-level BPE only): `<think>` and `</think>` are tokens of their own,
    # user-defined as Qwen3's GGUFs mark them (read from text, written into it), and the chat
    # template is tiny.py's THINK_TEMPLATE: tiny:think's counterpart.
    thinks: bool = False


SPECS = {
    spec.name: spec
    for spec in (
        GgufSpec("llama", "llama", 600, 64, 2, 4, 2, 128, 2048),
        GgufSpec("gpt2", "gpt2", 1000, 64, 2, 4, 4, 160, 2048),
        GgufSpec("gpt2-q8", "gpt2", 1000, 64, 2, 4, 4, 160, 2048, dtype="q8_0"),
        GgufSpec("think", "gpt2", 1000, 64, 2, 4, 4, 160, 2048, thinks=True),
        # K-quants pack rows of 256 values: every matrix dimension here is a multiple of 256.
        GgufSpec("qwen2-q4k", "gpt2", 1000, 256, 2, 4, 2, 512, 2048, 0.1, "q4_k_m", "qwen2"),
        GgufSpec(
            "qwen2-q4k-base", "gpt2", 1000, 256, 2, 4, 2, 512, 2048, 0.1, "q4_k_m", "qwen2", False
        ),
        # ~100M parameters (tied embeddings), for benchmarks/llamacpp_throughput.py.
        GgufSpec("bench-100m", "llama", 32000, 768, 12, 12, 4, 2048, 4096, 0.02, "f16"),
        GgufSpec("bench-100m-q8", "llama", 32000, 768, 12, 12, 4, 2048, 4096, 0.02, "q8_0"),
        GgufSpec("bench-100m-f32", "llama", 32000, 768, 12, 12, 4, 2048, 4096, 0.02, "f32"),
    )
}


@dataclass(frozen=True)
class ProjectorSpec:
    """A tiny LLaVA-style projector GGUF (a CLIP vision tower and a two-layer MLP) for the text
    model `text`: what `model.model_kwargs.mmproj` names for LLAMACPP to read images. 32x32
    images in 8x8 patches: 16 image tokens each."""

    name: str
    text: str
    hidden: int = 32
    layers: int = 2
    heads: int = 2
    intermediate: int = 64
    image_size: int = 32
    patch_size: int = 8
    init_std: float = 0.25


PROJECTORS = {spec.name: spec for spec in (ProjectorSpec("llama-mmproj", "llama"),)}


def resolve_gguf_name(name: str) -> str:
    """`tiny-gguf:NAME` names a tiny GGUF model (built on first use); anything else as given."""
    if not name.startswith(TINY_GGUF_PREFIX):
        return name
    tiny = name[len(TINY_GGUF_PREFIX) :]
    if tiny not in SPECS and tiny not in PROJECTORS and tiny not in BERTS:
        from lmpress.vocabulary.errors import ModelLoadError

        raise ModelLoadError(
            f"unknown tiny GGUF model '{tiny}' (choose from {', '.join([*SPECS, *PROJECTORS, *BERTS])})"
        )
    return str(tiny_gguf(tiny))


def tiny_gguf(name: str = "llama", cache_dir: Path | None = None) -> Path:
    """The path of a tiny GGUF file (a model or a projector), built on first use and cached."""
    spec = SPECS.get(name) or BERTS.get(name) or PROJECTORS[name]
    root = (cache_dir or cache_root()) / "tiny-gguf"
    target = root / f"{spec.name}-v{BUILDER_VERSION}.gguf"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=root, prefix=f".{spec.name}-", suffix=".gguf")
    os.close(fd)
    try:
        build(spec, Path(scratch))
        os.chmod(scratch, 0o644)  # mkstemp makes it private; a model file is not a secret
        os.replace(scratch, target)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target


def build(spec: GgufSpec | ProjectorSpec | BertSpec, out: Path) -> None:
    if isinstance(spec, ProjectorSpec):
        _write_projector(spec, out)
        return
    if isinstance(spec, BertSpec):
        write_bert(spec, out)
        return
    if spec.dtype != "q4_k_m":
        _write(spec, out)
        return
    full = out.with_suffix(".f32.gguf")
    try:
        _write(spec, full)
        _quantize(full, out, "LLAMA_FTYPE_MOSTLY_Q4_K_M")
    finally:
        full.unlink(missing_ok=True)


def _quantize(source: Path, out: Path, ftype: str) -> None:
    """llama.cpp's own quantize tool, as `llama-quantize` runs it."""
    import ctypes

    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    with suppress_stdout_stderr(disable=False):  # it prints a line per tensor
        status = llama_cpp.llama_model_quantize(
            str(source).encode(), str(out).encode(), ctypes.byref(params)
        )
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} ({status})")


def _write(spec: GgufSpec, out: Path) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(out), spec.arch)
    writer.add_name(f"lmpress tiny {spec.name}")
    writer.add_context_length(spec.context)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.intermediate)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(spec.hidden // spec.heads)

    vocab = spm_vocab(spec) if spec.tokenizer == "llama" else bpe_vocab(spec)
    writer.add_tokenizer_model(spec.tokenizer)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges is not None:
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)
    if vocab.unk is not None:
        writer.add_unk_token_id(vocab.unk)
    writer.add_add_bos_token(vocab.add_bos)
    if spec.chat_template:
        writer.add_chat_template(vocab.chat_template)

    rng = np.random.default_rng(0)
    head_dim = spec.hidden // spec.heads

    def add_matrix(name: str, rows: int, cols: int) -> None:
        values = rng.standard_normal((rows, cols), dtype=np.float32) * spec.init_std
        if spec.dtype == "q8_0":
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(
                name, values.astype(np.float16 if spec.dtype == "f16" else np.float32)
            )

    def norm() -> Any:
        return np.ones(spec.hidden, dtype=np.float32)

    def bias(rows: int) -> Any:
        return rng.standard_normal(rows, dtype=np.float32) * spec.init_std

    n_vocab = len(vocab.tokens)
    add_matrix("token_embd.weight", n_vocab, spec.hidden)
    writer.add_tensor("output_norm.weight", norm())
    if spec.arch != "llama":  # the llama ones tie the output matrix to the embeddings
        add_matrix("output.weight", n_vocab, spec.hidden)
    for i in range(spec.layers):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", norm())
        add_matrix(f"{block}.attn_q.weight", spec.heads * head_dim, spec.hidden)
        add_matrix(f"{block}.attn_k.weight", spec.kv_heads * head_dim, spec.hidden)
        add_matrix(f"{block}.attn_v.weight", spec.kv_heads * head_dim, spec.hidden)
        if spec.arch == "qwen2":
            writer.add_tensor(f"{block}.attn_q.bias", bias(spec.heads * head_dim))
            writer.add_tensor(f"{block}.attn_k.bias", bias(spec.kv_heads * head_dim))
            writer.add_tensor(f"{block}.attn_v.bias", bias(spec.kv_heads * head_dim))
        add_matrix(f"{block}.attn_output.weight", spec.hidden, spec.heads * head_dim)
        writer.add_tensor(f"{block}.ffn_norm.weight", norm())
        add_matrix(f"{block}.ffn_gate.weight", spec.intermediate, spec.hidden)
        add_matrix(f"{block}.ffn_up.weight", spec.intermediate, spec.hidden)
        add_matrix(f"{block}.ffn_down.weight", spec.hidden, spec.intermediate)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@dataclass
class Vocab:
    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    bos: int
    eos: int
    unk: int | None
    add_bos: bool
    chat_template: str


def _words(count: int) -> list[str]:
    """The word list plus made-up words, so a large vocabulary has pieces to fill it."""
    rng = random.Random(0)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    words = list(dict.fromkeys(WORDS))
    seen = set(words)
    while len(words) < count:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(3, 10)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def spm_vocab(spec: GgufSpec) -> Vocab:
    """SentencePiece-style: control tokens, 256 byte tokens, characters, then word pieces
    ("▁" marks a leading space) with every prefix present, so llama.cpp's bigram merging
    can reach each piece."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [UNKNOWN, CONTROL, CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    pieces: dict[str, None] = {}
    for char in "▁" + "".join(chr(c) for c in range(33, 127)):
        pieces[char] = None
    for word in _words(spec.vocab_size):
        for piece in (f"▁{word}", word):
            for end in range(2, len(piece) + 1):
                pieces.setdefault(piece[:end], None)
        if len(tokens) + len(pieces) >= spec.vocab_size:
            break
    listed = list(pieces)[: spec.vocab_size - len(tokens)]
    tokens += listed
    types += [NORMAL] * len(listed)
    # Longer pieces merge first; every score is distinct, so tokenization is deterministic.
    scores = [0.0] * (3 + 256) + [len(p) - i * 1e-6 for i, p in enumerate(listed)]
    return Vocab(tokens, types, scores, None, 1, 2, 0, True, INST_TEMPLATE)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def bpe_vocab(spec: GgufSpec) -> Vocab:
    """Byte-level BPE: the 256 byte characters, then one merge chain per word (each merge joins
    a word's prefix with its next character), then ChatML's control tokens."""
    alphabet = byte_to_unicode()
    tokens = [alphabet[b] for b in range(256)]
    known = set(tokens)
    merges: list[str] = []
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    budget = spec.vocab_size - len(specials) - (len(THINK_TOKENS) if spec.thinks else 0)
    for word in _words(spec.vocab_size):
        for text in (" " + word, word):
            chars = "".join(alphabet[b] for b in text.encode("utf-8"))
            for end in range(2, len(chars) + 1):
                if chars[:end] in known or len(tokens) >= budget:
                    continue
                merges.append(f"{chars[: end - 1]} {chars[end - 1]}")
                tokens.append(chars[:end])
                known.add(chars[:end])
        if len(tokens) >= budget:
            break
    types = [NORMAL] * len(tokens) + [CONTROL] * len(specials)
    bos = len(tokens)
    tokens += specials
    template = CHATML_TEMPLATE
    if spec.thinks:
        tokens += THINK_TOKENS
        types += [USER_DEFINED] * len(THINK_TOKENS)
        template = THINK_TEMPLATE
    return Vocab(tokens, types, None, merges, bos, bos + 2, None, False, template)


def _write_projector(spec: ProjectorSpec, out: Path) -> None:
    """The keys and tensors llama.cpp's clip loader reads for an "mlp" (LLaVA) projector."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    width, ff, n_text = spec.hidden, spec.intermediate, SPECS[spec.text].hidden
    patches = (spec.image_size // spec.patch_size) ** 2
    writer = gguf.GGUFWriter(str(out), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_llava_projector", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.use_gelu", True)
    for key, value in (("image_size", spec.image_size), ("patch_size", spec.patch_size),
                       ("embedding_length", width), ("feed_forward_length", ff),
                       ("block_count", spec.layers), ("projection_dim", n_text),
                       ("attention.head_count", spec.heads)):  # fmt: skip
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def matrix(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * spec.init_std).astype(np.float32))

    def norm(name: str, n: int) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(n, dtype=np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(n, dtype=np.float32))

    def linear(name: str, rows: int, cols: int) -> None:
        matrix(f"{name}.weight", rows, cols)
        writer.add_tensor(f"{name}.bias", np.zeros(rows, dtype=np.float32))

    matrix("v.patch_embd.weight", width, 3, spec.patch_size, spec.patch_size)
    matrix("v.class_embd", width)
    matrix("v.position_embd.weight", patches + 1, width)
    norm("v.pre_ln", width)
    for block in range(spec.layers):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            linear(f"v.blk.{block}.{name}", width, width)
        norm(f"v.blk.{block}.ln1", width)
        norm(f"v.blk.{block}.ln2", width)
        linear(f"v.blk.{block}.ffn_up", ff, width)
        linear(f"v.blk.{block}.ffn_down", width, ff)
    linear("mm.0", n_text, width)
    linear("mm.2", n_text, n_text)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> int:
    names = {**SPECS, **BERTS, **PROJECTORS}
    return builder_main(
        argv, "lmpress.builtin_models.tiny_gguf", "tiny GGUF models", names, tiny_gguf
    )


if __name__ == "__main__":
    sys.exit(main())
