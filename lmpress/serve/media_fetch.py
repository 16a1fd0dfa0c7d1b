"""Fetching an image URL a client names, as a server that others reach must: the media policy.

A client's URL makes the server connect somewhere, so that somewhere is held to rules (vLLM's
`--allowed-media-domains` is the model; its CVE-2025-6242 the reason):

- http and https only, at every hop; a redirect may go from http to https but never back, nor
  to any other scheme (ftp, file, gopher...), and at most MAX_REDIRECTS of them;
- only hosts the operator names (`serve.allowed_media_domains`, exact names), or, when none are
  named, any host whose every address is public: never loopback, private, link-local, shared,
  multicast, reserved or unspecified, however the URL spells it (decimal `2130706433`, octal,
  `127.1`, IPv4-mapped IPv6) since the check is made on the addresses the name resolves to.
  A host the operator names, or `serve.allow_private_media`, may be on a private network;
- the address checked is the address connected to: the connection is made to it, with the
  name kept for the Host header and TLS, so a name that resolves again differently (DNS
  rebinding) changes nothing;
- one deadline for the whole fetch (resolving, connecting, every redirect and the whole body),
  so a server trickling a byte at a time is cut off at `serve.media_fetch_timeout_s`, and a
  body over `serve.max_image_bytes` is dropped as it passes the limit.

It is all asynchronous (httpcore, under httpx, with a network backend of our own that checks
each address), so a slow fetch holds no thread and never the event loop. Every failure is a
`FetchFailed` whose text is for the server's log; the client is told less (serve/media.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpcore

from lmpress.configs.schema import ServeParams

MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)
# NAT64's well-known prefix: such an address is the IPv4 address in its last 32 bits.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class FetchFailed(Exception):
    """A fetch that did not bring an image back; the text says why, for the server's log."""


class TooLarge(FetchFailed):
    """The body is over `serve.max_image_bytes`."""


@dataclass(frozen=True)
class MediaPolicy:
    """Where the server may fetch images from, and how much it fetches."""

    allowed_domains: frozenset[str] = frozenset()  # empty: any public address
    allow_private: bool = False
    timeout_s: float = 10.0
    max_bytes: int = 20 * 2**20
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def of(cls, settings: ServeParams) -> MediaPolicy:
        """The policy `lmpress serve`'s settings set."""
        return cls(
            allowed_domains=frozenset(host_name(d) for d in settings.allowed_media_domains),
            allow_private=settings.allow_private_media,
            timeout_s=settings.media_fetch_timeout_s,
            max_bytes=settings.max_image_bytes,
        )

    def trusts(self, host: str) -> bool:
        """Whether `host` may be at a non-public address: the operator named it, or allowed
        private addresses altogether."""
        return self.allow_private or host_name(host) in self.allowed_domains

    def check_url(self, url: str, previous: str | None = None) -> None:
        """Refuse a URL the policy does not allow, before connecting anywhere; `previous` is
        the URL that redirected here."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise FetchFailed(f"{url}: the scheme {parts.scheme!r} is not http or https")
        downgrade = previous is not None and urlsplit(previous).scheme == "https"
        if downgrade and parts.scheme != "https":
            raise FetchFailed(f"{previous} redirects from https to {url}")
        if not parts.hostname:
            raise FetchFailed(f"{url}: no host")
        if self.allowed_domains and host_name(parts.hostname) not in self.allowed_domains:
            raise FetchFailed(f"{url}: {parts.hostname} is not in serve.allowed_media_domains")

    def check_addresses(self, host: str, addresses: Iterable[Address]) -> None:
        """Refuse a host with any non-public address unless the policy trusts it."""
        if self.trusts(host):
            return
        for address in addresses:
            if not is_public(address):
                raise FetchFailed(f"{host} resolves to {address}, which is not a public address")


def host_name(host: str) -> str:
    """A host as names are compared: lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().strip("[]").rstrip(".").lower()


def is_public(address: Address) -> bool:
    """Whether an address is on the public internet: not loopback, private, link-local, shared
    (CGNAT), multicast, reserved or unspecified, nor an IPv6 address carrying one of those
    (IPv4-mapped, 6to4, Teredo, NAT64)."""
    if not address.is_global or address.is_multicast or address.is_reserved:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [address.ipv4_mapped, address.sixtofour]
        if address.teredo is not None:
            embedded.append(address.teredo[1])
        if address in NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return all(is_public(inner) for inner in embedded if inner is not None)
    return True


class CheckedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, resolving each host itself and refusing one with an
    address the policy does not allow; it then connects to a checked address (the name
    stays the origin's, so the Host header and TLS still name it)."""

    def __init__(self, policy: MediaPolicy):
        self.policy = policy
        self.backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await resolve(host, port)
        self.policy.check_addresses(host, addresses)
        error: Exception = FetchFailed(f"{host} has no address")
        for address in addresses:
            try:
                return await self.backend.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        raise error

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        raise FetchFailed("no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.backend.sleep(seconds)


async def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to, as getaddrinfo reads it (so `2130706433`, `0177.1`
    and `127.1` come out as the 127.0.0.1 they are)."""
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchFailed(f"cannot resolve {host}: {exc}") from None
    addresses: list[Address] = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def fetch(url: str, policy: MediaPolicy) -> bytes:
    """The body of `url`, fetched under `policy` within its one deadline; FetchFailed (with
    the reason, for the log) for anything else."""
    try:
        return await asyncio.wait_for(_follow(url, policy), policy.timeout_s)
    except asyncio.TimeoutError:
        raise FetchFailed(f"{url}: no whole answer within {policy.timeout_s:g}s") from None
    except httpcore.TimeoutException:
        raise FetchFailed(f"{url}: timed out") from None
    except httpcore.ProtocolError as exc:
        raise FetchFailed(f"{url}: broken answer: {exc}") from None
    except (httpcore.NetworkError, httpcore.UnsupportedProtocol, OSError, ValueError) as exc:
        raise FetchFailed(f"{url}: {type(exc).__name__}: {exc}") from None


async def _follow(url: str, policy: MediaPolicy) -> bytes:
    previous = None
    async with httpcore.AsyncConnectionPool(
        network_backend=CheckedBackend(policy), max_connections=1, retries=0
    ) as pool:
        for _ in range(policy.max_redirects + 1):
            policy.check_url(url, previous)
            status, location, body = await _get(pool, url, policy)
            if status not in REDIRECTS:
                if status != 200:
                    raise FetchFailed(f"{url}: HTTP {status}")
                return body
            if location is None:
                raise FetchFailed(f"{url}: HTTP {status} without a Location")
            previous, url = url, urljoin(url, location)
    raise FetchFailed(f"{url}: more than {policy.max_redirects} redirects")


async def _get(
    pool: httpcore.AsyncConnectionPool, url: str, policy: MediaPolicy
) -> tuple[int, str | None, bytes]:
    """One GET: the status, a redirect's Location, and the body (read only for a 200)."""
    timeout = {name: policy.timeout_s for name in ("connect", "read", "write", "pool")}
    headers = [(b"Accept", b"image/*"), (b"Accept-Encoding", b"identity"),
               (b"User-Agent", b"lmpress-serve")]  # fmt: skip
    async with pool.stream("GET", url, headers=headers, extensions={"timeout": timeout}) as reply:
        if reply.status != 200:
            location = _header(reply.headers, b"location")
            return reply.status, location, b""
        length = _header(reply.headers, b"content-length")
        if length is not None and length.isdigit() and int(length) > policy.max_bytes:
            raise TooLarge(f"{url}: Content-Length {length}")
        chunks, size = [], 0
        async for chunk in reply.aiter_stream():
            size += len(chunk)
            if size > policy.max_bytes:
                raise TooLarge(f"{url}: over {policy.max_bytes} bytes")
            chunks.append(chunk)
        return 200, None, b"".join(chunks)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None
