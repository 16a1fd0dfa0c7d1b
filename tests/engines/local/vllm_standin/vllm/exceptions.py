"""Stand-in for vllm/exceptions.py."""

from typing import Any


class VLLMValidationError(ValueError):
    """A request or its parameters are invalid (vLLM raises it for bad client input)."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None):
        super().__init__(message)
        self.parameter = parameter
        self.value = value
