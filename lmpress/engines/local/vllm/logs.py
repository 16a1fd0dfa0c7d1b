"""vLLM's log, kept out of the user's way and read back when vLLM fails.

vLLM logs from every process it starts (the engine core, its workers), and when one of them fails
the exception that reaches lmpress says only "Engine core initialization failed. See root cause
above": the cause is in a child's traceback, on stderr. So before vLLM is imported lmpress
points vLLM's logging (`VLLM_LOGGING_CONFIG_PATH`, which vLLM's child processes read too) at a
config that writes everything to a file and only warnings to stderr; errors and their tracebacks
reach stderr with --debug only. vLLM's child processes are started with their stderr on the
file as well (`children_print_to_log`): a dying process prints its traceback outside logging. When vLLM fails, `root_cause` reads the first real exception
out of that file, and `with_hint` adds the setting that cures it. A user who configures vLLM's
logging (VLLM_LOGGING_CONFIG_PATH, VLLM_CONFIGURE_LOGGING=0) keeps their own.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

_LOG_FILE: Path | None = None
# vLLM's header, as vLLM writes it (its record factory adds vllm_process_name).
FORMAT = (
    "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
    "[%(fileinfo)s:%(lineno)d] %(message)s"
)
# The last line of a traceback: "ValueError: message", after the log header.
EXCEPTION_LINE = re.compile(r"(?:^|\] )((?:\w+\.)*\w*(?:Error|Exception)): (.+)$")
# vLLM's wrappers around a child's exception: they point at the log, not at the cause.
WRAPPERS = ("root cause", "stack trace", "EngineCore encountered")


OWN_CONFIG_ENV = "LMPRESS_VLLM_LOGGING_CONFIG"  # the config lmpress wrote, as processes inherit it


class BelowError(logging.Filter):
    """Lets through what is not an error: errors and tracebacks stay in the file. So do vLLM's
    deprecation warnings, which speak to the code calling vLLM (lmpress), not to its user: in
    `lmpress chat` vLLM 0.32's "Passing raw prompts to InputProcessor is deprecated" was
    printed inside the first reply."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR and "deprecated" not in record.getMessage()


def capture_vllm_log() -> Path | None:
    """Route vLLM's logging to a file of this process's own (and warnings to stderr), once,
    before vLLM is imported. The file, or None where the user configured vLLM's logging."""
    global _LOG_FILE
    if _LOG_FILE is not None:
        return _LOG_FILE
    configured = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    # A path lmpress set in a parent process (a script that ran VLLM, then the lmpress
    # command) is not the user's configuration: this process routes its own.
    if (configured and configured != os.environ.get(OWN_CONFIG_ENV)) or os.environ.get(
        "VLLM_CONFIGURE_LOGGING"
    ) == "0":
        return None
    folder = Path(tempfile.mkdtemp(prefix="lmpress-vllm-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    debug = bool(os.environ.get("LMPRESS_DEBUG"))
    log_file = folder / "vllm.log"
    formatter = {"()": "vllm.logging_utils.NewLineFormatter", "format": FORMAT,
                 "datefmt": "%m-%d %H:%M:%S"}  # fmt: skip
    stderr = {
        "class": "logging.StreamHandler",
        "formatter": "vllm",
        "level": "INFO" if debug else "WARNING",
        "stream": "ext://sys.stderr",  # lmpress's stdout carries replies and JSONL
        "filters": [] if debug else ["below_error"],
    }
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"below_error": {"()": f"{__name__}.BelowError"}},
        "formatters": {"vllm": formatter},
        "handlers": {
            "stderr": stderr,
            "file": {
                "class": "logging.FileHandler",
                "formatter": "vllm",
                "level": "INFO",
                "filename": str(log_file),
            },
        },  # fmt: skip
        "loggers": {"vllm": {"handlers": ["stderr", "file"], "level": "INFO", "propagate": False}},
    }
    config_file = folder / "logging.json"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = os.environ[OWN_CONFIG_ENV] = str(config_file)
    _LOG_FILE = log_file
    return log_file


@contextlib.contextmanager
def children_print_to_log() -> Iterator[None]:
    """While vLLM starts its processes, this process's stderr (file descriptor 2, which they
    inherit) points at the log file, so that what they print outside logging (a process's
    dying traceback, progress bars, the resource tracker's warnings) lands there too. Not with
    --debug, nor where the user configured vLLM's logging."""
    if _LOG_FILE is None or os.environ.get("LMPRESS_DEBUG"):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(_LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.dup2(log, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


def root_cause() -> str | None:
    """The first exception vLLM's processes logged ("ValueError: ..."), or None."""
    if _LOG_FILE is None or not _LOG_FILE.exists():
        return None
    for line in _LOG_FILE.read_text(encoding="utf-8", errors="replace").splitlines():
        found = EXCEPTION_LINE.search(line)
        if found and not any(w in found.group(2) for w in WRAPPERS):
            name = found.group(1).rsplit(".", 1)[-1]
            return f"{name}: {found.group(2).strip()}"
    return None


MEMORY = (
    "on a CPU set VLLM_CPU_KVCACHE_SPACE to the GiB of KV cache vLLM may take "
    "(e.g. VLLM_CPU_KVCACHE_SPACE=1), or lower model.model_kwargs.gpu_memory_utilization, the "
    "share of memory vLLM reserves"
)
# (what vLLM's message says, what to change): checked in order, on the lowercased cause.
HINTS = (
    (("available memory",), MEMORY),
    # vLLM's CPU build keeps an fp8 cache only with AVX-512 or AMX ("FP8 KV cache on CPU
    # requires ..."): no size setting cures that.
    (("fp8 kv cache",), "this CPU cannot hold vLLM's fp8 KV cache: leave model.kv_cache_dtype at "
     "auto on VLLM here, or quantize the cache on engine NATIVE (int8) or LLAMACPP (q8_0, q4_0)"),
    (("kv cache",), "lower model.model_max_length (vLLM's max_model_len), or give vLLM more KV "
     "cache: VLLM_CPU_KVCACHE_SPACE on a CPU, model.model_kwargs.gpu_memory_utilization on a GPU"),
    (("memory",), MEMORY),
    (("max_model_len", "max model len", "maximum context", "max_position_embeddings"),
     "lower model.model_max_length (vLLM's max_model_len) to at most the model's context"),
    (("head_dim", "head size"), "vLLM's CPU attention takes head sizes 32, 64, 80, 96, 112, 128, "
     "160, 192, 224, 256 and 512; run this model on engine NATIVE"),
    (("architecture", "not supported for now"), "vLLM has no implementation of this model's "
     "architecture; run it on engine NATIVE"),
    (("avx", "illegal instruction", "instruction set"), "vLLM's CPU build needs a CPU with AVX2 or "
     "AVX-512 (x86), or an Arm or Apple CPU; use engine NATIVE or LLAMACPP here"),
)  # fmt: skip


def with_hint(cause: str) -> str:
    """`cause`, followed by the setting that cures it where lmpress knows one."""
    lowered = cause.lower()
    for words, hint in HINTS:
        if any(w in lowered for w in words):
            return f"{cause} -> {hint}"
    return cause
