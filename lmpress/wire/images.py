"""Images for remote APIs: a remote server cannot read the files an image part names, so a file
(a file:// URL or a bare path) is read and checked (lmpress.vocabulary.images) and sent inline, as base64.
One place for both protocols: OpenAI's data: URLs and Anthropic's base64 image blocks. http(s)
and data: URLs go on as they are; the provider fetches and checks them.

Serve has a rule of its own for the other direction (serve/media.py): it refuses a client's
local file, and fetches an http(s) image itself before making it a data: URL.
"""

from __future__ import annotations

import base64

from lmpress.vocabulary.images import read_image

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
    image = read_image(url)
    return image.media_type, base64.b64encode(image.data).decode("ascii")
