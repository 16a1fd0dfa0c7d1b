"""Images for remote APIs: a remote server cannot read the files an image part names, so a file
(a file:// URL or a bare path) is sent inline, as base64. One place for both protocols: OpenAI's
data: URLs and Anthropic's base64 image blocks."""

from __future__ import annotations

import base64
import mimetypes
from pathlib import Path
from urllib.parse import unquote, urlparse

from lmpress.errors import ErrorKind, RequestError

# URLs a server fetches itself; everything else is a local file.
REMOTE_SCHEMES = ("http://", "https://", "gs://")


def inline_image_url(url: str) -> str:
    """An image URL a remote server can use: a local file becomes a data: URL."""
    if url.startswith((*REMOTE_SCHEMES, "data:")):
        return url
    media_type, data = base64_image(url)
    return f"data:{media_type};base64,{data}"


def base64_image(url: str) -> tuple[str, str]:
    """The media type and base64 text of a data: URL's image or a local image file."""
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        return header[len("data:") :].split(";")[0] or "image/png", data
    path = Path(unquote(urlparse(url).path) if url.startswith("file:") else url)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RequestError(
            f"cannot read image {path}: {exc.strerror}", ErrorKind.INVALID_REQUEST
        ) from exc
    media_type = mimetypes.guess_type(path.name)[0] or "image/png"
    return media_type, base64.b64encode(raw).decode("ascii")
