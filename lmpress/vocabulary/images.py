"""Images in prompts: the one place an image part's URL is read and checked, for every engine.

An image part names its image by URL: a data: URL, a file:// URL (or a bare path), or an
http(s) URL. `read_image` returns the image's bytes and media type, checked: readable, at
most MAX_IMAGE_BYTES, and one of the formats chat models take (PNG, JPEG, GIF, WebP), known
by its first bytes rather than its name. `load_image` decodes it with Pillow for the local
engines, which feed pixels to the model; a file whose header promises an image it does not
hold fails there. Either raises `ImageError`, a RequestError: the row with the bad image
fails alone, with one line naming the image and what is wrong.

Remote engines send http(s) and data: URLs on as they are (the provider fetches and checks
them) and read local files here to send them inline (wire/images.py).

This is lmpress reading images for its user (a batch over their own file, their chat): any URL,
any local path. `lmpress serve` reads images for clients it does not trust, so it fetches and
checks them itself before a request reaches the engine (serve/media.py), and the engine finds
only data: URLs; `open_image`, which reads a header and holds it to a pixel limit, is shared.
"""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_to_bytes, urlparse

from lmpress.vocabulary.errors import ErrorKind, InputError, RequestError, first_line
from lmpress.vocabulary.types import ContentPart, Message, Request

# The largest image file lmpress reads (OpenAI's limit per image is 20 MB too).
MAX_IMAGE_BYTES = 20 * 2**20
# The most pixels an image may decode to: a small file can hold a huge blank image.
MAX_IMAGE_PIXELS = 50_000_000
FETCH_TIMEOUT_S = 30
# The formats chat models take, by their first bytes (WebP is RIFF....WEBP, checked apart).
# Enough to turn away a text file or a PDF; Pillow checks the rest where pixels are needed.
FORMATS = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"))
FORMAT_NAMES = "PNG, JPEG, GIF or WebP"


class ImageError(RequestError):
    """An image that cannot be used: its row fails alone."""

    def __init__(self, message: str):
        super().__init__(message, ErrorKind.INVALID_REQUEST)


class TooManyPixels(ImageError):
    """An image whose header promises more pixels than the limit: it is never decoded."""


@dataclass(frozen=True)
class ImageBytes:
    data: bytes
    media_type: str


def image_urls(request: Request) -> list[str]:
    """The request's image URLs, in the order the prompt shows them."""
    return [url for message in request.messages for url in message_image_urls(message)]


def message_image_urls(message: Message) -> list[str]:
    if isinstance(message.content, str):
        return []
    return [part.image_url or "" for part in message.content if part.type == "image_url"]


def read_image(url: str, number: int = 1, where: str | None = None) -> ImageBytes:
    """The bytes and media type of the image `url` names, checked (see the module docstring).
    `number` counts images in the request from 1; `where` names the image in a message
    instead."""
    where = where or f"image {number} ({short_name(url)})"
    if url.startswith("data:"):
        data = _data_url_bytes(url, where)
    elif url.startswith(("http://", "https://")):
        data = _fetch(url, where)
    else:
        data = _read_file(url, where)
    if not data:
        raise ImageError(f"{where}: is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(
            f"{where}: is {len(data) / 2**20:.1f} MiB, over the {MAX_IMAGE_BYTES // 2**20} MiB an "
            f"image may be; shrink it"
        )
    media_type = sniff_media_type(data)
    if media_type is None:
        raise ImageError(f"{where}: is not a {FORMAT_NAMES} image")
    return ImageBytes(data, media_type)


def load_image(url: str, number: int = 1) -> Any:
    """The image `url` names, read and checked by `read_image`, decoded to an RGB Pillow
    image."""
    raw = read_image(url, number)
    where = f"image {number} ({short_name(url)})"
    image = open_image(raw, where)
    try:
        image.load()
        return image.convert("RGB")
    except Exception as exc:  # Pillow's errors for truncated or corrupt data vary by format
        raise _undecodable(raw, where, exc) from None


def open_image(
    raw: ImageBytes, where: str, max_pixels: int | None = None, setting: str | None = None
) -> Any:
    """The image opened with Pillow, which reads only its header, and its size checked
    against `max_pixels` before anything is decoded: a file of a few kilobytes can hold a
    blank image of gigabytes (a decompression bomb). `setting` names the limit in the error
    (default: MAX_IMAGE_PIXELS, what lmpress takes from a file of the user's own)."""
    import io

    from PIL import Image

    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    try:
        image = Image.open(io.BytesIO(raw.data))
    except Image.DecompressionBombError:  # past twice Pillow's own limit: no size is shown
        image = None
    except Exception as exc:
        raise _undecodable(raw, where, exc) from None
    if image is None or image.width * image.height > max_pixels:
        size = "" if image is None else f"{image.width}x{image.height} pixels, "
        named = f" ({setting})" if setting else ""
        raise TooManyPixels(
            f"{where}: is {size}over the {max_pixels:,} pixels an image may have{named}; shrink it"
        )
    return image


def _undecodable(raw: ImageBytes, where: str, exc: Exception) -> ImageError:
    from PIL import UnidentifiedImageError

    kind = raw.media_type.split("/")[1].upper()
    why = "" if isinstance(exc, UnidentifiedImageError) else f" ({first_line(exc)})"
    return ImageError(f"{where}: cannot be decoded as {kind}{why}; is the file damaged?")


def load_images(request: Request) -> list[Any]:
    """Every image of the request, decoded, in prompt order."""
    return [load_image(url, i) for i, url in enumerate(image_urls(request), start=1)]


def image_part(image: str, flag: str) -> ContentPart:
    """An image a user names on the command line or in the chat (`--image`, `/image`): a local
    file (sent as a file URL, which each engine reads) or a URL, checked now so that a typo
    fails before any model loads."""
    if image.startswith(("http://", "https://")):
        return ContentPart("image_url", image_url=image)  # fetched by whichever engine runs
    url = image if image.startswith("data:") else Path(image).expanduser().absolute().as_uri()
    try:
        read_image(url, where=f"{flag}: {short_name(image)}")
    except ImageError as exc:
        raise InputError(str(exc)) from None
    return ContentPart("image_url", image_url=url)


def is_local_file(url: str) -> bool:
    """Whether an image URL names a file on this machine (what serve refuses from clients)."""
    return not url.startswith(("http://", "https://", "data:"))


def sniff_media_type(data: bytes) -> str | None:
    """The image's media type from its first bytes; None for a format not taken."""
    for magic, media_type in FORMATS:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def short_name(url: str) -> str:
    """The URL as an error message shows it: a data: URL by its type and size, not its data."""
    if url.startswith("data:"):
        header = url.partition(",")[0]
        return f"{header} URL of {len(url)} characters"
    return url if len(url) <= 200 else url[:197] + "..."


def file_path(url: str) -> Path:
    """The local file a file:// URL or a bare path names; ValueError for a file URL with a
    host."""
    if url.startswith("file:"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(
                f"a file URL names a file on this machine (file:///path), not on '{parsed.netloc}'"
            )
        return Path(unquote(parsed.path))
    return Path(url).expanduser()


def _read_file(url: str, where: str) -> bytes:
    try:
        path = file_path(url)
    except ValueError as exc:
        raise ImageError(f"{where}: {exc}") from None
    try:
        with path.open("rb") as image:
            return image.read(MAX_IMAGE_BYTES + 1)  # enough to tell that it is too large
    except FileNotFoundError:
        raise ImageError(f"{where}: no such file") from None
    except OSError as exc:
        raise ImageError(f"{where}: cannot read {path}: {exc.strerror}") from None


def _data_url_bytes(url: str, where: str) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma:
        raise ImageError(f"{where}: a data: URL needs a comma before its data")
    if not header.endswith(";base64"):
        return unquote_to_bytes(payload)
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ImageError(f"{where}: is over the {MAX_IMAGE_BYTES // 2**20} MiB an image may be")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: the data: URL's data is not valid base64") from None


def _fetch(url: str, where: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            return response.read(MAX_IMAGE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ImageError(f"{where}: the server answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ImageError(f"{where}: cannot fetch it: {reason}") from None
