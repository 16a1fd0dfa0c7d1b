"""Stand-in for vllm/v1/engine/exceptions.py."""


class EngineGenerateError(Exception):
    """Raised when an AsyncLLM.generate() fails. Recoverable."""


class EngineDeadError(Exception):
    """Raised when the EngineCore dies. Unrecoverable."""

    def __init__(self, *args, suppress_context: bool = False, **kwargs):
        message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
        super().__init__(message, *args, **kwargs)
        self.__suppress_context__ = suppress_context
