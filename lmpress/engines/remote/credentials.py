"""API keys for remote engines: where a key comes from, and keeping it out of everything
lmpress writes."""

from __future__ import annotations

import os
import re
import sys

from lmpress.configs.schema import RemoteParams
from lmpress.vocabulary.errors import ConfigError


def resolve_api_key(
    engine: str, remote: RemoteParams, variable: str | None, key_required: bool
) -> str | None:
    """The API key: a literal `remote_params.api_key` (with a warning), else the environment
    variable the engine reads it from (`Engine.key_variable`: the one `api_key_env_varname`
    names, else the engine's default).

    Fails here, before any request, when a key is required and missing, naming the variable.
    """
    if remote.api_key:
        env_hint = variable or "MY_API_KEY"
        print(
            "lmpress: warning: remote_params.api_key holds a literal API key; keys in recipes "
            "and command lines end up in files and shell history. Put it in an environment "
            f"variable instead: export {env_hint}=... (and set remote_params.api_key_env_varname "
            f"to {env_hint} if it is not the engine's default)",
            file=sys.stderr,
        )
        return _checked_key(remote.api_key, "remote_params.api_key")
    value = os.environ.get(variable, "") if variable else ""
    if value.strip():
        return _checked_key(value, f"the environment variable {variable}")
    if variable and (key_required or remote.api_key_env_varname):
        raise ConfigError(
            f"engine {engine} needs an API key: the environment variable {variable} is "
            f"not set (export {variable}=..., or name another variable with "
            f"--remote_params.api_key_env_varname)"
        )
    return None


def _checked_key(value: str, where: str) -> str:
    key = value.strip()
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(
            f"{where} is not usable as an API key: it contains spaces, control or non-ASCII "
            f"characters"
        )
    return key


class Redactor:
    """Removes secrets from text bound for rows, logs and messages: the key itself, and any
    bearer token or key-looking header a server or SDK echoed back."""

    _PATTERNS = (
        re.compile(r"(?i)(bearer\s+)[^\s\"',;}]+"),
        re.compile(r"(?i)((?:x-)?api[-_]?key[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+"),
        re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?!bearer\s)[^\s\"',;}]+"),
    )

    def __init__(self, secrets: list[str]):
        self.secrets = [s for s in secrets if len(s) >= 4]

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
            # A server that cut the key short still shows a long piece of it.
            for length in range(len(secret) - 1, 7, -1):
                for piece in (secret[:length], secret[-length:]):
                    if piece in text:
                        text = text.replace(piece, "***")
        for pattern in self._PATTERNS:
            text = pattern.sub(r"\1***", text)
        return text
