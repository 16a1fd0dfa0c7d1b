"""Stand-in for vllm/exceptions.py: since vLLM 0.2x its request errors are VLLMClientErrors,
not ValueErrors."""

from typing import Any


class VLLMError(Exception):
    """Base class for all vLLM-specific errors."""


class VLLMClientError(VLLMError):
    """Errors caused by the client request (4xx)."""


class VLLMValidationError(VLLMClientError):
    """A request or its parameters are invalid (vLLM raises it for bad client input)."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None):
        super().__init__(message)
        self.parameter = parameter
        self.value = value
