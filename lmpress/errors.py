"""Errors a user can cause. The CLI prints their message as one line; `--debug` adds the traceback."""


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


class RequestError(Exception):
    """One request failed; the job goes on. `kind` is a short machine-readable category."""

    def __init__(self, message: str, kind: str = "generation_error", status: int | None = None):
        super().__init__(message)
        self.kind = kind
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
