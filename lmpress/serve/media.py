"""The images of a request as `lmpress serve` takes them from a client, on every route that
takes images (chat completions, Anthropic's Messages and count_tokens, Responses, and each
line of a /v1/batches batch).

Each image is checked here, before the request reaches the engine, and put back in its place
as a data: URL of its bytes, so that the engine reads nothing from anywhere:

- a local file is refused (the server reads no file of its own for a client);
- an http(s) URL is fetched under the server's media policy (serve/media_fetch.py), at most
  `serve.max_media_fetches` at once across the server. Every way a fetch can fail (a refused
  address, a closed port, a redirect, a timeout, an error status, a body that is no image)
  answers the client with the same line, so that the server is no port scanner; the reason
  goes to the server's log;
- every image, fetched or sent inline, is held to the caps: `serve.max_images_per_request`,
  `serve.max_image_bytes`, and `serve.max_image_pixels`, read from the image's header before
  anything is decoded (a 143 KB PNG can hold a 7000x7000 blank image, 147 MB decoded).

The work that takes time (base64, Pillow's header) runs in a thread, the fetch asynchronously:
the event loop, and so /health and every other request, never waits on an image.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Coroutine, Generator
from typing import Any

from lmpress.configs.schema import ServeParams
from lmpress.serve.media_fetch import FetchFailed, MediaPolicy, TooLarge, fetch
from lmpress.vocabulary.images import (
    FORMAT_NAMES,
    ImageBytes,
    ImageError,
    TooManyPixels,
    is_local_file,
    open_image,
    read_image,
    short_name,
    sniff_media_type,
)
from lmpress.vocabulary.types import ContentPart, Message, Request
from lmpress.wire.openai.errors import ApiError

log = logging.getLogger("lmpress.serve")

# What a client hears of any fetch that failed, whatever the reason.
NOT_FETCHED = "could not fetch image {n}: the URL is not allowed or did not return an image"


class ClientImages:
    """The images clients send to one server: its caps, its media policy and its count of
    fetches in flight."""

    def __init__(self, settings: ServeParams):
        self.settings = settings
        self.policy = MediaPolicy.of(settings)
        self._fetches = asyncio.Semaphore(settings.max_media_fetches)

    async def take(
        self, messages: list[Message], param: str = "messages", who: str = "a request"
    ) -> None:
        """Check every image of `messages` and put each one's bytes in its place as a data:
        URL; an ApiError (400) for the first that fails. `who` names the request in the log."""
        parts = [
            part
            for message in messages
            if not isinstance(message.content, str)
            for part in message.content
            if part.type == "image_url"
        ]
        if not parts:
            return
        limit = self.settings.max_images_per_request
        if len(parts) > limit:
            raise ApiError(
                400,
                f"the request has {len(parts)} images, over the {limit} this server takes in "
                f"one request (serve.max_images_per_request)",
                param=param,
            )
        for part in parts:
            refuse_local_file(part, param)
        urls = await _all(self._take(part.image_url or "", n, param, who)
                          for n, part in enumerate(parts, start=1))  # fmt: skip
        for part, url in zip(parts, urls, strict=True):
            part.image_url = url

    async def _take(self, url: str, n: int, param: str, who: str) -> str:
        """The image as a checked data: URL."""
        fetched = None
        if url.startswith(("http://", "https://")):
            fetched = await self._fetch(url, n, param, who)
        try:
            return await asyncio.to_thread(self._checked, url, fetched, n)
        except FetchFailed as exc:
            raise _not_fetched(n, param, who, exc) from None
        except ImageError as exc:
            raise ApiError(400, str(exc), param=param) from None

    async def _fetch(self, url: str, n: int, param: str, who: str) -> bytes:
        async with self._fetches:
            try:
                return await fetch(url, self.policy)
            except TooLarge as exc:
                log.warning("%s, image %d: %s", who, n, exc)
                raise ApiError(
                    400,
                    f"image {n} ({short_name(url)}): is over the {self.policy.max_bytes} bytes "
                    f"an image may be (serve.max_image_bytes)",
                    param=param,
                ) from None
            except FetchFailed as exc:
                raise _not_fetched(n, param, who, exc) from None

    def _checked(self, url: str, fetched: bytes | None, n: int) -> str:
        """In a thread: the image's bytes (a data: URL's, or those fetched) checked against
        the caps, as a data: URL. FetchFailed for a fetched body that is no image."""
        settings = self.settings
        where = f"image {n} ({short_name(url)})"
        if fetched is None:
            raw = read_image(url, n)  # a data: URL, decoded and checked
        else:
            media_type = sniff_media_type(fetched)
            if media_type is None:
                raise FetchFailed(f"{url}: the body is not a {FORMAT_NAMES} image")
            raw = ImageBytes(fetched, media_type)
        if len(raw.data) > settings.max_image_bytes:
            raise ImageError(
                f"{where}: is over the {settings.max_image_bytes} bytes an image may be "
                f"(serve.max_image_bytes)"
            )
        _check_pixels(raw, where, settings.max_image_pixels, fetched is not None)
        return f"data:{raw.media_type};base64,{base64.b64encode(raw.data).decode('ascii')}"


class AfterImages:
    """A generation's run that takes its request's images first: awaited as the run is, or
    closed unstarted (a full queue), which closes the run with it."""

    def __init__(
        self, images: ClientImages, request: Request, run: Coroutine[Any, Any, Any], param: str
    ):
        self.images, self.request, self.run, self.param = images, request, run, param

    def __await__(self) -> Generator[Any, None, Any]:
        return self._run().__await__()

    def close(self) -> None:
        self.run.close()

    async def _run(self) -> Any:
        try:
            await self.images.take(self.request.messages, self.param, self.request.id)
        except BaseException:
            self.run.close()
            raise
        return await self.run


def _not_fetched(n: int, param: str, who: str, why: FetchFailed) -> ApiError:
    """What the client hears of a failed fetch: the same line whatever `why` is, which goes to
    the server's log."""
    log.warning("%s, image %d not fetched: %s", who, n, why)
    return ApiError(400, NOT_FETCHED.format(n=n), param=param, code="invalid_image_url")


def _check_pixels(raw: ImageBytes, where: str, max_pixels: int, fetched: bool) -> None:
    """The image's size from its header, held to `max_pixels`; nothing is decoded. A server
    without Pillow runs an engine that decodes no image (a remote one): nothing to check."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        return
    try:
        open_image(raw, where, max_pixels, "serve.max_image_pixels").close()
    except TooManyPixels:
        raise
    except ImageError as exc:
        if fetched:  # told as any fetch that brought no image
            raise FetchFailed(str(exc)) from None
        # The client's own bytes, damaged: the engine that decodes them says so (one that
        # sends them on, to a provider, leaves that to the provider).


def refuse_local_file(part: ContentPart, param: str) -> None:
    """A client names images by http(s) or data: URL: the server reads no file of its own
    machine that a request names."""
    url = part.image_url or ""
    if is_local_file(url):
        raise ApiError(400, local_file_refused(url), param=param)


def local_file_refused(url: str) -> str:
    return (
        f"image URL {short_name(url)!r}: the server reads no local files for a client; send "
        f"the image as a data: URL (base64) or an http(s) URL"
    )


async def _all(awaitables: Any) -> list[Any]:
    """The results of `awaitables`, run together; at the first failure the others are
    cancelled and the failure raised."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
