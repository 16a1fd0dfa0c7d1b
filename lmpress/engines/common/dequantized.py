"""A GGUF file as NATIVE and VLLM load it, dequantized once and kept as a Hugging Face directory.

transformers dequantizes a GGUF file tensor by tensor on every load, and reads its tokenizer and
config out of the same file: for SmolLM2-135M (270 MB of F16) that is ~12 s a load here, against
under 2 s for the same model from safetensors. So NATIVE keeps the result of one dequantization
(config, generation config, tokenizer and weights) beside the packaged model's other copies, and
later loads read that.

The copy holds exactly what transformers made of the file: the dequantized tensors (float32,
stored as float16 where every value of the model is a float16, as an F16 file's are), so a load
at any dtype casts the same values a GGUF load casts. Its name carries the file's name and size
and the versions of transformers and gguf that dequantized it, so an upgrade makes a new copy.
Only lmpress's own packaged models get one (builtin_models/packaged.py): a user's GGUF file of many GB would
take several times its size dequantized, which lmpress should not write unasked.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

# Bump when what a copy holds changes, so older copies are not read.
COPY_VERSION = 1


def copy_path(gguf: Path, cache_dir: Path | None = None) -> Path:
    """Where the dequantized copy of `gguf` lives (whether or not it is made yet)."""
    from importlib.metadata import version

    from lmpress.builtin_models.tiny import cache_root

    root = (cache_dir or cache_root()) / "packaged"
    versions = f"transformers-{version('transformers')}-gguf-{version('gguf')}"
    return root / f"{gguf.stem}-{gguf.stat().st_size}.native-v{COPY_VERSION}-{versions}"


def existing_copy(gguf: Path, cache_dir: Path | None = None) -> Path | None:
    target = copy_path(gguf, cache_dir)
    return target if (target / "config.json").exists() else None


def dequantized_copy(gguf: Path, cache_dir: Path | None = None) -> Path:
    """The directory of `gguf` dequantized by transformers, made on first use. Processes that
    make it at once each write their own scratch directory and rename it into place, so a
    reader never sees half a copy."""
    from lmpress.builtin_models.tiny import built_once

    return built_once(copy_path(gguf, cache_dir), lambda out: _write(gguf, out))


def _write(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    # transformers draws a progress bar while it dequantizes GGUF tensors, with no switch.
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(**source)
        model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    # The GGUF quantization config says "dequantize this file"; the copy is dequantized already.
    del model.config.quantization_config
    model.hf_quantizer = None
    exact = all(torch.equal(t.half().float(), t) for t in model.state_dict().values())
    if exact:
        model = model.to(torch.float16)
    with contextlib.redirect_stderr(io.StringIO()):  # and a bar while it writes shards
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
