"""Errors a user can cause, and the vocabulary of a failed request. The CLI prints an error's
message as one line; `--debug` adds the traceback."""

from __future__ import annotations

import errno
from enum import Enum
from pathlib import Path


class ErrorKind(str, Enum):
    """Why one request failed: `ErrorInfo.kind`, `RequestError.kind`, the `code` of an OpenAI
    error body and of an OpenAI Batch error line. A vocabulary, so that every mapping of it
    (serve's HTTP statuses) is checked whole by a test and an unknown kind fails where it is
    made, not as a 500 far away."""

    # The request itself is wrong, or the engine cannot take it.
    INVALID_REQUEST = "invalid_request"
    INVALID_JSON = "invalid_json"  # a batch input line that is no JSON
    INVALID_ROW = "invalid_row"  # a batch input row that is no request at all
    UNSUPPORTED_PARAM = "unsupported_param"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    # What a remote API answered (engines/remote/base.py sorts HTTP statuses into these).
    BAD_REQUEST = "bad_request"
    AUTHENTICATION_ERROR = "authentication_error"
    PERMISSION_DENIED = "permission_denied"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    REQUEST_TOO_LARGE = "request_too_large"
    UNPROCESSABLE_ENTITY = "unprocessable_entity"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    HTTP_ERROR = "http_error"  # another status
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    MALFORMED_RESPONSE = "malformed_response"
    CLIENT_ERROR = "client_error"  # the SDK failed before sending
    BATCH_EXPIRED = "batch_expired"  # a provider's batch ended without running the row
    # The engine itself.
    GENERATION_ERROR = "generation_error"
    INVALID_OUTPUT = "invalid_output"  # a reply that breaks the structure its row asked for
    ENGINE_CLOSED = "engine_closed"

    def __str__(self) -> str:
        return self.value


class LmpressError(Exception):
    """Base of every error whose message is meant for the user."""

    exit_code = 2


class ConfigError(LmpressError):
    """A recipe, an override or a config value is wrong."""


class EngineUnavailableError(LmpressError):
    """An engine cannot be used here: unknown, not implemented, or its extra is missing."""


class UnsupportedParamError(LmpressError):
    """A generation parameter was set that the chosen engine does not honour."""


class InputError(LmpressError):
    """An input file or row is unusable."""


class ModelLoadError(LmpressError):
    """The model or tokenizer could not be loaded."""


class OutputWriteError(LmpressError):
    """Writing a file of the output failed: a full disk, a quota, a read-only or failing
    filesystem. What was written before stays valid, so the same command resumes once the
    cause is gone. Exit 1 once rows were written, 2 when nothing had started."""

    def __init__(self, path: str | Path | None, exc: OSError, started: bool = True):
        """`path`: the file, where known (None: a write lmpress did not wrap)."""
        why = _WRITE_FAILURES.get(exc.errno or 0)
        where = f"{path}: " if path is not None else ""
        if why is None:
            super().__init__(f"{where}cannot write ({exc.strerror or exc})")
        else:
            then = (
                f"rows already written are kept: {_FIX[exc.errno]} and re-run the same command "
                f"to resume"
                if started
                else f"{_FIX[exc.errno]} and run the command again"
            )
            super().__init__(f"{where}cannot write: {why}; {then}")
        self.exit_code = 1 if started else 2


# What a write can meet that is not the user's input: said in words, with what to do.
_WRITE_FAILURES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is at the size limit (ulimit -f)",
    errno.EROFS: "the filesystem is read-only",
    errno.EIO: "an I/O error on the device",
}
_FIX = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space",
    errno.EFBIG: "raise the limit",
    errno.EROFS: "make it writable (or move the output and its side files)",
    errno.EIO: "check the device",
}
DISK_ERRNOS = frozenset(_WRITE_FAILURES)


class Terminated(BaseException):
    """SIGTERM came where no stop of its own was set up (`lmpress` turns it into this, so that
    cleanups run): a BaseException, so that no `except Exception` swallows it."""


class RequestError(Exception):
    """One request failed; the job goes on. `kind` is a short machine-readable category."""

    def __init__(
        self,
        message: str,
        kind: ErrorKind | str = ErrorKind.GENERATION_ERROR,
        status: int | None = None,
    ):
        super().__init__(message)
        self.kind = ErrorKind(kind)
        self.status = status


def first_line(exc: BaseException) -> str:
    """An exception's message as one line for a user: its first non-empty line, or the
    exception's type where it has no message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def exception_line(exc: BaseException) -> str:
    """An unforeseen exception as one line, type first: "KeyError: 'x'"."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
