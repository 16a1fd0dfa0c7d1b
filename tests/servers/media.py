"""An HTTP server on 127.0.0.1 for the media-fetch tests, that counts every connection it
accepts (as a canary, it must count none) and answers by path:

- /picture.png      a small PNG (tests.image_files.picture(1))
- /large.png        a PNG padded to `LARGE_BYTES` (/large.png?chunked=1: no Content-Length)
- /text             an HTML page, no image
- /missing          404
- /redirect?to=URL  302 to URL (/redirect?to=URL&hops=N: N redirects to itself first)
- /trickle          200 image/png, one byte every TRICKLE_S for a minute

    with MediaServer() as canary, MediaServer() as web:
        ... web.url("/redirect", to=canary.url("/picture.png")) ...
        assert canary.connections == 0
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.image_files import picture

LARGE_BYTES = 300_000
TRICKLE_S = 0.3
TRICKLE_FOR_S = 60


class _Counting(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: MediaServer):
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def verify_request(self, request, client_address) -> bool:  # every accepted connection
        with self.owner.lock:
            self.owner.connections += 1
        return True


class _Handler(BaseHTTPRequestHandler):
    server: _Counting

    def do_GET(self):
        owner = self.server.owner
        with owner.lock:
            owner.requests.append(self.path)
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        route = {
            "/picture.png": self._picture,
            "/large.png": self._large,
            "/text": self._text,
            "/redirect": self._redirect,
            "/trickle": self._trickle,
        }.get(parts.path)
        if route is None:
            self.send_error(404)
            return
        route(query)

    def _send(self, body: bytes, kind: str, length: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        if length:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for start in range(0, len(body), 8192):
                piece = body[start : start + 8192]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the fetcher hung up at its limit: what it should do
            pass

    def _picture(self, query: dict) -> None:
        self._send(picture(1), "image/png")

    def _large(self, query: dict) -> None:
        body = picture(1)
        self._send(body + b"\0" * (LARGE_BYTES - len(body)), "image/png", "chunked" not in query)

    def _text(self, query: dict) -> None:
        self._send(b"<html><body>no image here</body></html>", "text/html")

    def _redirect(self, query: dict) -> None:
        hops = int(query.get("hops", "0"))
        target = query["to"]
        if hops:
            target = self.server.owner.url("/redirect", to=target, hops=str(hops - 1))
        self.send_response(302)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _trickle(self, query: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        with self.server.owner.lock:
            self.server.owner.trickle_began = time.monotonic()
        body = picture(1)
        ends = time.monotonic() + TRICKLE_FOR_S
        for byte in body:
            if time.monotonic() > ends:
                return
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:  # the fetcher hung up: what it should do
                return
            time.sleep(TRICKLE_S)

    def log_message(self, *args):
        pass


class MediaServer:
    def __init__(self, host: str = "127.0.0.1"):
        self.host = host  # how URLs name it: 127.0.0.1 or localhost
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: list[str] = []
        self.trickle_began: float | None = None  # time.monotonic() the last /trickle answer began
        self._server = _Counting(self)
        self.port = self._server.server_port

    def url(self, path: str, **query: str) -> str:
        tail = f"?{urlencode(query)}" if query else ""
        return f"http://{self.host}:{self.port}{path}{tail}"

    def __enter__(self) -> MediaServer:
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
