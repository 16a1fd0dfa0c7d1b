"""The media policy (lmpress/serve/media_fetch.py) against real HTTP servers on 127.0.0.1: a
canary that must never see a connection, however a URL spells its address or redirects to it;
and the limits of a fetch it does allow (redirects, scheme, size, one deadline)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time

import pytest

from lmpress.configs import load_config
from lmpress.serve.media_fetch import FetchFailed, MediaPolicy, TooLarge, fetch, is_public
from lmpress.vocabulary.errors import ConfigError
from tests.image_files import picture
from tests.servers.media import TRICKLE_FOR_S, MediaServer

# Ways to spell the loopback address in a URL's host.
LOOPBACK_HOSTS = [
    "127.0.0.1", "2130706433", "0177.0.0.1", "127.1", "0x7f000001", "[::ffff:127.0.0.1]",
    "localhost", "[::1]", "0.0.0.0",
]  # fmt: skip
TRUSTING_LOCALHOST = MediaPolicy(allowed_domains=frozenset({"localhost"}), timeout_s=5)


def get(url: str, policy: MediaPolicy) -> bytes:
    return asyncio.run(fetch(url, policy))


@pytest.fixture
def canary():
    with MediaServer() as server:
        yield server
    assert server.connections == 0, f"the canary was reached: {server.requests}"


@pytest.fixture
def web():
    """A server the tests' policy allows, by the name localhost."""
    with MediaServer("localhost") as server:
        yield server


@pytest.mark.parametrize("host", LOOPBACK_HOSTS)
def test_no_spelling_of_loopback_is_fetched_by_default(canary, host):
    with pytest.raises(FetchFailed, match="which is not a public address"):
        get(f"http://{host}:{canary.port}/picture.png", MediaPolicy())


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
        "0.0.0.0", "255.255.255.255", "224.0.0.1", "224.0.1.1", "240.0.0.1", "::1", "::",
        "fe80::1", "fc00::1", "ff02::1", "ff0e::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254",
        "2002:7f00:1::", "64:ff9b::a00:1", "2001:db8::1",
    ],
)  # fmt: skip
def test_non_public_addresses(address):
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700::1111"])
def test_public_addresses(address):
    assert is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "to",
    [
        "http://127.0.0.1:{port}/picture.png",
        "http://2130706433:{port}/picture.png",
        "http://[::ffff:127.0.0.1]:{port}/picture.png",
        "ftp://localhost:{port}/picture.png",  # the host is allowed; the scheme is not
        "gopher://localhost:{port}/",
        "file:///etc/passwd",
    ],
)
def test_a_redirect_from_an_allowed_host_reaches_nothing_else(canary, web, to):
    url = web.url("/redirect", to=to.format(port=canary.port))
    with pytest.raises(FetchFailed):
        get(url, TRUSTING_LOCALHOST)
    assert web.requests == [url.split(str(web.port), 1)[1]]  # the first hop only


def test_an_allowed_host_is_fetched_through_up_to_three_redirects(web):
    three = web.url("/redirect", to=web.url("/picture.png"), hops="2")
    assert get(three, TRUSTING_LOCALHOST) == picture(1)
    four = web.url("/redirect", to=web.url("/picture.png"), hops="3")
    with pytest.raises(FetchFailed, match="more than 3 redirects"):
        get(four, TRUSTING_LOCALHOST)


def test_private_addresses_are_fetched_only_when_allowed(web):
    url = web.url("/picture.png").replace("localhost", "127.0.0.1")
    with pytest.raises(FetchFailed, match="not in serve.allowed_media_domains"):
        get(url, TRUSTING_LOCALHOST)
    assert get(url, MediaPolicy(allow_private=True)) == picture(1)


def test_https_never_redirects_to_http():
    policy = MediaPolicy(allow_private=True)
    policy.check_url("https://example.com/a.png", previous="http://example.com/")
    with pytest.raises(FetchFailed, match="redirects from https to"):
        policy.check_url("http://example.com/a.png", previous="https://example.com/")


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_size_cap_is_dropped_as_it_passes_it(web, chunked):
    policy = MediaPolicy(allowed_domains=frozenset({"localhost"}), max_bytes=100_000)
    url = web.url("/large.png", chunked="1") if chunked else web.url("/large.png")
    with pytest.raises(TooLarge):
        get(url, policy)


def test_one_deadline_holds_a_trickling_server_to_it(web):
    policy = MediaPolicy(allowed_domains=frozenset({"localhost"}), timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(FetchFailed, match="no whole answer within 1s"):
        get(web.url("/trickle"), policy)  # a byte every 0.3 s: no single read times out
    # The trickle lasts TRICKLE_FOR_S (60 s): a fetch held only to per-read timeouts would run
    # all of it. Half of that bounds the deadline's failure without measuring the machine.
    assert time.monotonic() - started < TRICKLE_FOR_S / 2


def test_a_closed_port_fails_as_a_fetch(web):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(FetchFailed):
        get(f"http://localhost:{port}/picture.png", TRUSTING_LOCALHOST)


def test_allowed_media_domains_are_host_names_and_nothing_more():
    config = load_config(None, [("serve.allowed_media_domains", "[CDN.example.com., '[::1]']")])
    assert MediaPolicy.of(config.serve).allowed_domains == {"cdn.example.com", "::1"}
    for wrong in ("https://cdn.example.com", "cdn.example.com:8080", "cdn.example.com/img"):
        with pytest.raises(ConfigError, match="must be host names"):
            load_config(None, [("serve.allowed_media_domains", f"[{wrong!r}]")])
