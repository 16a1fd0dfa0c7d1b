"""GOOGLE_VERTEX: Vertex AI's OpenAI-compatible endpoint, REMOTE with a bearer token from
google-auth (the `vertex` extra)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.engines.remote.openai_compat import OpenAICompatEngine
from lmpress.vocabulary.errors import ConfigError, ErrorKind, RequestError


class GoogleVertexEngine(OpenAICompatEngine):
    """Vertex AI's OpenAI-compatible endpoint, with a bearer token from google-auth.

    The URL comes from remote_params.api_url, else from the project and location
    (GOOGLE_CLOUD_PROJECT / GOOGLE_CLOUD_LOCATION, or Oumi's PROJECT_ID / REGION). The token is
    the variable remote_params.api_key_env_varname names when set, else Application Default
    Credentials, refreshed before it expires. Its parameters are its row in presets.py.
    """

    SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

    def __init__(self, config: RunConfig):
        remote = config.remote_params
        self._credentials: Any = None
        self._refresh: asyncio.Task | None = None
        project = None
        if not (remote.api_key or remote.api_key_env_varname):
            self._credentials, project = _google_credentials(self.SCOPES)
        if not remote.api_url:
            remote = dataclasses.replace(remote, api_url=vertex_url(project))
            config = dataclasses.replace(config, remote_params=remote)
        super().__init__(config)

    async def _before_send(self, client: Any) -> None:
        credentials = self._credentials
        if credentials is None:
            return
        if not credentials.valid:
            # One refresh for all the requests that find the token expired at once.
            loop = asyncio.get_running_loop()
            if self._refresh is None or self._refresh.get_loop() is not loop:
                self._refresh = loop.create_task(self._refresh_token())
            refresh = self._refresh
            try:
                await asyncio.shield(refresh)
            finally:
                if refresh.done() and self._refresh is refresh:
                    self._refresh = None
        client.api_key = credentials.token

    async def _refresh_token(self) -> None:
        from google.auth.exceptions import RefreshError
        from google.auth.transport.requests import Request as AuthRequest

        try:
            await asyncio.to_thread(self._credentials.refresh, AuthRequest())
        except RefreshError as exc:  # refused: retrying will not help
            raise RequestError(
                f"Google refused to refresh the access token: {exc}", ErrorKind.AUTHENTICATION_ERROR
            ) from exc
        except Exception as exc:  # the token endpoint could not be reached: retried
            raise GoogleTokenUnavailable(f"cannot reach Google's token endpoint: {exc}") from exc
        self.redactor.secrets.append(self._credentials.token)


class GoogleTokenUnavailable(ConnectionError):
    """The token endpoint could not be reached; retried like any connection error."""


def vertex_url(project: str | None) -> str:
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("PROJECT_ID") or project
    location = os.environ.get("GOOGLE_CLOUD_LOCATION") or os.environ.get("REGION")
    if not project or not location:
        raise ConfigError(
            "engine GOOGLE_VERTEX needs a project and a location: set GOOGLE_CLOUD_PROJECT and "
            "GOOGLE_CLOUD_LOCATION (e.g. us-central1), or give --remote_params.api_url"
        )
    host = "aiplatform.googleapis.com" if location == "global" else (
        f"{location}-aiplatform.googleapis.com"
    )  # fmt: skip
    return f"https://{host}/v1/projects/{project}/locations/{location}/endpoints/openapi"


def _google_credentials(scopes: tuple[str, ...]) -> tuple[Any, str | None]:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return google.auth.default(scopes=list(scopes))
    except DefaultCredentialsError as exc:
        raise ConfigError(
            "engine GOOGLE_VERTEX found no Google credentials: run 'gcloud auth "
            "application-default login', set GOOGLE_APPLICATION_CREDENTIALS, or put an access "
            "token in a variable named by --remote_params.api_key_env_varname"
        ) from exc
